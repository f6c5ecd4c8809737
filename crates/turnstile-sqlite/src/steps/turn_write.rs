//! The writes of a run's owner during its turns (`turn_write.sql`): a
//! turn's write-ahead checkpoint, the model's answer, a turn's end and a
//! run's failure. Each is one `INSERT` into the `turn_writes` view, alone
//! or as a row of `turn_write_batches`, whose trigger fences on the owner's
//! run and revision and then writes the step's rows. A turn with one tool
//! call is three of these steps and one tool result (`tool_result.rs`).
//!
//! Refusal: a replaced owner (`fenced`) is [`Error::Fenced`]; SQLite undoes
//! the statement and nothing is written.

use serde::Serialize;
use serde_json::value::RawValue;
use sqlx::SqliteConnection;

use super::{fenced, new_reports, raised, raw_list, CheckpointColumns, FenceKeys, Raised};
use crate::batch::Applied;
use crate::codec::{db, now_ms, to_i64, to_json, FenceColumns};
use turnstile_core::backend::stored_messages_json;
use turnstile_core::checkpoint::LoopCheckpoint;
use turnstile_core::message::{Message, ToolCall};
use turnstile_core::store::Fence;
use turnstile_core::Error;

/// The parts of one `turn_writes` row; each may be empty.
#[derive(Default)]
struct TurnWrite<'a> {
    /// Checkpoint rows, saved in order (the last one's usage reaches the
    /// admission), with the verification reports new in their turns.
    checkpoints: &'a [&'a LoopCheckpoint],
    /// The turn the messages, calls and compaction belong to.
    turn: u32,
    /// Messages appended at `first_seq..`.
    first_seq: u64,
    messages: &'a [Message],
    /// Tool calls journaled as requested.
    calls: &'a [ToolCall],
    /// Clears the turn's journaled arguments and results.
    compact: bool,
    /// Marks the run failed with this error.
    failure: Option<&'a str>,
}

/// One step of a run's owner, its values ready for its statement: built on
/// the caller's task, so the writer only sends it.
pub(crate) struct TurnStep {
    fence: Fence,
    checkpoints: Option<Box<RawValue>>,
    reports: Option<Box<RawValue>>,
    turn: i64,
    first_seq: i64,
    messages: Option<Box<RawValue>>,
    calls: Option<Box<RawValue>>,
    compact: bool,
    failure: Option<String>,
}

/// A [`TurnStep`] as its row of a shared statement (`batch.rs`).
#[derive(Serialize)]
struct TurnRow<'a> {
    #[serde(flatten)]
    fence: FenceKeys,
    now: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    checkpoints: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reports: Option<&'a RawValue>,
    turn: i64,
    first_seq: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    messages: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    calls: Option<&'a RawValue>,
    compact: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    failure: Option<&'a str>,
}

impl TurnStep {
    fn new(fence: &Fence, write: TurnWrite<'_>) -> Result<Self, Error> {
        Ok(Self {
            fence: *fence,
            checkpoints: checkpoint_rows(write.checkpoints)?,
            reports: new_reports(write.checkpoints)?,
            turn: i64::from(write.turn),
            first_seq: to_i64(write.first_seq),
            messages: stored_messages(write.messages)?,
            calls: raw_list(write.calls)?,
            compact: write.compact,
            failure: write.failure.map(str::to_owned),
        })
    }

    /// Writes the step as a statement of its own, fenced.
    pub(crate) async fn write(&self, conn: &mut SqliteConnection) -> Result<(), Error> {
        // When the writer sends the step, not when it was queued.
        let now = now_ms();
        let fence = &self.fence;
        let f = FenceColumns::of(fence);
        let checkpoints = self.checkpoints.as_deref().map(RawValue::get);
        let reports = self.reports.as_deref().map(RawValue::get);
        let messages = self.messages.as_deref().map(RawValue::get);
        let calls = self.calls.as_deref().map(RawValue::get);
        sqlx::query!(
            "INSERT INTO turn_writes (conversation_id, request_id, run_id, revision, now,
                 checkpoints, reports, turn, first_seq, messages, calls, compact, failure)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
            f.conversation,
            f.request,
            f.run,
            f.revision,
            now,
            checkpoints,
            reports,
            self.turn,
            self.first_seq,
            messages,
            calls,
            self.compact,
            self.failure
        )
        .execute(&mut *conn)
        .await
        .map(drop)
        .map_err(|e| match raised(&e) {
            Some(Raised::Fenced) => fenced(fence),
            _ => db("write turn step")(e),
        })
    }

    /// The step as its row of a shared statement.
    pub(crate) fn row(&self) -> Result<String, Error> {
        to_json(&TurnRow {
            fence: FenceKeys::of(&self.fence),
            now: now_ms(),
            checkpoints: self.checkpoints.as_deref(),
            reports: self.reports.as_deref(),
            turn: self.turn,
            first_seq: self.first_seq,
            messages: self.messages.as_deref(),
            calls: self.calls.as_deref(),
            compact: self.compact,
            failure: self.failure.as_deref(),
        })
    }
}

/// A turn's write-ahead checkpoint.
pub(crate) fn begin_turn(fence: &Fence, checkpoint: &LoopCheckpoint) -> Result<TurnStep, Error> {
    let write = TurnWrite {
        checkpoints: &[checkpoint],
        turn: checkpoint.turn,
        ..TurnWrite::default()
    };
    TurnStep::new(fence, write)
}

/// The model's answer, its checkpoint and its tool calls journaled as
/// requested.
pub(crate) fn model_response(
    fence: &Fence,
    checkpoint: &LoopCheckpoint,
    assistant: &Message,
) -> Result<TurnStep, Error> {
    let write = TurnWrite {
        checkpoints: &[checkpoint],
        turn: checkpoint.turn,
        first_seq: checkpoint.message_count,
        messages: std::slice::from_ref(assistant),
        calls: assistant.tool_calls(),
        ..TurnWrite::default()
    };
    TurnStep::new(fence, write)
}

/// A turn's end: its checkpoint, the next turn's write-ahead if any, and
/// the turn's `messages` at `first_seq..`; the turn's calls and results are
/// messages now, so the journal keeps only its record of what ran.
pub(crate) fn finish_turn(
    fence: &Fence,
    checkpoint: &LoopCheckpoint,
    first_seq: u64,
    messages: &[Message],
    next: Option<&LoopCheckpoint>,
) -> Result<TurnStep, Error> {
    let both;
    let checkpoints: &[&LoopCheckpoint] = match next {
        Some(next) => {
            both = [checkpoint, next];
            &both
        }
        None => std::slice::from_ref(&checkpoint),
    };
    let write = TurnWrite {
        checkpoints,
        turn: checkpoint.turn,
        first_seq,
        messages,
        compact: true,
        ..TurnWrite::default()
    };
    TurnStep::new(fence, write)
}

/// A run's failure. A settled checkpoint may count usage the last write did
/// not (an answer refused as malformed): it is saved, and the admission
/// reports its usage.
pub(crate) fn fail_run(
    fence: &Fence,
    error: &str,
    settled: Option<&LoopCheckpoint>,
) -> Result<TurnStep, Error> {
    let write = TurnWrite {
        checkpoints: settled.as_slice(),
        turn: settled.map_or(0, |c| c.turn),
        failure: Some(error),
        ..TurnWrite::default()
    };
    TurnStep::new(fence, write)
}

/// Checkpoints as the JSON rows the step triggers save.
fn checkpoint_rows(checkpoints: &[&LoopCheckpoint]) -> Result<Option<Box<RawValue>>, Error> {
    let rows: Vec<serde_json::Value> = checkpoints.iter().map(|c| checkpoint_row(c)).collect();
    raw_list(&rows)
}

/// One checkpoint as the JSON object the turn-write trigger expands (its
/// keys are `turn_write.sql`'s).
fn checkpoint_row(checkpoint: &LoopCheckpoint) -> serde_json::Value {
    let c = CheckpointColumns::of(checkpoint);
    serde_json::json!({
        "turn": c.turn,
        "phase": c.phase,
        "input": c.input_tokens,
        "output": c.output_tokens,
        "cache_read": c.cache_read_tokens,
        "cache_write": c.cache_write_tokens,
        "tool_calls": c.tool_calls_count,
        "reports": c.reports_count,
        "messages": c.message_count,
    })
}

/// Many turn writes of one group transaction as one statement: a row each
/// of `turn_write_batches` (`batch.rs`).
pub(crate) async fn batch(
    conn: &mut SqliteConnection,
    rows: &str,
) -> Result<Vec<(i64, Applied)>, sqlx::Error> {
    let returned = sqlx::query_scalar!(
        r#"WITH steps AS MATERIALIZED (SELECT key, jsonb(value) AS fields FROM json_each(?1))
           INSERT INTO turn_write_batches (step, conversation_id, request_id, run_id, revision,
               now, checkpoints, reports, turn, first_seq, messages, calls, compact, failure)
           SELECT key, unhex(fields ->> '$.conversation'), unhex(fields ->> '$.request'),
               unhex(fields ->> '$.run'), fields ->> '$.revision', fields ->> '$.now',
               fields -> '$.checkpoints', fields -> '$.reports', fields ->> '$.turn',
               fields ->> '$.first_seq', fields -> '$.messages', fields -> '$.calls',
               fields ->> '$.compact', fields ->> '$.failure'
           FROM steps
           RETURNING CAST(step AS INTEGER) AS "step!: i64""#,
        rows
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(returned
        .into_iter()
        .map(|step| (step, Applied::TurnWrite))
        .collect())
}

/// Messages as the rows the trigger splits into columns (`None`: none).
fn stored_messages(messages: &[Message]) -> Result<Option<Box<RawValue>>, Error> {
    if messages.is_empty() {
        return Ok(None);
    }
    RawValue::from_string(stored_messages_json(messages)?)
        .map(Some)
        .map_err(|e| Error::InvalidInput(format!("messages cannot be serialized: {e}")))
}
