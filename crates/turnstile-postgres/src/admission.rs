//! Conversations and admissions as stored: their reads, and the decoding
//! of their rows that the reads and the steps (`steps/`) share.

use sqlx::PgConnection;

use super::codec::{db, Row};
use turnstile_core::backend::AdmissionRow;
use turnstile_core::ids::{ConversationId, Namespace, RequestId};
use turnstile_core::message::Usage;
use turnstile_core::store::{Admission, Conversation};
use turnstile_core::Error;

pub(crate) async fn load_recovery_usage(
    conn: &mut PgConnection,
    request_id: RequestId,
) -> Result<Usage, Error> {
    let row = sqlx::query!(
        "SELECT a.input_tokens, a.output_tokens, a.cache_read_tokens, a.cache_write_tokens
         FROM request_ids k JOIN admissions a ON a.conversation_id = k.conversation_id
         WHERE k.request_id = $1 AND a.active_request_id = $1",
        request_id.as_uuid()
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("read recovery usage"))?;
    match row {
        Some(r) => Row {
            table: "admissions",
            key: &request_id,
        }
        .usage(
            r.input_tokens,
            r.output_tokens,
            r.cache_read_tokens,
            r.cache_write_tokens,
        ),
        None => Err(Error::NotActive { request_id }),
    }
}

pub(crate) async fn load_conversation(
    conn: &mut PgConnection,
    namespace: &Namespace,
    id: ConversationId,
) -> Result<Conversation, Error> {
    let row = sqlx::query!(
        "SELECT namespace, version, created_at FROM conversations WHERE conversation_id = $1",
        id.as_uuid()
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("load conversation"))?;
    let Some(row) = row else {
        return Err(super::deletion::missing(conn, Some(namespace), id).await);
    };
    conversation_of(namespace, id, &row.namespace, row.version, row.created_at)
}

pub(crate) fn conversation_of(
    namespace: &Namespace,
    id: ConversationId,
    stored_namespace: &str,
    version: i64,
    created_at: i64,
) -> Result<Conversation, Error> {
    // Another namespace's conversation is reported as a mismatch without any
    // of its content.
    if stored_namespace != namespace.as_str() {
        return Err(Error::NamespaceMismatch {
            conversation_id: id,
            namespace: namespace.clone(),
        });
    }
    let key = Row {
        table: "conversations",
        key: &id,
    };
    Ok(Conversation {
        id,
        namespace: namespace.clone(),
        version: key.u64("version", version)?,
        created_at,
    })
}

pub(crate) async fn load_admission(
    conn: &mut PgConnection,
    conversation_id: ConversationId,
) -> Result<Admission, Error> {
    let row = sqlx::query_as!(
        AdmissionRow,
        "SELECT revision, active_request_id, input_sha256, run_id, agent_fingerprint,
                input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
                summary_passes, summary_from_seq, summary_through_seq, summary_version,
                summary_prompt_sha256
         FROM admissions WHERE conversation_id = $1",
        conversation_id.as_uuid()
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("load admission"))?;
    match row {
        Some(row) => row.decode(conversation_id),
        None => Err(super::deletion::missing(conn, None, conversation_id).await),
    }
}
