//! The commit of a request by its run's owner (`commit.sql`): one `INSERT`
//! into the `commits` view, alone or as a row of `commit_batches`, whose
//! trigger fences on the owner's run and revision and writes, in one
//! statement, the final answer appended to the request's messages in the
//! transcript and its committed length moved past it, the conversation
//! version bumped, the outcome stored for replay, the
//! admission released and the run completed. There is no moment where the
//! answer is committed but the conversation is still held.
//!
//! Refusal: a replaced owner (`fenced`) is [`Error::Fenced`].

use serde::Serialize;
use serde_json::value::RawValue;
use sqlx::SqliteConnection;

use super::{fenced, new_reports, raised, CheckpointColumns, FenceKeys, MessageColumns, Raised};
use crate::batch::Applied;
use crate::codec::{db, now_ms, only_row, to_i64, to_json, FenceColumns, Row};
use turnstile_core::checkpoint::{CheckpointPhase, LoopCheckpoint};
use turnstile_core::message::Message;
use turnstile_core::store::{Fence, StoredOutcome};
use turnstile_core::Error;

/// A commit, its values ready for its statement.
pub(crate) struct CommitStep {
    fence: Fence,
    checkpoint: LoopCheckpoint,
    reports: Option<Box<RawValue>>,
    answer: MessageColumns,
    final_seq: i64,
}

/// A [`CommitStep`] as its row of a shared statement (`batch.rs`).
#[derive(Serialize)]
struct CommitRow<'a> {
    #[serde(flatten)]
    fence: FenceKeys,
    now: i64,
    #[serde(flatten)]
    checkpoint: CheckpointColumns,
    #[serde(skip_serializing_if = "Option::is_none")]
    reports: Option<&'a RawValue>,
    answer_role: &'a str,
    answer_content: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    answer_meta: Option<&'a str>,
    final_seq: i64,
}

impl CommitStep {
    pub(crate) fn new(
        fence: &Fence,
        checkpoint: &LoopCheckpoint,
        final_message: &Message,
    ) -> Result<Self, Error> {
        let final_seq = checkpoint.message_count.checked_sub(1).ok_or_else(|| {
            Error::InvalidInput("a commit checkpoint must count the final message".into())
        })?;
        // The committed turn's checkpoint holds the outcome's totals.
        let completed = LoopCheckpoint {
            phase: CheckpointPhase::Completed,
            ..checkpoint.clone()
        };
        Ok(Self {
            fence: *fence,
            reports: new_reports(&[&completed])?,
            answer: MessageColumns::of(final_message)?,
            final_seq: to_i64(final_seq),
            checkpoint: completed,
        })
    }

    /// Commits as a statement of its own, fenced.
    pub(crate) async fn write(&self, tx: &mut SqliteConnection) -> Result<StoredOutcome, Error> {
        // When the writer sends the step, not when it was queued.
        let now = now_ms();
        let fence = &self.fence;
        let f = FenceColumns::of(fence);
        let c = CheckpointColumns::of(&self.checkpoint);
        let reports = self.reports.as_deref().map(RawValue::get);
        let answer = &self.answer;
        // The RETURNING subqueries read the request row as the trigger left it.
        let placed = sqlx::query!(
            r#"INSERT INTO commits (conversation_id, request_id, run_id, revision, now, turn,
                   phase, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
                   tool_calls_count, reports_count, message_count, reports, answer_role,
                   answer_content, answer_meta, final_seq)
               VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,
                   ?17, ?18, ?19)
               RETURNING
                   (SELECT conversation_version FROM requests WHERE request_id = ?2) AS "version!: i64",
                   (SELECT first_seq FROM requests WHERE request_id = ?2) AS "first_seq!: i64",
                   (SELECT end_seq FROM requests WHERE request_id = ?2) AS "end_seq!: i64""#,
            f.conversation,
            f.request,
            f.run,
            f.revision,
            now,
            c.turn,
            c.phase,
            c.input_tokens,
            c.output_tokens,
            c.cache_read_tokens,
            c.cache_write_tokens,
            c.tool_calls_count,
            c.reports_count,
            c.message_count,
            reports,
            answer.role,
            answer.content,
            answer.meta,
            self.final_seq
        )
        .fetch_all(&mut *tx)
        .await
        .and_then(only_row)
        .map_err(|e| match raised(&e) {
            Some(Raised::Fenced) => fenced(fence),
            _ => db("commit request")(e),
        })?;
        self.outcome(placed.version, placed.first_seq, placed.end_seq)
    }

    /// The step as its row of a shared statement.
    pub(crate) fn row(&self) -> Result<String, Error> {
        to_json(&CommitRow {
            fence: FenceKeys::of(&self.fence),
            now: now_ms(),
            checkpoint: CheckpointColumns::of(&self.checkpoint),
            reports: self.reports.as_deref(),
            answer_role: &self.answer.role,
            answer_content: &self.answer.content,
            answer_meta: self.answer.meta.as_deref(),
            final_seq: self.final_seq,
        })
    }

    /// The outcome, from what the commit's statement returned.
    pub(crate) fn outcome(
        &self,
        version: i64,
        first_seq: i64,
        end_seq: i64,
    ) -> Result<StoredOutcome, Error> {
        let key = Row {
            table: "requests",
            key: &self.fence.request_id,
        };
        let checkpoint = &self.checkpoint;
        Ok(StoredOutcome {
            run_id: self.fence.run_id,
            usage: checkpoint.usage,
            turns: checkpoint.turn,
            tool_calls: checkpoint.tool_calls_count,
            verification_reports: checkpoint.verification_reports.clone(),
            conversation_version: key.u64("conversation_version", version)?,
            first_seq: key.u64("first_seq", first_seq)?,
            end_seq: key.u64("end_seq", end_seq)?,
        })
    }
}

/// Many commits of one group transaction as one statement: a row each of
/// `commit_batches` (`batch.rs`), returning what each applied row placed.
pub(crate) async fn batch(
    conn: &mut SqliteConnection,
    rows: &str,
) -> Result<Vec<(i64, Applied)>, sqlx::Error> {
    // The RETURNING subqueries read the request row as its trigger left it.
    let returned = sqlx::query!(
        r#"WITH steps AS MATERIALIZED (SELECT key, jsonb(value) AS fields FROM json_each(?1))
           INSERT INTO commit_batches (step, conversation_id, request_id, run_id, revision, now,
               turn, phase, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
               tool_calls_count, reports_count, message_count, reports, answer_role,
               answer_content, answer_meta, final_seq)
           SELECT key, unhex(fields ->> '$.conversation'), unhex(fields ->> '$.request'),
               unhex(fields ->> '$.run'), fields ->> '$.revision', fields ->> '$.now',
               fields ->> '$.turn', fields ->> '$.phase', fields ->> '$.input_tokens',
               fields ->> '$.output_tokens', fields ->> '$.cache_read_tokens',
               fields ->> '$.cache_write_tokens', fields ->> '$.tool_calls_count',
               fields ->> '$.reports_count', fields ->> '$.message_count', fields -> '$.reports',
               fields ->> '$.answer_role', fields ->> '$.answer_content',
               fields ->> '$.answer_meta', fields ->> '$.final_seq'
           FROM steps
           RETURNING CAST(step AS INTEGER) AS "step!: i64",
               (SELECT conversation_version FROM requests
                WHERE request_id = commit_batches.request_id) AS "version!: i64",
               (SELECT first_seq FROM requests
                WHERE request_id = commit_batches.request_id) AS "first_seq!: i64",
               (SELECT end_seq FROM requests
                WHERE request_id = commit_batches.request_id) AS "end_seq!: i64""#,
        rows
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(returned
        .into_iter()
        .map(|r| {
            (
                r.step,
                Applied::Commit {
                    version: r.version,
                    first_seq: r.first_seq,
                    end_seq: r.end_seq,
                },
            )
        })
        .collect())
}
