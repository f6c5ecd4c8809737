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
    /// A run took the request's admission: a fresh admission, a resume or a
    /// recovery.
    RunStarted {
        /// The new run.
        run_id: RunId,
        /// The request it runs.
        request_id: RequestId,
        /// The run it continues, for a resume or a recovery.
        resumed_from: Option<RunId>,
        /// The revision it owns: what its writes are fenced by.
        revision: Revision,
    },
    /// The run continues a request that was admitted with another agent
    /// (an upgrade the caller accepted): sent right after `RunStarted`.
    AgentChanged {
        /// The run that continues the request.
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
        /// The request.
        request_id: RequestId,
        /// The run that stopped for the decision.
        run_id: RunId,
        /// The call's id (what `approve` and `reject` name).
        call_id: String,
        /// The tool asked for.
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
        /// The request's turn the pass counts as.
        turn: u32,
        /// The first transcript entry the pass summarizes.
        from_seq: u64,
        /// The last transcript entry the pass summarizes.
        through_seq: u64,
    },
    /// The pass's summary is committed: it covers every entry up to
    /// `through_seq`.
    SummaryCommitted {
        /// The request's turn the pass counted as.
        turn: u32,
        /// The committed summary's id.
        summary_id: i64,
        /// The last transcript entry it covers.
        through_seq: u64,
        /// Usage of this pass alone.
        usage: Usage,
    },
    /// A model turn begins.
    TurnStarted {
        /// The request's turn, counted across resumes.
        turn: u32,
    },
    /// A piece of the model's answer as it streams (only from a model that
    /// streams).
    TextDelta {
        /// The turn answering.
        turn: u32,
        /// The text, in order; the pieces of a turn add up to its answer.
        text: String,
    },
    /// The model answered a turn.
    ModelResponded {
        /// The turn answered.
        turn: u32,
        /// Usage of this model call alone.
        usage: Usage,
        /// How many tool calls the answer asks for.
        tool_calls: usize,
    },
    /// A tool call is about to run (not sent for a result reused from the
    /// journal).
    ToolStarted {
        /// The turn of the call.
        turn: u32,
        /// The call's id, as the model gave it.
        call_id: String,
        /// The tool.
        name: String,
        /// The call's arguments as the model gave them (JSON text).
        arguments: String,
    },
    /// A tool call is answered and its result journaled.
    ToolFinished {
        /// The turn of the call.
        turn: u32,
        /// The call's id, as the model gave it.
        call_id: String,
        /// The tool.
        name: String,
        /// The result the model is given: the tool's output, or what went
        /// wrong when `is_error`.
        content: String,
        /// The tool failed, timed out, or the call was refused.
        is_error: bool,
        /// The result came from the journal of an earlier run: the tool was
        /// not executed again.
        reused: bool,
    },
    /// A turn's loop checkpoint is durable: a resume starts from it.
    CheckpointSaved {
        /// The turn checkpointed.
        turn: u32,
        /// The revision it was saved at.
        revision: Revision,
    },
    /// The request is committed and the admission released; the last
    /// event.
    ConversationCommitted {
        /// What `run` returns.
        outcome: Box<Outcome>,
        /// The conversation version this commit produced.
        conversation_version: u64,
    },
}
