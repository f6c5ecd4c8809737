//! Opt-in leases: the owner's renewal (one fenced UPDATE that moves neither
//! the revision nor the activity time) and the listing of expired ones.
//! Migration 0009's trigger drops a lease with every revision bump.

use super::read_connections::ReadConnections;
use sqlx::SqliteConnection;

use super::codec::{db, to_i64, Row};
use super::steps::fenced;
use turnstile_core::ids::{ConversationId, RequestId, Revision, RunId};
use turnstile_core::store::{ExpiredLease, Fence};
use turnstile_core::Error;

/// A renewal, inside the group transaction.
pub(super) async fn renew_lease_in(
    conn: &mut SqliteConnection,
    fence: &Fence,
    expires_at: i64,
) -> Result<(), Error> {
    let conversation = fence.conversation_id.as_uuid();
    let (request, run) = (fence.request_id.as_uuid(), fence.run_id.as_uuid());
    let revision = to_i64(fence.revision.0);
    let renewed = sqlx::query!(
        "UPDATE admissions SET lease_expires_at = ?1
         WHERE conversation_id = ?2 AND revision = ?3 AND active_request_id = ?4
           AND run_id = ?5",
        expires_at,
        conversation,
        revision,
        request,
        run
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
/// clock lease times are written with), soonest expired first. Served by
/// the leased-admissions index.
pub(super) async fn load_expired_leases(
    reader: &ReadConnections,
    limit: u32,
) -> Result<Vec<ExpiredLease>, Error> {
    let now = turnstile_core::backend::now_ms();
    let mut conn = reader.acquire().await?;
    let limit = i64::from(limit);
    let rows = sqlx::query!(
        r#"SELECT a.conversation_id, c.namespace, a.active_request_id AS "request_id!",
                  a.run_id AS "run_id!", a.revision, a.lease_expires_at AS "lease_expires_at!"
           FROM admissions a
           JOIN conversations c ON c.id = a.conversation_id
           WHERE a.lease_expires_at IS NOT NULL AND a.active_request_id IS NOT NULL
             AND a.lease_expires_at < ?1
             AND (SELECT status FROM all_runs WHERE run_id = a.run_id) = 'running'
           ORDER BY a.lease_expires_at LIMIT ?2"#,
        now,
        limit
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db("list expired leases"))?;
    rows.into_iter()
        .map(|row| {
            let key = Row {
                table: "admissions",
                key: &"expired lease",
            };
            let conversation_id =
                key.id::<ConversationId>("conversation_id", &row.conversation_id)?;
            let key = Row {
                table: "admissions",
                key: &conversation_id,
            };
            Ok(ExpiredLease {
                conversation_id,
                namespace: key.namespace(&row.namespace)?,
                request_id: key.id::<RequestId>("active_request_id", &row.request_id)?,
                run_id: key.id::<RunId>("run_id", &row.run_id)?,
                revision: Revision(key.u64("revision", row.revision)?),
                lease_expires_at: row.lease_expires_at,
            })
        })
        .collect()
}
