//! The opening of a conversation (`conversation_open.sql`): one `INSERT`
//! into the `conversation_opens` view, always alone, whose trigger creates
//! the conversation and its idle admission unless they exist, and returns
//! the conversation as stored.
//!
//! Refusals: the id of a deleted conversation (`deleted`) is
//! [`Error::Deleted`]; a conversation of another namespace is
//! [`Error::NamespaceMismatch`].

use sqlx::SqliteConnection;

use super::{raised, Raised};
use crate::admission::conversation_of;
use crate::codec::{db, now_ms, only_row};
use turnstile_core::ids::{ConversationId, Namespace};
use turnstile_core::store::Conversation;
use turnstile_core::Error;

/// A conversation and its idle admission, created unless they exist,
/// inside the group transaction: one statement, which returns the
/// conversation as stored.
pub(crate) async fn ensure_conversation_in(
    tx: &mut SqliteConnection,
    namespace: &Namespace,
    id: ConversationId,
) -> Result<Conversation, Error> {
    let uuid = id.as_uuid();
    let ns = namespace.as_str();
    let now = now_ms();
    let row = sqlx::query!(
        r#"INSERT INTO conversation_opens (id, namespace, now) VALUES (?1, ?2, ?3)
           RETURNING (SELECT namespace FROM conversations WHERE id = ?1) AS "namespace!: String",
               (SELECT version FROM conversations WHERE id = ?1) AS "version!: i64",
               (SELECT created_at FROM conversations WHERE id = ?1) AS "created_at!: i64""#,
        uuid,
        ns,
        now
    )
    .fetch_all(&mut *tx)
    .await
    .and_then(only_row)
    .map_err(|e| match raised(&e) {
        Some(Raised::Deleted) => Error::Deleted {
            conversation_id: id,
        },
        _ => db("create conversation")(e),
    })?;
    conversation_of(namespace, id, row.namespace, row.version, row.created_at)
}
