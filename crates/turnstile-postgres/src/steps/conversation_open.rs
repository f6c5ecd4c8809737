//! The opening of a conversation: one statement that creates the
//! conversation and its idle admission unless they exist, and returns the
//! conversation as stored.
//!
//! Refusals: the id of a deleted conversation is [`Error::Deleted`]; a
//! conversation of another namespace is [`Error::NamespaceMismatch`].

use sqlx::PgConnection;

use crate::admission::{conversation_of, load_conversation};
use crate::codec::{db, now_ms};
use turnstile_core::ids::{ConversationId, Namespace};
use turnstile_core::store::Conversation;
use turnstile_core::Error;

/// A conversation and its idle admission, created together unless they
/// exist: one statement.
pub(crate) async fn ensure_conversation(
    conn: &mut PgConnection,
    namespace: &Namespace,
    id: ConversationId,
) -> Result<Conversation, Error> {
    // Twice at most: a concurrent creator's row, committed after this
    // statement's snapshot, is seen by the second.
    for _ in 0..2 {
        let row = sqlx::query!(
            r#"WITH created AS (
                   INSERT INTO conversations (conversation_id, namespace, version, created_at)
                   VALUES ($1, $2, 0, $3) ON CONFLICT DO NOTHING
                   RETURNING conversation_id, namespace, version, created_at
               ), admission AS (
                   INSERT INTO admissions (conversation_id, revision, updated_at)
                   SELECT conversation_id, 0, $3 FROM created
               )
               SELECT namespace AS "namespace!", version AS "version!", created_at AS "created_at!"
               FROM created
               UNION ALL
               SELECT namespace, version, created_at FROM conversations WHERE conversation_id = $1"#,
            id.as_uuid(),
            namespace.as_str(),
            now_ms()
        )
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| match crate::deletion::is_deleted(&e) {
            true => Error::Deleted {
                conversation_id: id,
            },
            false => db("create conversation")(e),
        })?;
        if let Some(row) = row {
            return conversation_of(namespace, id, &row.namespace, row.version, row.created_at);
        }
    }
    load_conversation(conn, namespace, id).await
}
