//! A checkpoint and a message as the plain columns of the claim and commit
//! statements (the `claims` and `commits` views of migration 0013), and of
//! their rows in a shared statement (`batch.rs`). Each of those steps has
//! at most one checkpoint and exactly one message, so they need no JSON
//! list for SQLite to take apart. A turn write's checkpoint rows
//! (`turns.rs`) are built from the same columns.

use serde::Serialize;

use super::codec::to_i64;
use turnstile_core::backend::message_columns;
use turnstile_core::checkpoint::LoopCheckpoint;
use turnstile_core::message::Message;
use turnstile_core::Error;

/// A checkpoint as its `loop_checkpoints` columns (the run and the time
/// are the step's own). Serialized under the column names, which the
/// shared statements read back.
#[derive(Clone, Copy, Serialize)]
pub(super) struct CheckpointColumns {
    pub(super) turn: i64,
    pub(super) phase: &'static str,
    pub(super) input_tokens: i64,
    pub(super) output_tokens: i64,
    pub(super) cache_read_tokens: i64,
    pub(super) cache_write_tokens: i64,
    pub(super) tool_calls_count: i64,
    pub(super) reports_count: i64,
    pub(super) message_count: i64,
}

impl CheckpointColumns {
    pub(super) fn of(checkpoint: &LoopCheckpoint) -> Self {
        let usage = checkpoint.usage;
        let reports = u64::try_from(checkpoint.verification_reports.len()).unwrap_or(u64::MAX);
        Self {
            turn: i64::from(checkpoint.turn),
            phase: checkpoint.phase.as_str(),
            input_tokens: to_i64(usage.input_tokens),
            output_tokens: to_i64(usage.output_tokens),
            cache_read_tokens: to_i64(usage.cache_read_tokens),
            cache_write_tokens: to_i64(usage.cache_write_tokens),
            tool_calls_count: to_i64(checkpoint.tool_calls_count),
            reports_count: to_i64(reports),
            message_count: to_i64(checkpoint.message_count),
        }
    }
}

/// A message as its stored columns: role, text and `meta` (its other
/// fields as a JSON object, `None` when it has none).
pub(super) struct MessageColumns {
    pub(super) role: String,
    pub(super) content: String,
    pub(super) meta: Option<String>,
}

impl MessageColumns {
    pub(super) fn of(message: &Message) -> Result<Self, Error> {
        let (role, content, meta) = message_columns(message)?;
        Ok(Self {
            role,
            content,
            meta,
        })
    }
}
