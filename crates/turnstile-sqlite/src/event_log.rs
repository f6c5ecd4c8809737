//! Reading a conversation's event log (written by the schema's triggers,
//! `migrations/0022_event_log.sql`, and by the steps; a request's admitted
//! and settling events are kept in its row, `0025`).

use super::codec::{db, to_i64};
use super::deletion::missing;
use super::read_connections::ReadConnections;
use turnstile_core::backend::EventRow;
use turnstile_core::ids::ConversationId;
use turnstile_core::store::LoggedEvent;
use turnstile_core::Error;

pub(super) async fn load_events_after(
    reader: &ReadConnections,
    conversation_id: ConversationId,
    after: u64,
    limit: u32,
) -> Result<Vec<LoggedEvent>, Error> {
    let mut conn = reader.acquire().await?;
    let uuid = conversation_id.as_uuid();
    let after = to_i64(after);
    let limit = i64::from(limit);
    // The log's own rows, and the `admitted` and settling events kept in
    // the requests' rows (migration 0025): those admitted after `after`,
    // and the settling event of the one request admitted last at or before
    // it, which may follow it. Each part reads its index in the order of
    // the log and stops at the limit.
    let rows = sqlx::query_as!(
        EventRow,
        r#"SELECT seq AS "seq!: i64", at AS "at!: i64", kind AS "kind!: i64",
               request_id AS "request_id!: Vec<u8>", run_id AS "run_id?: Vec<u8>",
               turn AS "turn?: i64", entry_seq AS "entry_seq?: i64",
               call_id AS "call_id?: String"
           FROM (SELECT seq, at, kind, request_id, run_id, turn, entry_seq, call_id FROM events
                 WHERE conversation_key = (SELECT key FROM conversations WHERE id = ?1)
                   AND seq > ?2
                 ORDER BY seq LIMIT ?3)
           UNION ALL
           SELECT * FROM (SELECT admitted_event, created_at, 0, request_id, admitted_run_id,
                              NULL, admitted_entry, NULL
                          FROM requests WHERE conversation_id = ?1 AND admitted_event > ?2
                          ORDER BY admitted_event LIMIT ?3)
           UNION ALL
           SELECT * FROM (SELECT settled_event, COALESCE(completed_at, 0), IIF(state = 1, 7, 8),
                              request_id, IIF(state = 1, committed_by, NULL), NULL, NULL, NULL
                          FROM requests
                          WHERE conversation_id = ?1 AND settled_event > ?2
                            AND admitted_event >= COALESCE(
                                    (SELECT MAX(admitted_event) FROM requests
                                     WHERE conversation_id = ?1 AND admitted_event <= ?2), 0)
                          ORDER BY admitted_event LIMIT ?3)
           ORDER BY 1 LIMIT ?3"#,
        uuid,
        after,
        limit
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db("load events"))?;
    // Nothing new: the conversation may be gone, which a follower must hear.
    if rows.is_empty() {
        let exists = sqlx::query_scalar!(
            r#"SELECT EXISTS (SELECT 1 FROM conversations WHERE id = ?1) AS "exists!: bool""#,
            uuid
        )
        .fetch_one(&mut *conn)
        .await
        .map_err(db("look up conversation"))?;
        if !exists {
            return Err(missing(&mut conn, None, conversation_id).await);
        }
    }
    rows.into_iter()
        .map(|row| row.decode(&conversation_id))
        .collect()
}
