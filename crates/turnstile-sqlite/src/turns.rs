//! The writes of a run's owner during its turns. Each is one step of the
//! group writer and one statement: an `INSERT` into the `turn_writes` view
//! (migration 0005), whose trigger checks the fence (the admission still
//! names the owner's run and revision) and then writes the step's rows. If
//! the admission moved on, the trigger raises, SQLite undoes the statement,
//! nothing is written and the owner gets [`Error::Fenced`]. A turn with one
//! tool call is three steps of one statement each.

use std::collections::BTreeMap;

use sqlx::SqliteConnection;

use serde::Serialize;
use serde_json::value::RawValue;

use super::batch::FenceKeys;
use super::codec::{db, now_ms, to_i64, to_json, FenceColumns};
use super::step_columns::CheckpointColumns;
use super::steps::{raised, Raised};
use turnstile_core::checkpoint::LoopCheckpoint;
use turnstile_core::message::{Message, ToolCall};
use turnstile_core::store::{Fence, ToolResult};
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
pub(super) struct TurnStep {
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
            messages: raw_list(write.messages)?,
            calls: raw_list(write.calls)?,
            compact: write.compact,
            failure: write.failure.map(str::to_owned),
        })
    }

    /// Writes the step as a statement of its own, fenced.
    pub(super) async fn write(&self, conn: &mut SqliteConnection) -> Result<(), Error> {
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
    pub(super) fn row(&self) -> Result<String, Error> {
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
pub(super) fn begin_turn(fence: &Fence, checkpoint: &LoopCheckpoint) -> Result<TurnStep, Error> {
    let write = TurnWrite {
        checkpoints: &[checkpoint],
        turn: checkpoint.turn,
        ..TurnWrite::default()
    };
    TurnStep::new(fence, write)
}

/// The model's answer, its checkpoint and its tool calls journaled as
/// requested.
pub(super) fn model_response(
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

/// One tool call's result, its values ready for its statement.
pub(super) struct ToolResultStep {
    fence: Fence,
    turn: i64,
    call_id: String,
    status: &'static str,
    result: String,
}

/// A [`ToolResultStep`] as its row of a shared statement (`batch.rs`).
#[derive(Serialize)]
struct ToolResultRow<'a> {
    #[serde(flatten)]
    fence: FenceKeys,
    turn: i64,
    call_id: &'a str,
    status: &'a str,
    result: &'a str,
    now: i64,
}

impl ToolResultStep {
    pub(super) fn new(fence: &Fence, turn: u32, call_id: &str, result: &ToolResult) -> Self {
        Self {
            fence: *fence,
            turn: i64::from(turn),
            call_id: call_id.to_owned(),
            status: if result.is_error {
                "failed"
            } else {
                "completed"
            },
            result: result.content.clone(),
        }
    }

    /// Journals the result as a statement of its own, fenced in the same
    /// statement: it lands only while the admission still names this run.
    pub(super) async fn write(&self, conn: &mut SqliteConnection) -> Result<(), Error> {
        // When the writer sends the step, not when it was queued.
        let now = now_ms();
        let fence = &self.fence;
        let f = FenceColumns::of(fence);
        let journaled = sqlx::query!(
            "UPDATE tool_calls SET status = ?1, result = ?2, completed_at = ?3
             WHERE request_id = ?4 AND turn = ?5 AND call_id = ?6
                 AND status = 'requested'
                 AND EXISTS (SELECT 1 FROM admissions
                     WHERE conversation_id = ?7 AND revision = ?8 AND run_id = ?9
                         AND active_request_id = ?4)",
            self.status,
            self.result,
            now,
            f.request,
            self.turn,
            self.call_id,
            f.conversation,
            f.revision,
            f.run
        )
        .execute(&mut *conn)
        .await
        .map_err(db("journal tool result"))?;
        if journaled.rows_affected() == 1 {
            return Ok(());
        }
        // Nothing written: either the owner was replaced, or there is no
        // such call waiting for its result.
        if !fence_holds(conn, fence).await? {
            return Err(fenced(fence));
        }
        Err(Error::InvalidInput(format!(
            "no requested tool call {:?} in turn {} of request {}",
            self.call_id, self.turn, fence.request_id
        )))
    }

    /// The step as its row of a shared statement.
    pub(super) fn row(&self) -> Result<String, Error> {
        to_json(&ToolResultRow {
            fence: FenceKeys::of(&self.fence),
            turn: self.turn,
            call_id: &self.call_id,
            status: self.status,
            result: &self.result,
            now: now_ms(),
        })
    }
}

/// A turn's end: its checkpoint, the next turn's write-ahead if any, and
/// the turn's `messages` at `first_seq..`; the turn's calls and results are
/// messages now, so the journal keeps only its record of what ran.
pub(super) fn finish_turn(
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
pub(super) fn fail_run(
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

/// Whether the admission still names the owner's request, run and
/// revision. Reads only: for explaining a write that matched nothing.
pub(super) async fn fence_holds(conn: &mut SqliteConnection, fence: &Fence) -> Result<bool, Error> {
    let f = FenceColumns::of(fence);
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM admissions
               WHERE conversation_id = ?1 AND revision = ?2 AND run_id = ?3
                   AND active_request_id = ?4) AS "holds!: bool""#,
        f.conversation,
        f.revision,
        f.run,
        f.request
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(db("check fence"))
}

pub(super) fn fenced(fence: &Fence) -> Error {
    Error::Fenced {
        run_id: fence.run_id,
        revision: fence.revision,
    }
}

/// A list as the JSON array a step trigger expands, `None` (SQL NULL) when
/// it is empty.
pub(super) fn raw_list<T: Serialize>(items: &[T]) -> Result<Option<Box<RawValue>>, Error> {
    match items {
        [] => Ok(None),
        items => raw_json(items).map(Some),
    }
}

/// A value as JSON, kept as text to bind or to embed in a row.
pub(super) fn raw_json<T: Serialize + ?Sized>(value: &T) -> Result<Box<RawValue>, Error> {
    serde_json::value::to_raw_value(value)
        .map_err(|e| Error::InvalidInput(format!("value cannot be serialized: {e}")))
}

/// Checkpoints as the JSON rows the step triggers save.
pub(super) fn checkpoint_rows(
    checkpoints: &[&LoopCheckpoint],
) -> Result<Option<Box<RawValue>>, Error> {
    let rows: Vec<serde_json::Value> = checkpoints.iter().map(|c| checkpoint_row(c)).collect();
    raw_list(&rows)
}

/// One checkpoint as the JSON object the turn-write trigger expands (its
/// keys are migration 0005's).
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

/// The verification reports the checkpoints' own turns added, by their
/// position in the request (the earlier ones are stored already: a
/// checkpoint row only counts them). A position two checkpoints share is
/// taken from the first, as the trigger keeps a stored report.
pub(super) fn new_reports(checkpoints: &[&LoopCheckpoint]) -> Result<Option<Box<RawValue>>, Error> {
    let mut rows = BTreeMap::new();
    for checkpoint in checkpoints {
        let reports = &checkpoint.verification_reports;
        let Some(first_new) = reports.iter().position(|r| r.turn == checkpoint.turn) else {
            continue;
        };
        for (seq, report) in reports.iter().enumerate().skip(first_new) {
            rows.entry(seq).or_insert_with(|| {
                serde_json::json!({
                    "seq": seq,
                    "turn": report.turn,
                    "passed": report.passed,
                    "detail": report.detail,
                })
            });
        }
    }
    raw_list(&rows.into_values().collect::<Vec<_>>())
}
