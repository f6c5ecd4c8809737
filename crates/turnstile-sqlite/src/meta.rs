//! Conversation metadata: the read, and the compare-and-swap that changes
//! it (a savepoint step of the group writer: the read of the current
//! metadata and its update are one write transaction, so nothing moves in
//! between).

use sqlx::SqliteConnection;

use super::admission::load_conversation;
use super::codec::{db, now_ms, to_i64, Row};
use super::steps::conversation_open::ensure_conversation_in;
use turnstile_core::backend::{decode_metadata, metadata_json};
use turnstile_core::ids::{ConversationId, Namespace};
use turnstile_core::store::{ConversationMeta, MetaUpdate};
use turnstile_core::Error;

/// The metadata of a conversation of `namespace`.
pub(super) async fn load_meta(
    conn: &mut SqliteConnection,
    namespace: &Namespace,
    id: ConversationId,
) -> Result<ConversationMeta, Error> {
    load_conversation(&mut *conn, namespace, id).await?;
    meta_of(conn, id).await
}

/// The metadata columns of a conversation known to exist.
pub(super) async fn meta_of(
    conn: &mut SqliteConnection,
    id: ConversationId,
) -> Result<ConversationMeta, Error> {
    let uuid = id.as_uuid();
    let row = sqlx::query!(
        r#"SELECT title, owner, metadata, meta_version,
                  COALESCE(meta_updated_at, created_at) AS "updated_at!: i64"
           FROM conversations WHERE id = ?1"#,
        uuid
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(db("load conversation metadata"))?;
    let key = Row {
        table: "conversations",
        key: &id,
    };
    Ok(ConversationMeta {
        title: row.title,
        owner: row.owner,
        metadata: decode_metadata(&key, &row.metadata)?,
        meta_version: key.u64("meta_version", row.meta_version)?,
        updated_at: row.updated_at,
    })
}

/// The compare-and-swap, inside the group transaction: the conversation
/// (created first when `expected` is 0), its current metadata, the update
/// applied and checked, then written where the version still matches.
pub(super) async fn set_meta_in(
    conn: &mut SqliteConnection,
    namespace: &Namespace,
    id: ConversationId,
    expected: u64,
    update: &MetaUpdate,
) -> Result<ConversationMeta, Error> {
    if expected == 0 {
        ensure_conversation_in(&mut *conn, namespace, id).await?;
    }
    let current = load_meta(&mut *conn, namespace, id).await?;
    let next = update.apply(&current)?;
    if current.meta_version != expected {
        return Err(Error::MetaVersionConflict {
            conversation_id: id,
            expected,
            actual: current.meta_version,
        });
    }
    let uuid = id.as_uuid();
    let metadata = metadata_json(&next.metadata);
    let (version, now) = (to_i64(expected), now_ms());
    let written = sqlx::query!(
        "UPDATE conversations
         SET title = ?1, owner = ?2, metadata = ?3, meta_version = meta_version + 1,
             meta_updated_at = ?4
         WHERE id = ?5 AND meta_version = ?6",
        next.title,
        next.owner,
        metadata,
        now,
        uuid,
        version
    )
    .execute(&mut *conn)
    .await
    .map_err(db("set conversation metadata"))?;
    if written.rows_affected() != 1 {
        return Err(Error::Store(turnstile_core::StoreError::new(
            "set conversation metadata: the row changed inside its transaction".to_owned(),
            None,
        )));
    }
    meta_of(conn, id).await
}
