//! Summary rows and the summary progress of the admission. A pass is
//! recorded in the admission before its model call and committed with its
//! summary row in one transaction; both are fenced by the owner's revision
//! and guarded by the conversation version the pass read.

use sqlx::PgConnection;
use uuid::Uuid;

use super::admission::load_admission;
use super::codec::{db, now_ms, text, to_i64, Row};
use super::steps::{check_fence, fenced};
use turnstile_core::backend::owns;
use turnstile_core::ids::{ConversationId, RequestId, Revision};
use turnstile_core::store::{Fence, StoredSummary, SummaryCommit, SummaryPass};
use turnstile_core::Error;

/// A `summaries` row as read.
struct SummaryRow {
    id: i64,
    request_id: Uuid,
    from_seq: i64,
    through_seq: i64,
    content: Vec<u8>,
    made_from_version: i64,
    input_tokens: i64,
    output_tokens: i64,
    cache_read_tokens: i64,
    cache_write_tokens: i64,
    created_at: i64,
}

impl SummaryRow {
    fn decode(self, conversation_id: ConversationId) -> Result<StoredSummary, Error> {
        let key = format!("{conversation_id}/{}", self.through_seq);
        let row = Row {
            table: "summaries",
            key: &key,
        };
        Ok(StoredSummary {
            id: self.id,
            conversation_id,
            request_id: row.checked_id::<RequestId>("request_id", self.request_id)?,
            from_seq: row.u64("from_seq", self.from_seq)?,
            through_seq: row.u64("through_seq", self.through_seq)?,
            content: text(&row, "content", self.content)?,
            made_from_version: row.u64("made_from_version", self.made_from_version)?,
            usage: row.usage(
                self.input_tokens,
                self.output_tokens,
                self.cache_read_tokens,
                self.cache_write_tokens,
            )?,
            created_at: self.created_at,
        })
    }
}

pub(crate) async fn load_latest_summary(
    conn: &mut PgConnection,
    conversation_id: ConversationId,
) -> Result<Option<StoredSummary>, Error> {
    sqlx::query_as!(
        SummaryRow,
        "SELECT id, request_id, from_seq, through_seq, content, made_from_version,
                input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, created_at
         FROM summaries WHERE conversation_id = $1 ORDER BY through_seq DESC LIMIT 1",
        conversation_id.as_uuid()
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("load latest summary"))?
    .map(|row| row.decode(conversation_id))
    .transpose()
}

/// A pass's record, inside its transaction.
pub(crate) async fn record_summary_pass_in(
    conn: &mut PgConnection,
    fence: &Fence,
    pass: &SummaryPass,
) -> Result<(), Error> {
    // Fenced; no other pass in flight (the same one again is a no-op);
    // the pass starts right after the latest summary, ends inside the
    // transcript, and read the current conversation version.
    let recorded = sqlx::query!(
        "UPDATE admissions
         SET summary_from_seq = $1, summary_through_seq = $2, summary_version = $3,
             summary_prompt_sha256 = $4, updated_at = $5
         WHERE conversation_id = $6 AND revision = $7 AND run_id = $8 AND $2::bigint >= $1::bigint
           AND (summary_from_seq IS NULL
                OR (summary_from_seq = $1 AND summary_through_seq = $2
                    AND summary_version = $3 AND summary_prompt_sha256 = $4))
           AND (SELECT version FROM conversations WHERE conversation_id = $6) = $3
           AND (SELECT COALESCE(MAX(through_seq) + 1, 0) FROM summaries
                WHERE conversation_id = $6) = $1
           AND (SELECT transcript_length FROM conversations WHERE conversation_id = $6) > $2",
        to_i64(pass.from_seq),
        to_i64(pass.through_seq),
        to_i64(pass.transcript_version),
        &pass.prompt_sha256[..],
        now_ms(),
        fence.conversation_id.as_uuid(),
        to_i64(fence.revision.0),
        fence.run_id.as_uuid()
    )
    .execute(&mut *conn)
    .await
    .map_err(db("record summary pass"))?;
    if recorded.rows_affected() != 1 {
        return Err(refusal(conn, fence, pass).await);
    }
    Ok(())
}

/// A pass's commit, inside its transaction.
pub(crate) async fn commit_summary_in(
    conn: &mut PgConnection,
    fence: &Fence,
    summary: &SummaryCommit,
) -> Result<StoredSummary, Error> {
    let pass = &summary.pass;
    let conversation = fence.conversation_id.as_uuid();
    let (from, through) = (to_i64(pass.from_seq), to_i64(pass.through_seq));
    let version = to_i64(pass.transcript_version);
    let usage = summary.usage;
    let (input, output) = (to_i64(usage.input_tokens), to_i64(usage.output_tokens));
    let (cache_read, cache_write) = (
        to_i64(usage.cache_read_tokens),
        to_i64(usage.cache_write_tokens),
    );
    let now = now_ms();
    check_fence(conn, fence).await?;

    // Committed before, acknowledgement lost: the same row, nothing new.
    let existing = sqlx::query_as!(
        SummaryRow,
        "SELECT id, request_id, from_seq, through_seq, content, made_from_version,
                input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, created_at
         FROM summaries WHERE conversation_id = $1 AND through_seq = $2",
        conversation,
        through
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("find committed summary"))?;
    if let Some(row) = existing {
        let stored = row.decode(fence.conversation_id)?;
        if stored.from_seq == pass.from_seq
            && stored.request_id == fence.request_id
            && stored.made_from_version == pass.transcript_version
        {
            return Ok(stored);
        }
        return Err(refusal(conn, fence, pass).await);
    }

    // The pass in flight is this one and the transcript has not moved: count
    // it and insert its row, in one statement.
    let id = sqlx::query_scalar!(
        r#"WITH counted AS (
               UPDATE admissions
               SET summary_passes = summary_passes + 1, summary_from_seq = NULL,
                   summary_through_seq = NULL, summary_version = NULL,
                   summary_prompt_sha256 = NULL,
                   input_tokens = input_tokens + $1, output_tokens = output_tokens + $2,
                   cache_read_tokens = cache_read_tokens + $3,
                   cache_write_tokens = cache_write_tokens + $4, updated_at = $5
               WHERE conversation_id = $6 AND revision = $7 AND run_id = $8
                 AND summary_from_seq = $9 AND summary_through_seq = $10
                 AND summary_version = $11 AND summary_prompt_sha256 = $12
                 AND (SELECT version FROM conversations WHERE conversation_id = $6) = $11
                 AND (SELECT COALESCE(MAX(through_seq) + 1, 0) FROM summaries
                      WHERE conversation_id = $6) = $9
               RETURNING conversation_id
           )
           INSERT INTO summaries (conversation_id, from_seq, through_seq, content,
               made_from_version, request_id, input_tokens, output_tokens, cache_read_tokens,
               cache_write_tokens, created_at)
           SELECT conversation_id, $9, $10, $13, $11, $14, $1, $2, $3, $4, $5 FROM counted
           RETURNING id"#,
        input,
        output,
        cache_read,
        cache_write,
        now,
        conversation,
        to_i64(fence.revision.0),
        fence.run_id.as_uuid(),
        from,
        through,
        version,
        &pass.prompt_sha256[..],
        summary.content.as_bytes(),
        fence.request_id.as_uuid()
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("commit summary"))?;
    let Some(id) = id else {
        return Err(refusal(conn, fence, pass).await);
    };
    Ok(StoredSummary {
        id,
        conversation_id: fence.conversation_id,
        request_id: fence.request_id,
        from_seq: pass.from_seq,
        through_seq: pass.through_seq,
        content: summary.content.clone(),
        made_from_version: pass.transcript_version,
        usage,
        created_at: now,
    })
}

/// Why a guarded summary write matched no row: the owner was replaced
/// ([`Error::Fenced`]), or the pass does not fit the conversation any more
/// ([`Error::Conflict`], with the conversation versions the pass read and
/// found).
async fn refusal(conn: &mut PgConnection, fence: &Fence, pass: &SummaryPass) -> Error {
    let admission = match load_admission(conn, fence.conversation_id).await {
        Ok(admission) => admission,
        // Deleted under the owner: fenced, as by any takeover.
        Err(Error::Deleted { .. }) => return fenced(fence),
        Err(e) => return e,
    };
    if !owns(&admission, fence) {
        return fenced(fence);
    }
    let version = match sqlx::query_scalar!(
        "SELECT version FROM conversations WHERE conversation_id = $1",
        fence.conversation_id.as_uuid()
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(db("read conversation version"))
    {
        Ok(version) => version,
        Err(e) => return e,
    };
    Error::Conflict {
        conversation_id: fence.conversation_id,
        expected: Revision(pass.transcript_version),
        actual: Revision(u64::try_from(version).unwrap_or_default()),
    }
}
