//! Deleting a conversation: every row of it in one write transaction, its
//! id, request ids (migration 0008) and run ids (0010) left as tombstones,
//! then the space given back as `prune` gives it.

use sqlx::{Connection, SqliteConnection};

use crate::codec::{db, now_ms, Row};
use crate::SqliteStore;
use turnstile_core::admin::TableCounts;
use turnstile_core::backend::{check_delete, missing_conversation};
use turnstile_core::ids::{ConversationId, Namespace, RequestId, Revision, RunId};
use turnstile_core::store::DeleteReport;
use turnstile_core::Error;

/// Deletes `id` (see `Store::delete_conversation`): the checks and the
/// deletes inside one `BEGIN IMMEDIATE` transaction on the writer, so no
/// claim or commit comes between them.
pub(crate) async fn delete_conversation(
    store: &SqliteStore,
    namespace: &Namespace,
    id: ConversationId,
    expected_version: u64,
    active_revision: Option<Revision>,
) -> Result<DeleteReport, Error> {
    let (deleted, summaries, tombstoned_requests) = {
        let mut conn = store.writer.take().await?;
        let mut tx = conn
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(db("begin write transaction"))?;
        let counted = delete_in(&mut tx, namespace, id, expected_version, active_revision).await?;
        tx.commit().await.map_err(db("commit the delete"))?;
        counted
    };
    let (pages_freed, _, _) = crate::ops::reclaim(store).await?;
    tracing::info!(conversation = %id, rows = deleted.total(), pages_freed, "deleted");
    Ok(DeleteReport {
        conversation_id: id,
        deleted,
        summaries,
        tombstoned_requests,
        pages_freed,
    })
}

async fn delete_in(
    tx: &mut SqliteConnection,
    namespace: &Namespace,
    id: ConversationId,
    expected_version: u64,
    active_revision: Option<Revision>,
) -> Result<(TableCounts, u64, u64), Error> {
    let uuid = id.as_uuid();
    let found = sqlx::query!(
        r#"SELECT c.namespace, c.version, a.revision AS "revision?: i64",
                  a.active_request_id AS "active_request_id?: Vec<u8>"
           FROM conversations c LEFT JOIN admissions a ON a.conversation_id = c.id
           WHERE c.id = ?1"#,
        uuid
    )
    .fetch_optional(&mut *tx)
    .await
    .map_err(db("load conversation"))?;
    let Some(found) = found else {
        return Err(missing(tx, Some(namespace), id).await);
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
        Revision(admission.u64("revision", found.revision.unwrap_or(0))?),
        found
            .active_request_id
            .map(|active| admission.id::<RequestId>("active_request_id", &active))
            .transpose()?,
        expected_version,
        active_revision,
    )?;
    let counts = sqlx::query!(
        r#"WITH reqs(id) AS (SELECT request_id FROM requests WHERE conversation_id = ?1),
                -- a folded run (`claim.sql`) has its request's id
                rns(id) AS (SELECT run_id FROM runs WHERE request_id IN (SELECT id FROM reqs)
                            UNION ALL
                            SELECT request_id FROM requests
                            WHERE conversation_id = ?1 AND run_status IS NOT NULL)
           SELECT
             (SELECT COUNT(*) FROM transcript
              WHERE conversation_key = (SELECT key FROM conversations WHERE id = ?1)
                AND seq < (SELECT transcript_length FROM conversations WHERE id = ?1))
                 AS "transcript!: i64",
             (SELECT COUNT(*) FROM reqs) AS "requests!: i64",
             (SELECT COUNT(*) FROM rns) AS "runs!: i64",
             (SELECT COUNT(*) FROM all_checkpoints
              WHERE run_id IN (SELECT id FROM rns)) AS "loop_checkpoints!: i64",
             (SELECT COUNT(*) FROM verification_reports
              WHERE request_id IN (SELECT id FROM reqs)) AS "verification_reports!: i64",
             (SELECT COUNT(*) FROM tool_calls
              WHERE request_id IN (SELECT id FROM reqs)) AS "tool_calls!: i64",
             -- the held request's messages, after the committed entries
             (SELECT COUNT(*) FROM run_messages WHERE request_id IN (SELECT id FROM reqs))
             + (SELECT COUNT(*) FROM transcript
                WHERE conversation_key = (SELECT key FROM conversations WHERE id = ?1)
                  AND seq >= (SELECT transcript_length FROM conversations WHERE id = ?1))
                 AS "run_messages!: i64",
             (SELECT COUNT(*) FROM approvals
              WHERE request_id IN (SELECT id FROM reqs)) AS "approvals!: i64",
             (SELECT COUNT(*) FROM events
              WHERE conversation_key = (SELECT key FROM conversations WHERE id = ?1))
             + (SELECT COUNT(admitted_event) + COUNT(settled_event) FROM requests
                WHERE conversation_id = ?1)
                 AS "events!: i64",
             (SELECT COUNT(*) FROM summaries WHERE conversation_id = ?1) AS "summaries!: i64""#,
        uuid
    )
    .fetch_one(&mut *tx)
    .await
    .map_err(db("count conversation rows"))?;
    let tombstoned = sqlx::query!(
        "INSERT INTO deleted_requests (request_id, conversation_id)
         SELECT request_id, conversation_id FROM requests WHERE conversation_id = ?1",
        uuid
    )
    .execute(&mut *tx)
    .await
    .map_err(db("keep request tombstones"))?
    .rows_affected();
    sqlx::query!(
        "INSERT INTO deleted_runs (run_id, conversation_id)
         SELECT run_id, ?1 FROM runs
         WHERE request_id IN (SELECT request_id FROM requests WHERE conversation_id = ?1)
         UNION ALL
         SELECT request_id, ?1 FROM requests WHERE conversation_id = ?1 AND run_status IS NOT NULL",
        uuid
    )
    .execute(&mut *tx)
    .await
    .map_err(db("keep run tombstones"))?;
    let ns = namespace.as_str();
    let now = now_ms();
    sqlx::query!(
        "INSERT INTO deleted_conversations (id, namespace, deleted_at) VALUES (?1, ?2, ?3)",
        uuid,
        ns,
        now
    )
    .execute(&mut *tx)
    .await
    .map_err(db("keep the conversation tombstone"))?;
    // The foreign keys cascade to every other row of the conversation.
    let conversations = sqlx::query!("DELETE FROM conversations WHERE id = ?1", uuid)
        .execute(&mut *tx)
        .await
        .map_err(db("delete conversation"))?
        .rows_affected();
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    let deleted = TableCounts {
        conversations,
        admissions: u64::from(found.revision.is_some()),
        transcript: n(counts.transcript),
        requests: n(counts.requests),
        runs: n(counts.runs),
        loop_checkpoints: n(counts.loop_checkpoints),
        verification_reports: n(counts.verification_reports),
        tool_calls: n(counts.tool_calls),
        run_messages: n(counts.run_messages),
        approvals: n(counts.approvals),
        events: n(counts.events),
    };
    Ok((deleted, n(counts.summaries), tombstoned))
}

/// Why a conversation has no row: [`Error::Deleted`] when its id is a
/// tombstone (of `namespace`, when one is given: another namespace's
/// tombstone is a [`Error::NamespaceMismatch`], as its row was), otherwise
/// [`Error::NotFound`].
pub(crate) async fn missing(
    conn: &mut SqliteConnection,
    namespace: Option<&Namespace>,
    id: ConversationId,
) -> Error {
    let uuid = id.as_uuid();
    let tombstone = sqlx::query_scalar!(
        "SELECT namespace FROM deleted_conversations WHERE id = ?1",
        uuid
    )
    .fetch_optional(&mut *conn)
    .await;
    match tombstone {
        Err(e) => db("read conversation tombstone")(e),
        Ok(stored) => missing_conversation(namespace, id, stored),
    }
}

/// The conversation a deleted request id belonged to, if it is one.
pub(crate) async fn deleted_request(
    conn: &mut SqliteConnection,
    request_id: RequestId,
) -> Result<Option<ConversationId>, Error> {
    let uuid = request_id.as_uuid();
    let row = sqlx::query_scalar!(
        "SELECT conversation_id FROM deleted_requests WHERE request_id = ?1",
        uuid
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("read request tombstone"))?;
    row.map(|bytes| {
        Row {
            table: "deleted_requests",
            key: &request_id,
        }
        .id("conversation_id", &bytes)
    })
    .transpose()
}

/// The conversation a deleted run id belonged to, if it is one.
pub(crate) async fn deleted_run(
    conn: &mut SqliteConnection,
    run_id: RunId,
) -> Result<Option<ConversationId>, Error> {
    let uuid = run_id.as_uuid();
    let row = sqlx::query_scalar!(
        "SELECT conversation_id FROM deleted_runs WHERE run_id = ?1",
        uuid
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("read run tombstone"))?;
    row.map(|bytes| {
        Row {
            table: "deleted_runs",
            key: &run_id,
        }
        .id("conversation_id", &bytes)
    })
    .transpose()
}
