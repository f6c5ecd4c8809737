//! Reading a conversation's event log (written by the schema's triggers:
//! `migrations/0022_event_log.sql`).

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
    let rows = sqlx::query_as!(
        EventRow,
        r#"SELECT seq, at, kind, request_id, run_id, turn, entry_seq, call_id FROM events
           WHERE conversation_key = (SELECT key FROM conversations WHERE id = ?1) AND seq > ?2
           ORDER BY seq LIMIT ?3"#,
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
