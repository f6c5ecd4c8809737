//! Plain records the store reads and writes.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::agent::Budget;
use crate::checkpoint::LoopCheckpoint;
use crate::error::Error;
use crate::ids::{ConversationId, Namespace, RequestId, Revision, RunId};
use crate::message::{Content, Message, ToolResult, Usage, VerificationReport};
use crate::stored_name::stored_names;

/// SHA-256 of a request's input: what a request id is bound to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct InputHash(pub [u8; 32]);

impl InputHash {
    /// The hash of an input text.
    pub fn of(input: &str) -> Self {
        Self(Sha256::digest(input.as_bytes()).into())
    }

    /// The hash of an input's content: of its text when it is plain text
    /// (as [`InputHash::of`]), otherwise of its parts as JSON (an image or
    /// file by its SHA-256) after a byte no text holds, so that no text
    /// hashes as content with other parts.
    pub fn of_content(input: &Content) -> Result<Self, Error> {
        if let Some(text) = input.as_plain_text() {
            return Ok(Self::of(text));
        }
        let json = serde_json::to_vec(input)
            .map_err(|e| Error::InvalidInput(format!("input cannot be serialized: {e}")))?;
        let mut hasher = Sha256::new();
        hasher.update([0xff]);
        hasher.update(json);
        Ok(Self(hasher.finalize().into()))
    }
}

/// A conversation's header row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conversation {
    /// The conversation.
    pub id: ConversationId,
    /// The namespace it belongs to; every call names it.
    pub namespace: Namespace,
    /// Number of committed requests.
    pub version: u64,
    /// Unix milliseconds.
    pub created_at: i64,
}

/// A conversation's admission: idle, or held by one active request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admission {
    /// The conversation.
    pub conversation_id: ConversationId,
    /// Bumped by every ownership change: the compare-and-swap token.
    pub revision: Revision,
    /// The request holding it; `None` when idle.
    pub active: Option<ActiveAdmission>,
}

/// The request holding an admission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActiveAdmission {
    /// The request.
    pub request_id: RequestId,
    /// What its id is bound to.
    pub input_sha256: InputHash,
    /// The run that owns the admission now.
    pub run_id: RunId,
    /// The agent it was admitted with: a resume with another agent is
    /// refused unless the caller accepts an upgrade.
    pub agent_fingerprint: String,
    /// The latest persisted usage of the request (summary passes included).
    pub usage: Usage,
    /// The request's summary passes: committed, and the one in flight.
    pub summary: SummaryProgress,
}

/// Summary progress of the active request, kept in its admission so the pass
/// limit holds across retries and restarts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SummaryProgress {
    /// Summary passes the request committed.
    pub passes: u32,
    /// A pass recorded before its summary model call and not yet committed.
    pub pending: Option<SummaryPass>,
}

/// One summary pass: which committed entries it summarizes, from which
/// transcript version, with which prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SummaryPass {
    /// The first transcript entry summarized: the previous summary's
    /// `through_seq + 1`, or 0.
    pub from_seq: u64,
    /// The last transcript entry summarized (inclusive).
    pub through_seq: u64,
    /// The conversation version the pass read.
    pub transcript_version: u64,
    /// SHA-256 of the prompt sent to the summary model.
    pub prompt_sha256: [u8; 32],
}

/// A committed summary row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredSummary {
    /// The row id: stable, so a summary recognized after a lost
    /// acknowledgement is the same row.
    pub id: i64,
    /// The conversation summarized.
    pub conversation_id: ConversationId,
    /// The request whose pass made it.
    pub request_id: RequestId,
    /// The first transcript entry it covers.
    pub from_seq: u64,
    /// The last transcript entry it covers (inclusive). Each summary extends
    /// the previous one: it summarizes every entry up to `through_seq`.
    pub through_seq: u64,
    /// The summary text the model sees before the later entries.
    pub content: String,
    /// The conversation version the pass read.
    pub made_from_version: u64,
    /// What the pass cost.
    pub usage: Usage,
    /// Unix milliseconds.
    pub created_at: i64,
}

/// What [`Store::commit_summary`](super::Store::commit_summary) commits.
#[derive(Clone, Debug)]
pub struct SummaryCommit {
    /// The recorded pass this summary answers.
    pub pass: SummaryPass,
    /// The summary text.
    pub content: String,
    /// Usage of this pass's model call; added to the request's usage.
    pub usage: Usage,
}

/// What an owner proves on every write: the admission is still at the
/// revision it claimed, for its run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence {
    /// The conversation owned.
    pub conversation_id: ConversationId,
    /// The request the owner runs.
    pub request_id: RequestId,
    /// The owning run.
    pub run_id: RunId,
    /// The revision it claimed.
    pub revision: Revision,
}

/// A claim of an idle admission by a new request.
#[derive(Clone, Debug)]
pub struct NewRequest {
    /// The conversation to admit the request to.
    pub conversation_id: ConversationId,
    /// The new request's id.
    pub request_id: RequestId,
    /// What the id is bound to: the hash of `input`'s text.
    pub input_sha256: InputHash,
    /// The user message, stored as the request's first message.
    pub input: Message,
    /// The admission's revision read before the claim: the compare-and-swap
    /// token.
    pub expected_revision: Revision,
    /// When set, the conversation must also be the one created at this time
    /// (Unix milliseconds, [`Conversation::created_at`]), or the claim is
    /// refused as a `Conflict` and writes nothing: a conversation deleted
    /// whole (a prune leaves no tombstone) and created again under its id
    /// counts its revisions from 0 again, so a revision read or remembered
    /// before is not enough to tell the two apart.
    pub expected_created_at: Option<i64>,
    /// The first run of the request.
    pub run_id: RunId,
    /// The agent's fingerprint, held with the admission.
    pub agent_fingerprint: String,
    /// The write-ahead of the request's first turn (phase `TurnInFlight`),
    /// saved with the claim when the run goes straight to its first turn:
    /// one commit instead of two.
    pub first_turn: Option<LoopCheckpoint>,
    /// A wall-clock deadline (Unix milliseconds) stored with the request:
    /// every run of it, in any process, stops there.
    pub deadline_at: Option<i64>,
    /// The request's budget, stored with it: every run of it, in any
    /// process, honours it until a continuing run changes it.
    pub budget: Budget,
}

/// The result of [`Store::claim`](super::Store::claim).
// Returned once per claim and matched at once: boxing the record would cost
// an allocation for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum ClaimOutcome {
    /// The admission is ours.
    Admitted(Fence),
    /// The request id is already known; nothing was written.
    Existing(RequestRecord),
}

/// A claim of an active admission by a run that continues another.
#[derive(Clone, Debug)]
pub struct RecoveryClaim {
    /// The conversation held.
    pub conversation_id: ConversationId,
    /// The request continued.
    pub request_id: RequestId,
    /// The admission's revision the caller read.
    pub expected_revision: Revision,
    /// The run being continued: it must be the admission's current run.
    pub from_run: RunId,
    /// The run that continues it.
    pub new_run: RunId,
    /// Refuse with [`Error::AmbiguousCheckpoint`](crate::Error::AmbiguousCheckpoint)
    /// if `from_run`'s latest checkpoint has a turn in flight, checked in
    /// the same transaction as the compare-and-swap.
    pub reject_in_flight: bool,
    /// With `reject_in_flight`: a tool round in flight that the caller
    /// resolved (its call in doubt reconciled, or safe to run again) is not
    /// refused, so long as it is still as the caller read it. A model call
    /// in flight, a round at another turn, or one with another number of
    /// answered calls (the run being continued went on meanwhile) is still
    /// refused.
    pub resolved: Option<ResolvedRound>,
    /// With `reject_in_flight`: a turn whose model call was in flight
    /// ([`CheckpointPhase::TurnInFlight`](crate::checkpoint::CheckpointPhase::TurnInFlight))
    /// is not refused (the model is asked again: a model call has no effect
    /// beyond its cost); a tool round in flight still is, unless resolved.
    pub retry_model_call: bool,
    /// The new run's agent fingerprint when it differs from the one the
    /// admission holds (an explicit upgrade): the admission takes it and the
    /// new run records both. `None` keeps the admission's.
    pub agent_fingerprint: Option<String>,
    /// The request's new budget when the continuing run changes it: the
    /// request takes `to` and the new run records the change. `None` keeps
    /// the request's budget.
    pub budget_change: Option<BudgetChange>,
}

/// A tool round in flight as a recovery read and resolved it
/// ([`RecoveryClaim::resolved`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResolvedRound {
    /// The round's turn.
    pub turn: u32,
    /// How many of its calls were answered (journaled with a result).
    pub answered: u32,
}

/// Lifecycle of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestStatus {
    /// Holds its conversation's admission: running, stopped or waiting.
    Active,
    /// Committed; its answer is kept for replay.
    Completed,
    /// Abandoned: its id is never admitted again.
    Abandoned,
}

stored_names!(RequestStatus {
    Active => "active",
    Completed => "completed",
    Abandoned => "abandoned",
});

/// A request row.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestRecord {
    /// The request.
    pub request_id: RequestId,
    /// The conversation it belongs to.
    pub conversation_id: ConversationId,
    /// What its id is bound to.
    pub input_sha256: InputHash,
    /// Where it stands.
    pub status: RequestStatus,
    /// Set once completed.
    pub outcome: Option<StoredOutcome>,
    /// Unix milliseconds of its admission.
    pub created_at: i64,
    /// Unix milliseconds of its commit or abandonment.
    pub completed_at: Option<i64>,
    /// The wall-clock deadline stored with the request (Unix milliseconds).
    pub deadline_at: Option<i64>,
    /// The budget stored with the request (the latest a continuing run set).
    pub budget: Budget,
}

/// What a new request reads before its claim, as
/// [`Store::claim_context`](crate::store::Store::claim_context) returns it.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimContext {
    /// The conversation, in the namespace asked for; `None` if it does not
    /// exist yet.
    pub conversation: Option<Conversation>,
    /// The request, if its id is known (in any conversation).
    pub request: Option<RequestRecord>,
    /// The conversation's admission; `None` when the conversation does not
    /// exist or the request is known (a known request is answered from its
    /// row, not by a claim).
    pub admission: Option<Admission>,
    /// The last committed entries of the conversation, oldest first, as
    /// many as asked for; none unless a claim would use them (the
    /// conversation exists, the request is unknown, the admission idle).
    pub window: Vec<TranscriptEntry>,
}

/// What a commit keeps for replay: the committing run, the totals of its
/// final checkpoint and where the request's messages are in the transcript
/// (entries `first_seq..end_seq`, the final answer last).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredOutcome {
    /// The run that committed.
    pub run_id: RunId,
    /// The request's usage over all its runs.
    pub usage: Usage,
    /// Its turns, summary passes included.
    pub turns: u32,
    /// Tool calls answered.
    pub tool_calls: u64,
    /// Every verifier report, in order.
    pub verification_reports: Vec<VerificationReport>,
    /// The conversation version the commit produced.
    pub conversation_version: u64,
    /// The request's first transcript entry (its input).
    pub first_seq: u64,
    /// One past its last entry (the answer).
    pub end_seq: u64,
}

/// Lifecycle of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Owns the admission (or did, until its process died).
    Running,
    /// Committed its request.
    Completed,
    /// Stopped with an error; resumable.
    Failed,
    /// Continued by a newer run.
    Superseded,
    /// Stopped when its request was abandoned.
    Abandoned,
}

stored_names!(RunStatus {
    Running => "running",
    Completed => "completed",
    Failed => "failed",
    Superseded => "superseded",
    Abandoned => "abandoned",
});

/// A run row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunRecord {
    /// The run.
    pub run_id: RunId,
    /// The request it runs.
    pub request_id: RequestId,
    /// The run it continues, for a resume or a recovery.
    pub resumed_from: Option<RunId>,
    /// Where it stands.
    pub status: RunStatus,
    /// Why it stopped, for a failed run.
    pub error: Option<String>,
    /// Unix milliseconds.
    pub started_at: i64,
    /// Unix milliseconds; set once it stops.
    pub ended_at: Option<i64>,
    /// Set when the run continued its request with another agent than the
    /// run before it (an explicit upgrade).
    pub agent_change: Option<AgentChange>,
    /// Set when the run changed its request's budget.
    pub budget_change: Option<BudgetChange>,
}

/// The agent fingerprints of a run that continued its request with another
/// agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentChange {
    /// The fingerprint the request was held with before this run.
    pub from: String,
    /// This run's.
    pub to: String,
}

/// A request's budget changed by a resume or recovery that set other
/// limits than the stored ones ([`RunContext::budget`](crate::RunContext::budget)), as the run that
/// changed it records it
/// ([`RunRecord::budget_change`](RunRecord::budget_change)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetChange {
    /// The request's budget before the run.
    pub from: Budget,
    /// Its budget from the run on.
    pub to: Budget,
}

/// One committed message (serialized as `{"seq", "request_id", "message"}`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TranscriptEntry {
    /// Its position in the transcript, from 0.
    pub seq: u64,
    /// The request that added it.
    pub request_id: RequestId,
    /// The message.
    pub message: Message,
}

/// Journal state of one tool call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JournalStatus {
    /// Journaled before the call runs; no result yet.
    Requested,
    /// Answered with a result.
    Completed,
    /// Answered with an error result.
    Failed,
}

stored_names!(JournalStatus {
    Requested => "requested",
    Completed => "completed",
    Failed => "failed",
});

/// One row of the tool-call journal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalEntry {
    /// The request's turn that asked for the call.
    pub turn: u32,
    /// The call's id, as the model gave it.
    pub call_id: String,
    /// The run that journaled the call.
    pub run_id: RunId,
    /// The tool.
    pub name: String,
    /// The raw JSON arguments; `None` once the turn is checkpointed (they are
    /// in the assistant message).
    pub arguments: Option<String>,
    /// Where the call stands.
    pub status: JournalStatus,
    /// Set once completed or failed; `None` again once the turn is
    /// checkpointed (the result is in the tool message).
    pub result: Option<ToolResult>,
}
