//! The durable steps, one file each: opening a conversation, a claim, a
//! recovery claim, a turn write, a tool result, a commit and an abandon.
//!
//! `turnstile-sqlite/src/steps/` holds the same steps under the same names
//! (`conversation_open`, `claim`, `recovery_claim`, `turn_write`,
//! `tool_result`, `commit`, `abandon`), there a SQL file (a view and its
//! trigger) with its Rust side beside it: `claim.rs` here reads side by
//! side with `turnstile-sqlite/src/steps/claim.sql` and `claim.rs`.
//!
//! Here each step is a Rust function of one statement that commits on its
//! own (the recovery claim, one short transaction; a claim or a commit
//! that writes more than its statement, a transaction of it and a
//! statement or two beside it, sent only once the fence holds), fence
//! first: the
//! statement's first part is the guarded update or lock of the admission
//! row, and every other part writes only rows joined to it, so a refused
//! step writes nothing. Its refusals are told apart by what the statement
//! returned and, where that cannot say, by reads after it; a step retried
//! after a lost acknowledgement (`retry`) recognises its own first
//! attempt. This module holds what several steps share: the fence's
//! refusal, the explanation of a compare-and-swap that matched nothing and
//! the column arrays of checkpoints, reports and messages.

use sqlx::PgConnection;

use crate::admission::load_admission;
use crate::codec::{to_i64, Row};
use turnstile_core::backend::{cas_refusal, message_columns, Wanted};
use turnstile_core::checkpoint::LoopCheckpoint;
use turnstile_core::ids::{ConversationId, RequestId, Revision};
use turnstile_core::message::Message;
use turnstile_core::store::Fence;
use turnstile_core::Error;

pub(crate) mod abandon;
pub(crate) mod claim;
pub(crate) mod commit;
pub(crate) mod conversation_open;
pub(crate) mod recovery_claim;
pub(crate) mod tool_result;
pub(crate) mod turn_write;

/// The fence on its own: touches the admission only while it still names
/// the owner's run and revision.
pub(crate) async fn check_fence(conn: &mut PgConnection, fence: &Fence) -> Result<(), Error> {
    turn_write::write_step(conn, fence, &turn_write::Step::default()).await
}

/// The refusal of a run owner's step whose admission moved on.
pub(crate) fn fenced(fence: &Fence) -> Error {
    Error::Fenced {
        run_id: fence.run_id,
        revision: fence.revision,
    }
}

/// Explains why a compare-and-swap on the admission matched no row.
pub(crate) async fn diagnose(
    conn: &mut PgConnection,
    wanted: Wanted,
    conversation_id: ConversationId,
    request_id: RequestId,
    expected: Revision,
) -> Error {
    match load_admission(conn, conversation_id).await {
        Ok(admission) => cas_refusal(admission, wanted, request_id, expected),
        Err(e) => e,
    }
}

/// A revision as the admission stored it.
pub(crate) fn fence_at(conversation_id: ConversationId, revision: i64) -> Result<Revision, Error> {
    Row {
        table: "admissions",
        key: &conversation_id,
    }
    .u64("revision", revision)
    .map(Revision)
}

/// Checkpoint rows as the column arrays the statements expand with
/// `UNNEST`.
pub(crate) struct CheckpointColumns {
    pub turns: Vec<i64>,
    pub phases: Vec<&'static str>,
    pub inputs: Vec<i64>,
    pub outputs: Vec<i64>,
    pub cache_reads: Vec<i64>,
    pub cache_writes: Vec<i64>,
    pub tool_calls: Vec<i64>,
    pub reports: Vec<i64>,
    pub message_counts: Vec<i64>,
}

impl CheckpointColumns {
    pub fn of(checkpoints: &[&LoopCheckpoint]) -> Self {
        let column = |f: fn(&LoopCheckpoint) -> u64| -> Vec<i64> {
            checkpoints.iter().map(|c| to_i64(f(c))).collect()
        };
        Self {
            turns: column(|c| u64::from(c.turn)),
            phases: checkpoints.iter().map(|c| c.phase.as_str()).collect(),
            inputs: column(|c| c.usage.input_tokens),
            outputs: column(|c| c.usage.output_tokens),
            cache_reads: column(|c| c.usage.cache_read_tokens),
            cache_writes: column(|c| c.usage.cache_write_tokens),
            tool_calls: column(|c| c.tool_calls_count),
            reports: column(|c| c.verification_reports.len() as u64),
            message_counts: column(|c| c.message_count),
        }
    }
}

/// The verification reports new in the checkpoints' own turns (the earlier
/// ones are stored already: a row only counts them), as column arrays.
#[derive(Default)]
pub(crate) struct ReportColumns<'a> {
    pub seqs: Vec<i64>,
    pub turns: Vec<i64>,
    pub passed: Vec<bool>,
    pub details: Vec<&'a [u8]>,
}

impl<'a> ReportColumns<'a> {
    pub fn of(checkpoints: &[&'a LoopCheckpoint]) -> Self {
        let mut columns = Self::default();
        for checkpoint in checkpoints {
            let all = &checkpoint.verification_reports;
            let Some(first_new) = first_new_report(checkpoint) else {
                continue;
            };
            for (seq, report) in all.iter().enumerate().skip(first_new) {
                columns.seqs.push(seq as i64);
                columns.turns.push(i64::from(report.turn));
                columns.passed.push(report.passed);
                columns.details.push(report.detail.as_bytes());
            }
        }
        columns
    }
}

/// Where a checkpoint's reports of its own turn begin, if it has any.
pub(crate) fn first_new_report(checkpoint: &LoopCheckpoint) -> Option<usize> {
    checkpoint
        .verification_reports
        .iter()
        .position(|r| r.turn == checkpoint.turn)
}

/// Messages as the column arrays the statements expand with `UNNEST`.
pub(crate) struct MessageColumns {
    pub roles: Vec<String>,
    pub contents: Vec<String>,
    /// `meta` is NULL for most messages; an array of text cannot say so
    /// through the checked macros, so the empty string stands for it.
    pub metas: Vec<String>,
}

impl MessageColumns {
    pub fn of(messages: &[Message]) -> Result<Self, Error> {
        let mut columns = Self {
            roles: Vec::with_capacity(messages.len()),
            contents: Vec::with_capacity(messages.len()),
            metas: Vec::with_capacity(messages.len()),
        };
        for message in messages {
            let (role, content, meta) = message_columns(message)?;
            columns.roles.push(role);
            columns.contents.push(content);
            columns.metas.push(meta.unwrap_or_default());
        }
        Ok(columns)
    }

    pub fn contents(&self) -> Vec<&[u8]> {
        self.contents.iter().map(|c| c.as_bytes()).collect()
    }
}
