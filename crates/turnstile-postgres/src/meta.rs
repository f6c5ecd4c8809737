//! Conversation metadata: the read, and the compare-and-swap that changes
//! it, one short transaction that locks the conversation row (`FOR
//! UPDATE`) between reading the current metadata and writing the next.
//! Each change records the token of its call, so a retry whose first
//! attempt committed unacknowledged answers with that change, not with a
//! conflict against itself.

use sqlx::PgConnection;
use uuid::Uuid;

use super::admission::load_conversation;
use super::codec::{db, now_ms, to_i64, Row};
use super::steps::conversation_open::ensure_conversation;
use turnstile_core::backend::{decode_metadata, metadata_json};
use turnstile_core::ids::{ConversationId, Namespace};
use turnstile_core::store::{ConversationMeta, MetaUpdate};
use turnstile_core::Error;

/// The metadata of a conversation of `namespace`.
pub(crate) async fn load_meta(
    conn: &mut PgConnection,
    namespace: &Namespace,
    id: ConversationId,
) -> Result<ConversationMeta, Error> {
    load_conversation(&mut *conn, namespace, id).await?;
    Ok(meta_of(conn, id, false).await?.0)
}

/// The metadata columns of a conversation known to exist, and the token
/// of its last change; `lock` takes the row for the rest of the
/// transaction.
pub(crate) async fn meta_of(
    conn: &mut PgConnection,
    id: ConversationId,
    lock: bool,
) -> Result<(ConversationMeta, Option<Uuid>), Error> {
    // `FOR UPDATE` is refused in a read-only snapshot: listings read the
    // same columns without it. The two statements differ in that clause
    // alone (a checked query's text is a literal).
    let fetched = match lock {
        true => {
            sqlx::query_as!(
                MetaRow,
                r#"SELECT title, owner, metadata::text AS "metadata!", meta_version,
                      COALESCE(meta_updated_at, created_at) AS "updated_at!", meta_updated_by
               FROM conversations WHERE conversation_id = $1 FOR UPDATE"#,
                id.as_uuid()
            )
            .fetch_one(&mut *conn)
            .await
        }
        false => {
            sqlx::query_as!(
                MetaRow,
                r#"SELECT title, owner, metadata::text AS "metadata!", meta_version,
                      COALESCE(meta_updated_at, created_at) AS "updated_at!", meta_updated_by
               FROM conversations WHERE conversation_id = $1"#,
                id.as_uuid()
            )
            .fetch_one(&mut *conn)
            .await
        }
    };
    let row = fetched.map_err(db("load conversation metadata"))?;
    let key = Row {
        table: "conversations",
        key: &id,
    };
    let meta = ConversationMeta {
        title: row.title,
        owner: row.owner,
        metadata: decode_metadata(&key, &row.metadata)?,
        meta_version: key.u64("meta_version", row.meta_version)?,
        updated_at: row.updated_at,
    };
    Ok((meta, row.meta_updated_by))
}

/// The metadata columns of a `conversations` row.
struct MetaRow {
    title: Option<String>,
    owner: Option<String>,
    metadata: String,
    meta_version: i64,
    updated_at: i64,
    meta_updated_by: Option<Uuid>,
}

/// The compare-and-swap, inside one transaction: the conversation
/// (created first when `expected` is 0), its metadata locked, the update
/// applied and checked, then written with the call's `token`.
pub(crate) async fn set_meta(
    conn: &mut PgConnection,
    namespace: &Namespace,
    id: ConversationId,
    expected: u64,
    update: &MetaUpdate,
    token: Uuid,
    retry: bool,
) -> Result<ConversationMeta, Error> {
    if expected == 0 {
        ensure_conversation(&mut *conn, namespace, id).await?;
    } else {
        load_conversation(&mut *conn, namespace, id).await?;
    }
    let (current, by) = meta_of(&mut *conn, id, true).await?;
    if retry && by == Some(token) && current.meta_version == expected + 1 {
        return Ok(current);
    }
    let next = update.apply(&current)?;
    if current.meta_version != expected {
        return Err(Error::MetaVersionConflict {
            conversation_id: id,
            expected,
            actual: current.meta_version,
        });
    }
    let metadata = metadata_json(&next.metadata);
    let row = sqlx::query!(
        r#"UPDATE conversations
           SET title = $1, owner = $2, metadata = $3::text::jsonb,
               meta_version = meta_version + 1, meta_updated_at = $4, meta_updated_by = $5
           WHERE conversation_id = $6 AND meta_version = $7
           RETURNING meta_version, meta_updated_at AS "updated_at!""#,
        next.title,
        next.owner,
        metadata,
        now_ms(),
        token,
        id.as_uuid(),
        to_i64(expected)
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(db("set conversation metadata"))?;
    let key = Row {
        table: "conversations",
        key: &id,
    };
    Ok(ConversationMeta {
        meta_version: key.u64("meta_version", row.meta_version)?,
        updated_at: row.updated_at,
        ..next
    })
}
