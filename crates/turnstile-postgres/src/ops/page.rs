//! One page of conversation keys: a walk of `(created_at, conversation_id)`
//! newest first from the cursor, with every conversation filter applied on
//! the way.

use sqlx::PgConnection;
use uuid::Uuid;

use crate::codec::{db, Row};
use turnstile_core::admin::ListFilter;
use turnstile_core::ids::{ConversationId, Namespace};
use turnstile_core::store::ConversationCursor;
use turnstile_core::Error;

/// At most `filter.limit` keys, and the cursor after the last when more
/// match (one row more is read to know).
pub(super) async fn conversation_page(
    conn: &mut PgConnection,
    filter: &ListFilter,
) -> Result<(Vec<Uuid>, Option<ConversationCursor>), Error> {
    let (key, value) = match &filter.meta {
        Some((key, value)) => (Some(key.as_str()), Some(value.to_string())),
        None => (None, None),
    };
    let (after_at, after_id) = match filter.after {
        Some(cursor) => (Some(cursor.created_at()), Some(cursor.id().as_uuid())),
        None => (None, None),
    };
    let rows = sqlx::query!(
        r#"SELECT c.conversation_id, c.created_at
           FROM conversations c JOIN admissions a ON a.conversation_id = c.conversation_id
           WHERE ($1::text IS NULL OR c.namespace = $1)
             AND ($2::uuid IS NULL OR c.conversation_id = $2)
             AND ($3::text IS NULL OR c.owner = $3)
             AND ($4::text IS NULL OR c.metadata -> $4 = $5::text::jsonb)
             AND ($6::bigint IS NULL OR c.created_at >= $6)
             AND ($7::bigint IS NULL OR c.created_at < $7)
             AND ($8::bigint IS NULL OR GREATEST(a.updated_at, c.meta_updated_at) >= $8)
             AND ($9::bigint IS NULL OR GREATEST(a.updated_at, c.meta_updated_at) < $9)
             AND ($10::bigint IS NULL OR (c.created_at, c.conversation_id) < ($10, $11::uuid))
           ORDER BY c.created_at DESC, c.conversation_id DESC LIMIT $12"#,
        filter.namespace.as_ref().map(Namespace::as_str),
        filter.conversation_id.map(|id| id.as_uuid()),
        filter.owner,
        key,
        value,
        filter.created_after,
        filter.created_before,
        filter.updated_after,
        filter.updated_before,
        after_at,
        after_id,
        i64::from(filter.limit) + 1
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db("list conversations"))?;
    let mut keys: Vec<(Uuid, i64)> = rows
        .into_iter()
        .map(|r| (r.conversation_id, r.created_at))
        .collect();
    let more = keys.len() > filter.limit as usize;
    keys.truncate(filter.limit as usize);
    let next = match keys.last() {
        Some(&(uuid, created_at)) if more => {
            let row = Row {
                table: "conversations",
                key: &uuid,
            };
            let id: ConversationId = row.checked_id("conversation_id", uuid)?;
            Some(ConversationCursor::new(created_at, id))
        }
        _ => None,
    };
    Ok((keys.into_iter().map(|(id, _)| id).collect(), next))
}
