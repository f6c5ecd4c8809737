//! Deleting a conversation: one transaction that locks its conversation and
//! admission rows, checks them, leaves its tombstones (migration 0004; its
//! run ids, 0006) and deletes the conversation (the foreign keys cascade to
//! every other row but `request_ids`, which stay as the tombstones of its
//! request ids).
//! Space: PostgreSQL's autovacuum reclaims the dead rows; nothing is
//! vacuumed here.

use sqlx::PgConnection;

use crate::codec::{db, now_ms, Row};
use turnstile_core::admin::TableCounts;
use turnstile_core::backend::{check_delete, missing_conversation};
use turnstile_core::ids::{ConversationId, Namespace, RequestId, Revision, RunId};
use turnstile_core::store::DeleteReport;
use turnstile_core::Error;

/// Deletes `id` inside the caller's transaction (see
/// `Store::delete_conversation`). `token` is the same across the call's
/// attempts: a tombstone of this token is this call's own delete, which
/// committed without its acknowledgement, and is answered as it was.
pub(crate) async fn delete_in(
    conn: &mut PgConnection,
    namespace: &Namespace,
    id: ConversationId,
    expected_version: u64,
    active_revision: Option<Revision>,
    token: uuid::Uuid,
) -> Result<DeleteReport, Error> {
    let found = sqlx::query!(
        "SELECT c.namespace, c.version, a.revision, a.active_request_id
         FROM conversations c JOIN admissions a ON a.conversation_id = c.conversation_id
         WHERE c.conversation_id = $1 FOR UPDATE",
        id.as_uuid()
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("lock conversation"))?;
    let Some(found) = found else {
        if let Some(report) = own_delete(conn, id, token).await? {
            return Ok(report);
        }
        return Err(missing(conn, Some(namespace), id).await);
    };
    if found.namespace != namespace.as_str() {
        return Err(Error::NamespaceMismatch {
            conversation_id: id,
            namespace: namespace.clone(),
        });
    }
    let key = Row {
        table: "conversations",
        key: &id,
    };
    let admission = Row {
        table: "admissions",
        key: &id,
    };
    check_delete(
        id,
        key.u64("version", found.version)?,
        Revision(admission.u64("revision", found.revision)?),
        found
            .active_request_id
            .map(|active| admission.checked_id::<RequestId>("active_request_id", active))
            .transpose()?,
        expected_version,
        active_revision,
    )?;
    let c = sqlx::query!(
        r#"SELECT
             (SELECT COUNT(*) FROM transcript t JOIN conversations c USING (conversation_id)
              WHERE t.conversation_id = $1 AND t.seq < c.transcript_length) AS "transcript!",
             (SELECT COUNT(*) FROM requests WHERE conversation_id = $1) AS "requests!",
             (SELECT COUNT(*) FROM all_runs WHERE conversation_id = $1) AS "runs!",
             (SELECT COUNT(*) FROM all_checkpoints WHERE conversation_id = $1)
                 AS "loop_checkpoints!",
             (SELECT COUNT(*) FROM verification_reports
              WHERE conversation_id = $1) AS "verification_reports!",
             (SELECT COUNT(*) FROM tool_calls WHERE conversation_id = $1) AS "tool_calls!",
             -- the held request's messages, after the committed entries
             (SELECT COUNT(*) FROM run_messages WHERE conversation_id = $1)
             + (SELECT COUNT(*) FROM transcript t JOIN conversations c USING (conversation_id)
                WHERE t.conversation_id = $1 AND t.seq >= c.transcript_length)
                 AS "run_messages!",
             (SELECT COUNT(*) FROM approvals WHERE conversation_id = $1) AS "approvals!",
             (SELECT COUNT(*) FROM summaries WHERE conversation_id = $1) AS "summaries!",
             (SELECT COUNT(*) FROM request_ids WHERE conversation_id = $1) AS "request_ids!",
             (SELECT COUNT(*) FROM events WHERE conversation_id = $1)
             + (SELECT COUNT(admitted_event) + COUNT(settled_event) FROM requests
                WHERE conversation_id = $1) AS "events!""#,
        id.as_uuid()
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(db("count conversation rows"))?;
    // In the order `report_of` reads them back.
    let counts = vec![
        1,
        1,
        c.transcript,
        c.requests,
        c.runs,
        c.loop_checkpoints,
        c.verification_reports,
        c.tool_calls,
        c.run_messages,
        c.approvals,
        c.summaries,
        c.request_ids,
        c.events,
    ];
    sqlx::query!(
        "INSERT INTO deleted_runs (conversation_id, run_id)
         SELECT conversation_id, run_id FROM all_runs WHERE conversation_id = $1",
        id.as_uuid()
    )
    .execute(&mut *conn)
    .await
    .map_err(db("keep run tombstones"))?;
    sqlx::query!(
        "INSERT INTO deleted_conversations (conversation_id, namespace, deleted_at, deleted_by,
             counts)
         VALUES ($1, $2, $3, $4, $5)",
        id.as_uuid(),
        namespace.as_str(),
        now_ms(),
        token,
        &counts
    )
    .execute(&mut *conn)
    .await
    .map_err(db("keep the conversation tombstone"))?;
    sqlx::query!(
        "DELETE FROM conversations WHERE conversation_id = $1",
        id.as_uuid()
    )
    .execute(&mut *conn)
    .await
    .map_err(db("delete conversation"))?;
    Ok(report_of(id, &counts))
}

/// The report of this call's own delete, if the tombstone is its.
async fn own_delete(
    conn: &mut PgConnection,
    id: ConversationId,
    token: uuid::Uuid,
) -> Result<Option<DeleteReport>, Error> {
    let counts = sqlx::query_scalar!(
        "SELECT counts FROM deleted_conversations WHERE conversation_id = $1 AND deleted_by = $2",
        id.as_uuid(),
        token
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("read conversation tombstone"))?;
    Ok(counts.map(|counts| report_of(id, &counts)))
}

fn report_of(id: ConversationId, counts: &[i64]) -> DeleteReport {
    let n = |i: usize| counts.get(i).map_or(0, |&v| u64::try_from(v).unwrap_or(0));
    DeleteReport {
        conversation_id: id,
        deleted: TableCounts {
            conversations: n(0),
            admissions: n(1),
            transcript: n(2),
            requests: n(3),
            runs: n(4),
            loop_checkpoints: n(5),
            verification_reports: n(6),
            tool_calls: n(7),
            run_messages: n(8),
            approvals: n(9),
            // a tombstone older than the event log counts none
            events: n(12),
        },
        summaries: n(10),
        tombstoned_requests: n(11),
        pages_freed: 0,
    }
}

/// Why a conversation has no row: [`Error::Deleted`] when its id is a
/// tombstone (of `namespace`, when one is given: another namespace's is a
/// [`Error::NamespaceMismatch`], as its row was), otherwise
/// [`Error::NotFound`].
pub(crate) async fn missing(
    conn: &mut PgConnection,
    namespace: Option<&Namespace>,
    id: ConversationId,
) -> Error {
    let tombstone = sqlx::query_scalar!(
        "SELECT namespace FROM deleted_conversations WHERE conversation_id = $1",
        id.as_uuid()
    )
    .fetch_optional(&mut *conn)
    .await;
    match tombstone {
        Err(e) => db("read conversation tombstone")(e),
        Ok(stored) => missing_conversation(namespace, id, stored),
    }
}

/// The deleted conversation a request id belonged to, if it is one.
pub(crate) async fn deleted_request(
    conn: &mut PgConnection,
    request_id: RequestId,
) -> Result<Option<ConversationId>, Error> {
    let found = sqlx::query_scalar!(
        "SELECT r.conversation_id FROM request_ids r
         JOIN deleted_conversations d ON d.conversation_id = r.conversation_id
         WHERE r.request_id = $1",
        request_id.as_uuid()
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("read request tombstone"))?;
    found
        .map(|uuid| {
            Row {
                table: "request_ids",
                key: &request_id,
            }
            .checked_id("conversation_id", uuid)
        })
        .transpose()
}

/// Whether a database error is the tombstone trigger's refusal.
pub(crate) fn is_deleted(error: &sqlx::Error) -> bool {
    error.as_database_error().is_some_and(|e| {
        e.code().as_deref() == Some("P0001") && e.message() == "turnstile: deleted"
    })
}

/// The conversation a deleted run id belonged to, if it is one.
pub(crate) async fn deleted_run(
    conn: &mut PgConnection,
    run_id: RunId,
) -> Result<Option<ConversationId>, Error> {
    let found = sqlx::query_scalar!(
        "SELECT conversation_id FROM deleted_runs WHERE run_id = $1",
        run_id.as_uuid()
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("read run tombstone"))?;
    found
        .map(|uuid| {
            Row {
                table: "deleted_runs",
                key: &run_id,
            }
            .checked_id("conversation_id", uuid)
        })
        .transpose()
}
