//! Events of a streamed execution.

use crate::ids::{RequestId, Revision, RunId};
use crate::message::Usage;
use crate::outcome::Outcome;

/// What happened, in order. `ConversationCommitted` is last and is sent only
/// once the commit and the admission release are durable; an error ends the
/// stream instead.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Event {
    RunStarted {
        run_id: RunId,
        request_id: RequestId,
        resumed_from: Option<RunId>,
        revision: Revision,
    },
    /// The run continues a request that was admitted with another agent
    /// (an upgrade the caller accepted): sent right after `RunStarted`.
    AgentChanged {
        run_id: RunId,
        /// The fingerprint the request was held with.
        from: String,
        /// This run's agent's.
        to: String,
    },
    /// A tool call waits for a human's decision; it is journaled as awaiting
    /// approval and the turn's checkpoint is settled. Sent for each such call
    /// once the stop is durable; the stream then ends with
    /// [`Error::AwaitingApproval`](crate::Error::AwaitingApproval).
    ApprovalRequested {
        request_id: RequestId,
        run_id: RunId,
        call_id: String,
        tool: String,
        /// The call's arguments as the model gave them (JSON text).
        arguments: String,
        /// The admission's revision a decision must name.
        revision: Revision,
    },
    /// A summary pass is recorded and its summary model is being called
    /// (before the request's first turn). `turn` is the request's turn the
    /// pass counts as.
    SummaryStarted {
        turn: u32,
        from_seq: u64,
        through_seq: u64,
    },
    /// The pass's summary is committed: it covers every entry up to
    /// `through_seq`.
    SummaryCommitted {
        turn: u32,
        summary_id: i64,
        through_seq: u64,
        /// Usage of this pass alone.
        usage: Usage,
    },
    TurnStarted {
        turn: u32,
    },
    TextDelta {
        turn: u32,
        text: String,
    },
    ModelResponded {
        turn: u32,
        /// Usage of this model call alone.
        usage: Usage,
        tool_calls: usize,
    },
    /// A tool call is about to run (not sent for a result reused from the
    /// journal).
    ToolStarted {
        turn: u32,
        call_id: String,
        name: String,
        /// The call's arguments as the model gave them (JSON text).
        arguments: String,
    },
    /// A tool call is answered and its result journaled.
    ToolFinished {
        turn: u32,
        call_id: String,
        name: String,
        /// The result the model is given: the tool's output, or what went
        /// wrong when `is_error`.
        content: String,
        is_error: bool,
        /// The result came from the journal of an earlier run: the tool was
        /// not executed again.
        reused: bool,
    },
    CheckpointSaved {
        turn: u32,
        revision: Revision,
    },
    ConversationCommitted {
        outcome: Box<Outcome>,
        conversation_version: u64,
    },
}
