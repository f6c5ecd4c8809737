//! One page of conversation keys: a walk of `(created_at, id)` newest first
//! from the cursor, with every conversation filter applied on the way.

use serde_json::Value;
use sqlx::SqliteConnection;

use super::list::id_of;
use crate::codec::db;
use turnstile_core::admin::ListFilter;
use turnstile_core::ids::ConversationId;
use turnstile_core::store::ConversationCursor;
use turnstile_core::Error;

/// At most `filter.limit` keys, and the cursor after the last when more
/// match (one row more is read to know).
pub(super) async fn conversation_page(
    conn: &mut SqliteConnection,
    filter: &ListFilter,
) -> Result<(Vec<Vec<u8>>, Option<ConversationCursor>), Error> {
    let namespace = filter.namespace.as_ref().map(|ns| ns.as_str());
    // A JSON path to the key (keys are checked: no quote can end it), the
    // JSON type the value must have, and its text as `json_extract` gives it.
    let (path, kind, atom) = match &filter.meta {
        Some((key, value)) => {
            let (kind, atom) = match value {
                Value::Null => ("null", None),
                Value::Bool(true) => ("true", None),
                Value::Bool(false) => ("false", None),
                Value::String(s) => ("text", Some(s.clone())),
                other => ("integer", Some(other.to_string())),
            };
            (Some(format!("$.\"{key}\"")), Some(kind), atom)
        }
        None => (None, None, None),
    };
    let (after_at, after_id) = match filter.after {
        Some(cursor) => (Some(cursor.created_at()), Some(cursor.id().as_uuid())),
        None => (None, None),
    };
    let limit = i64::from(filter.limit) + 1;
    let rows = sqlx::query!(
        r#"SELECT c.id AS "id!: Vec<u8>", c.created_at
           FROM conversations c JOIN admissions a ON a.conversation_id = c.id
           WHERE (?1 IS NULL OR c.namespace = ?1)
             AND (?2 IS NULL OR c.owner = ?2)
             AND (?3 IS NULL OR (json_type(c.metadata, ?3) = ?4
                                 AND (?5 IS NULL OR CAST(json_extract(c.metadata, ?3) AS TEXT) = ?5)))
             AND (?6 IS NULL OR c.created_at >= ?6)
             AND (?7 IS NULL OR c.created_at < ?7)
             AND (?8 IS NULL OR MAX(a.updated_at, COALESCE(c.meta_updated_at, 0)) >= ?8)
             AND (?9 IS NULL OR MAX(a.updated_at, COALESCE(c.meta_updated_at, 0)) < ?9)
             AND (?10 IS NULL OR (c.created_at, c.id) < (?10, ?11))
           ORDER BY c.created_at DESC, c.id DESC LIMIT ?12"#,
        namespace,
        filter.owner,
        path,
        kind,
        atom,
        filter.created_after,
        filter.created_before,
        filter.updated_after,
        filter.updated_before,
        after_at,
        after_id,
        limit
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db("list conversations"))?;
    let mut keys: Vec<(Vec<u8>, i64)> = rows.into_iter().map(|r| (r.id, r.created_at)).collect();
    let more = keys.len() > filter.limit as usize;
    keys.truncate(filter.limit as usize);
    let next = match keys.last() {
        Some((id, created_at)) if more => {
            let id: ConversationId = id_of("conversations", "id", id)?;
            Some(ConversationCursor::new(*created_at, id))
        }
        _ => None,
    };
    Ok((keys.into_iter().map(|(id, _)| id).collect(), next))
}
