//! Opt-in leases: the owner's renewal (one fenced UPDATE that moves neither
//! the revision nor the activity time) and the listing of expired ones.
//! Migration 0005's trigger drops a lease with every revision bump.

use sqlx::PgConnection;

use super::codec::{db, to_i64, Row};
use super::steps::fenced;
use turnstile_core::ids::{ConversationId, RequestId, Revision, RunId};
use turnstile_core::store::{ExpiredLease, Fence};
use turnstile_core::Error;

/// A renewal: one statement. Retried after a lost acknowledgement it sets
/// the same value again under the same fence, so it answers as its first
/// attempt would.
pub(crate) async fn renew_lease_in(
    conn: &mut PgConnection,
    fence: &Fence,
    expires_at: i64,
) -> Result<(), Error> {
    let renewed = sqlx::query!(
        "UPDATE admissions SET lease_expires_at = $1
         WHERE conversation_id = $2 AND revision = $3 AND active_request_id = $4
           AND run_id = $5",
        expires_at,
        fence.conversation_id.as_uuid(),
        to_i64(fence.revision.0),
        fence.request_id.as_uuid(),
        fence.run_id.as_uuid()
    )
    .execute(&mut *conn)
    .await
    .map_err(db("renew lease"))?;
    match renewed.rows_affected() {
        1 => Ok(()),
        _ => Err(fenced(fence)),
    }
}

/// Held admissions of `running` owners whose lease expired before now (the
/// clock lease times are written with, not the server's), soonest expired
/// first. `FOR UPDATE SKIP LOCKED`: an admission whose row
/// a takeover (or its owner's write) holds locked right now is left out
/// rather than waited for, so recoverers that list at once spread over the
/// others. The locks last for this statement only; the takeover's own
/// compare-and-swap decides who wins.
pub(crate) async fn load_expired_leases(
    conn: &mut PgConnection,
    limit: u32,
) -> Result<Vec<ExpiredLease>, Error> {
    let now = super::codec::now_ms();
    let rows = sqlx::query!(
        r#"SELECT a.conversation_id, c.namespace, a.active_request_id AS "request_id!",
                  a.run_id AS "run_id!", a.revision, a.lease_expires_at AS "lease_expires_at!"
           FROM admissions a
           JOIN conversations c ON c.conversation_id = a.conversation_id
           WHERE a.lease_expires_at IS NOT NULL AND a.active_request_id IS NOT NULL
             AND a.lease_expires_at < $1
             -- The holding run's status by its key: a scalar subquery, which
             -- the planner keeps per row (a join to the view would scan its
             -- every place).
             AND (SELECT r.status FROM all_runs r
                  WHERE r.conversation_id = a.conversation_id AND r.run_id = a.run_id)
                 = 'running'
           ORDER BY a.lease_expires_at LIMIT $2
           FOR UPDATE OF a SKIP LOCKED"#,
        now,
        i64::from(limit)
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db("list expired leases"))?;
    rows.into_iter()
        .map(|row| {
            let key = Row {
                table: "admissions",
                key: &row.conversation_id,
            };
            Ok(ExpiredLease {
                conversation_id: key
                    .checked_id::<ConversationId>("conversation_id", row.conversation_id)?,
                namespace: key.namespace(&row.namespace)?,
                request_id: key.checked_id::<RequestId>("active_request_id", row.request_id)?,
                run_id: key.checked_id::<RunId>("run_id", row.run_id)?,
                revision: Revision(key.u64("revision", row.revision)?),
                lease_expires_at: row.lease_expires_at,
            })
        })
        .collect()
}
