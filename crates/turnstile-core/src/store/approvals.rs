//! Records of human approval of tool calls: what a run waits for, and the
//! decisions, kept in the database so nothing a client sends back can alter
//! what was approved.

use serde::Serialize;

use crate::ids::{ConversationId, RequestId, Revision, RunId};
use crate::stored_name::stored_names;

/// Where a tool call stands in its approval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApprovalStatus {
    /// Asked for; no decision yet.
    Awaiting,
    /// Approved: the next run that continues the request executes it.
    Approved,
    /// Rejected: the model is given the reason as the call's error result.
    Rejected,
}

stored_names!(ApprovalStatus {
    Awaiting => "awaiting",
    Approved => "approved",
    Rejected => "rejected",
});

/// One tool call's approval, as the store keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApprovalRecord {
    /// The request whose call it is.
    pub request_id: RequestId,
    /// The request's turn that asked for the call.
    pub turn: u32,
    /// The call's id, as the model gave it.
    pub call_id: String,
    /// The run that stopped to ask.
    pub run_id: RunId,
    /// Where it stands.
    pub status: ApprovalStatus,
    /// Why it was rejected.
    pub reason: Option<String>,
    /// Unix milliseconds.
    pub requested_at: i64,
    /// Unix milliseconds; set once decided.
    pub decided_at: Option<i64>,
}

/// A tool call waiting for a decision, with what deciding needs: the
/// request, the call, and the admission's current revision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PendingApproval {
    /// The conversation of the request.
    pub conversation_id: ConversationId,
    /// The request waiting.
    pub request_id: RequestId,
    /// The run that holds the request now: the one to resume once the
    /// calls are decided.
    pub run_id: RunId,
    /// The turn that asked for the call.
    pub turn: u32,
    /// The call's id: what a decision names.
    pub call_id: String,
    /// The tool asked for.
    pub tool: String,
    /// The call's arguments as the model gave them (JSON text).
    pub arguments: String,
    /// The admission's revision now: a decision is a compare-and-swap on it.
    pub revision: Revision,
    /// Unix milliseconds.
    pub requested_at: i64,
}

/// What an approver decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Run the call.
    Approve,
    /// The reason is given to the model as the call's error result.
    Reject {
        /// Why: the model is given it.
        reason: String,
    },
}

/// A decision on one awaiting tool call, as
/// [`Store::decide_approval`](super::Store::decide_approval) takes it.
#[derive(Clone, Debug)]
pub struct ApprovalDecision {
    /// The request's conversation.
    pub conversation_id: ConversationId,
    /// The request whose call is decided.
    pub request_id: RequestId,
    /// The call decided.
    pub call_id: String,
    /// The admission's revision the approver saw.
    pub expected_revision: Revision,
    /// Approve, or reject with a reason.
    pub verdict: Verdict,
}

/// The most bytes a rejection reason may have.
pub const MAX_REJECTION_REASON_BYTES: usize = 4096;
