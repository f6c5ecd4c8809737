//! Conversations and admissions as stored: their reads, and the decoding
//! of their rows that the reads and the steps (`steps/`) share.

use super::read_connections::ReadConnections;

use super::codec::{db, Row};
use turnstile_core::backend::AdmissionRow;
use turnstile_core::ids::{ConversationId, Namespace, RequestId};
use turnstile_core::message::Usage;
use turnstile_core::store::{Admission, Conversation};
use turnstile_core::Error;

pub(super) async fn load_recovery_usage(
    reader: &ReadConnections,
    request_id: RequestId,
) -> Result<Usage, Error> {
    let mut conn = reader.acquire().await?;
    let request = request_id.as_uuid();
    let row = sqlx::query!(
        "SELECT a.input_tokens, a.output_tokens, a.cache_read_tokens, a.cache_write_tokens
         FROM requests r JOIN admissions a ON a.conversation_id = r.conversation_id
         WHERE r.request_id = ?1 AND a.active_request_id = ?1",
        request
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

pub(super) async fn load_conversation(
    conn: &mut sqlx::SqliteConnection,
    namespace: &Namespace,
    id: ConversationId,
) -> Result<Conversation, Error> {
    let uuid = id.as_uuid();
    let row = sqlx::query!(
        "SELECT namespace, version, created_at FROM conversations WHERE id = ?1",
        uuid
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("load conversation"))?;
    let Some(row) = row else {
        return Err(super::deletion::missing(conn, Some(namespace), id).await);
    };
    conversation_of(namespace, id, row.namespace, row.version, row.created_at)
}

/// A conversation row, read in `namespace`.
pub(super) fn conversation_of(
    namespace: &Namespace,
    id: ConversationId,
    stored_namespace: String,
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

pub(super) async fn load_admission(
    conn: &mut sqlx::SqliteConnection,
    conversation_id: ConversationId,
) -> Result<Admission, Error> {
    let uuid = conversation_id.as_uuid();
    let row = sqlx::query_as!(
        AdmissionColumns,
        "SELECT revision, active_request_id, input_sha256, run_id, agent_fingerprint,
                input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
                summary_passes, summary_from_seq, summary_through_seq, summary_version,
                summary_prompt_sha256
         FROM admissions WHERE conversation_id = ?1",
        uuid
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("load admission"))?;
    match row {
        Some(row) => row.decode(conversation_id),
        None => Err(super::deletion::missing(conn, None, conversation_id).await),
    }
}

/// An `admissions` row as SQLite reads it: ids as 16-byte blobs.
pub(super) struct AdmissionColumns {
    pub(super) revision: i64,
    pub(super) active_request_id: Option<Vec<u8>>,
    pub(super) input_sha256: Option<Vec<u8>>,
    pub(super) run_id: Option<Vec<u8>>,
    pub(super) agent_fingerprint: Option<String>,
    pub(super) input_tokens: i64,
    pub(super) output_tokens: i64,
    pub(super) cache_read_tokens: i64,
    pub(super) cache_write_tokens: i64,
    pub(super) summary_passes: i64,
    pub(super) summary_from_seq: Option<i64>,
    pub(super) summary_through_seq: Option<i64>,
    pub(super) summary_version: Option<i64>,
    pub(super) summary_prompt_sha256: Option<Vec<u8>>,
}

impl AdmissionColumns {
    /// The admission: its ids as uuids, then decoded as every backend does.
    pub(super) fn decode(self, conversation_id: ConversationId) -> Result<Admission, Error> {
        let key = Row {
            table: "admissions",
            key: &conversation_id,
        };
        let uuid =
            |column: &str, bytes: Option<Vec<u8>>| bytes.map(|b| key.uuid(column, &b)).transpose();
        AdmissionRow {
            revision: self.revision,
            active_request_id: uuid("active_request_id", self.active_request_id)?,
            input_sha256: self.input_sha256,
            run_id: uuid("run_id", self.run_id)?,
            agent_fingerprint: self.agent_fingerprint,
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            cache_read_tokens: self.cache_read_tokens,
            cache_write_tokens: self.cache_write_tokens,
            summary_passes: self.summary_passes,
            summary_from_seq: self.summary_from_seq,
            summary_through_seq: self.summary_through_seq,
            summary_version: self.summary_version,
            summary_prompt_sha256: self.summary_prompt_sha256,
        }
        .decode(conversation_id)
    }
}
