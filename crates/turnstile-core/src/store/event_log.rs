//! A conversation's event log: one numbered row for each durable step a
//! client watching the conversation cares about, written in the step's own
//! transaction, so a reader that follows the log from a sequence number
//! sees every step once, in order, and none that rolled back.

use serde::Serialize;

use crate::ids::{RequestId, RunId};

/// One entry of a conversation's event log. As JSON: `seq`, `at`,
/// `request_id`, and the step's fields with its `kind` (`admitted`,
/// `run_started`, `answered`, …).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LoggedEvent {
    /// Its number in the conversation's log: 1 for the first, and one more
    /// for each later one. Numbers are never reused, not even after the
    /// events of a pruned request are removed.
    pub seq: u64,
    /// When the step happened (Unix milliseconds).
    pub at: i64,
    /// The request the step belongs to.
    pub request_id: RequestId,
    /// What happened.
    #[serde(flatten)]
    pub step: LoggedStep,
}

/// The durable step an event reports. Each names what a reader needs to
/// read its detail (a transcript entry, a run, a tool call) from the store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum LoggedStep {
    /// The request was admitted; `run_id` is its first run.
    Admitted {
        /// The run that took the admission.
        run_id: RunId,
        /// The request's input: its place in the transcript, where the
        /// request's messages start.
        entry_seq: u64,
    },
    /// A run took over the request: a resume, a recovery or a lease
    /// takeover.
    RunStarted {
        /// The run that continues the request.
        run_id: RunId,
    },
    /// The model answered with tool calls: its message is the transcript
    /// entry at `entry_seq`, and each call's result follows as
    /// [`LoggedStep::ToolFinished`] (the request's input is told by
    /// `Admitted`, its final answer by `Committed`). Before the request
    /// commits, it is message number `entry_seq` − the `entry_seq` of
    /// the request's [`LoggedStep::Admitted`] (from 0, its input) of
    /// [`Store::request_messages`](super::Store::request_messages); after,
    /// it reads with [`Store::transcript_range`](super::Store::transcript_range).
    /// An abandoned request's entries leave the transcript and the next
    /// request's take their places: an entry read later belongs to the
    /// event only while its `request_id` is the event's.
    Answered {
        /// The answer's place in the transcript.
        entry_seq: u64,
    },
    /// A tool call's result was journaled.
    ToolFinished {
        /// The request's turn that made the call.
        turn: u32,
        /// The call's id.
        call_id: String,
    },
    /// A tool call waits for a human's decision.
    ApprovalRequested {
        /// The request's turn that made the call.
        turn: u32,
        /// The call's id.
        call_id: String,
    },
    /// A human approved or rejected a tool call.
    ApprovalDecided {
        /// The request's turn that made the call.
        turn: u32,
        /// The call's id.
        call_id: String,
    },
    /// A turn ended with its tool results: its loop checkpoint is durable,
    /// and a run that continues the request starts from it (the next turn).
    CheckpointSaved {
        /// The run that saved it.
        run_id: RunId,
        /// The request's turn that ended.
        turn: u32,
    },
    /// A run stopped without committing (a failure, a deadline, a wait for
    /// approval): the request still holds its admission.
    Stopped {
        /// The run that stopped.
        run_id: RunId,
    },
    /// The request committed: its final answer is its last transcript
    /// entry (`end_seq - 1` of its stored outcome).
    Committed {
        /// The run that committed it.
        run_id: RunId,
    },
    /// The request was abandoned: the admission is free again.
    Abandoned,
}

impl LoggedStep {
    /// Its kind as the JSON names it: `admitted`, `run_started`,
    /// `answered`, `tool_finished`, `approval_requested`,
    /// `approval_decided`, `checkpoint_saved`, `stopped`, `committed` or
    /// `abandoned`.
    pub fn kind(&self) -> &'static str {
        match self {
            LoggedStep::Admitted { .. } => "admitted",
            LoggedStep::RunStarted { .. } => "run_started",
            LoggedStep::Answered { .. } => "answered",
            LoggedStep::ToolFinished { .. } => "tool_finished",
            LoggedStep::ApprovalRequested { .. } => "approval_requested",
            LoggedStep::ApprovalDecided { .. } => "approval_decided",
            LoggedStep::CheckpointSaved { .. } => "checkpoint_saved",
            LoggedStep::Stopped { .. } => "stopped",
            LoggedStep::Committed { .. } => "committed",
            LoggedStep::Abandoned => "abandoned",
        }
    }
}
