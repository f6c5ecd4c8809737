//! The store contract: every durable operation the session layer needs, each
//! one transaction, each ownership change a compare-and-swap on the
//! admission's revision, each write of a run's owner fenced by it.
//!
//! Backends live in crates of their own (`turnstile-sqlite`, the embedded
//! default); the `turnstile-conformance` suite holds each of them to the
//! same contract.

mod approvals;
mod claim_memory;
mod deletion;
mod event_log;
mod leases;
mod limits;
pub mod meta;
mod records;

use async_trait::async_trait;

/// Re-exported: the contract journals tool results.
pub use crate::message::ToolResult;
pub use approvals::{
    ApprovalDecision, ApprovalRecord, ApprovalStatus, PendingApproval, Verdict,
    MAX_REJECTION_REASON_BYTES,
};
pub use claim_memory::{ClaimMemory, Recalled};
pub use deletion::{DeleteReport, ForkOutcome};
pub use event_log::{LoggedEvent, LoggedStep};
pub use leases::ExpiredLease;
pub use limits::PartLimits;
pub use meta::{ConversationCursor, ConversationMeta, MetaUpdate, Metadata};
pub use records::{
    ActiveAdmission, Admission, AgentChange, BudgetChange, ClaimContext, ClaimOutcome,
    Conversation, Fence, InputHash, JournalEntry, JournalStatus, NewRequest, RecoveryClaim,
    RequestRecord, RequestStatus, ResolvedRound, RunRecord, RunStatus, StoredOutcome,
    StoredSummary, SummaryCommit, SummaryPass, SummaryProgress, TranscriptEntry,
};

use crate::checkpoint::LoopCheckpoint;
use crate::error::Error;
use crate::ids::{ConversationId, Namespace, RequestId, Revision, RunId};
use crate::message::{BlobHash, Message, Usage};

/// The durable operations of turnstile. Object-safe: use it as
/// `Arc<dyn Store>`.
///
/// # Cancel safety
/// Every method is one transaction: dropping its future either leaves the
/// transaction uncommitted (rolled back) or lets it finish whole.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Creates the conversation with its idle admission, or loads it if it
    /// exists in `namespace`. [`Error::NamespaceMismatch`] if it exists in
    /// another namespace.
    async fn ensure_conversation(
        &self,
        namespace: &Namespace,
        id: ConversationId,
    ) -> Result<Conversation, Error>;

    /// Loads a conversation of `namespace`: [`Error::NotFound`] if it does not
    /// exist, [`Error::NamespaceMismatch`] if it belongs to another namespace.
    async fn conversation(
        &self,
        namespace: &Namespace,
        id: ConversationId,
    ) -> Result<Conversation, Error>;

    /// The admission row of a conversation.
    async fn admission(&self, conversation_id: ConversationId) -> Result<Admission, Error>;

    /// What a new request reads before its claim: the conversation in
    /// `namespace`, the request `request_id` (in any conversation), the
    /// conversation's admission and, when `window` is given, its last
    /// `window` committed entries (as [`Store::transcript_window`]). Only
    /// what a claim would use is decoded: no admission when the request id
    /// is known, no entries unless the admission is idle (so a damaged
    /// entry refuses no replay and hides no `Busy`).
    /// A backend that can should read everything in one query, a
    /// consistent snapshot; the default reads with the methods above, in
    /// two rounds of reads made at once.
    ///
    /// # Errors
    /// [`Error::NamespaceMismatch`] if the conversation belongs to another
    /// namespace, whatever the request: a replay must not cross it.
    /// [`Error::Deleted`] if the request id is one of a deleted
    /// conversation's and `conversation_id` does not exist yet, so that a
    /// session refuses the request before it creates the conversation (the
    /// default implementation cannot tell: a backend that keeps tombstones
    /// overrides it).
    async fn claim_context(
        &self,
        namespace: &Namespace,
        conversation_id: ConversationId,
        request_id: RequestId,
        window: Option<u32>,
    ) -> Result<ClaimContext, Error> {
        let (conversation, request) = tokio::join!(
            self.conversation(namespace, conversation_id),
            self.request(request_id)
        );
        let conversation = match conversation {
            Ok(conversation) => Some(conversation),
            Err(Error::NotFound { .. }) => None,
            Err(e) => return Err(e),
        };
        let request = request?;
        if conversation.is_none() || request.is_some() {
            return Ok(ClaimContext {
                conversation,
                request,
                admission: None,
                window: Vec::new(),
            });
        }
        let (admission, entries) = tokio::join!(self.admission(conversation_id), async {
            match window {
                Some(limit) => self.transcript_window(conversation_id, limit).await,
                None => Ok(Vec::new()),
            }
        });
        let admission = admission?;
        let window = match admission.active {
            None => entries?,
            Some(_) => Vec::new(),
        };
        Ok(ClaimContext {
            conversation,
            request,
            admission: Some(admission),
            window,
        })
    }

    /// What this store remembers of conversations after their commits, so
    /// that a conversation's next request can claim without reading first
    /// (see [`ClaimMemory`]); `None`, the
    /// default, when it remembers nothing and every claim reads first.
    fn claim_memory(&self) -> Option<&ClaimMemory> {
        None
    }

    /// Claims an idle admission at `expected_revision` for a new request:
    /// records the request, its first run and the user input as its first
    /// message. A run has no checkpoint until its first turn starts.
    async fn claim(&self, claim: &NewRequest) -> Result<ClaimOutcome, Error>;

    /// Moves an active admission to a new run that continues `from_run`, at
    /// `expected_revision`. The new run starts with a copy of `from_run`'s
    /// latest checkpoint (if it has one); `from_run` is marked superseded.
    async fn claim_recovery(&self, claim: &RecoveryClaim) -> Result<Fence, Error>;

    /// A request by id, in any conversation.
    async fn request(&self, request_id: RequestId) -> Result<Option<RequestRecord>, Error>;

    /// A run by id: `None` when it is unknown (never written, or pruned).
    ///
    /// # Errors
    /// [`Error::Deleted`] for a run of a deleted conversation (its run ids
    /// stay as tombstones, like its request ids).
    async fn run(&self, run_id: RunId) -> Result<Option<RunRecord>, Error>;

    /// Write-ahead record of a turn (phase `TurnInFlight`), or of a turn's
    /// tool round that goes on after a settled stop (`ToolsInFlight`).
    async fn begin_turn(&self, fence: &Fence, checkpoint: &LoopCheckpoint) -> Result<(), Error>;

    /// Records the model's answer for the turn at `checkpoint.message_count`,
    /// journals its tool calls as requested and moves the checkpoint to
    /// `ToolsInFlight` with `checkpoint.usage`.
    async fn record_model_response(
        &self,
        fence: &Fence,
        checkpoint: &LoopCheckpoint,
        assistant: &Message,
    ) -> Result<(), Error>;

    /// Journals the result of one tool call.
    async fn record_tool_result(
        &self,
        fence: &Fence,
        turn: u32,
        call_id: &str,
        result: &ToolResult,
    ) -> Result<(), Error>;

    /// Completes a turn: appends `messages` after the turn's assistant message
    /// and saves the `Ready` checkpoint, then, in the same transaction, the
    /// `next` turn's write-ahead (phase `TurnInFlight`) when the loop goes on:
    /// one commit instead of two.
    async fn finish_turn(
        &self,
        fence: &Fence,
        checkpoint: &LoopCheckpoint,
        messages: &[Message],
        next: Option<&LoopCheckpoint>,
    ) -> Result<(), Error>;

    /// Commits a request in one transaction: appends `final_message` and moves
    /// all the request's messages to the transcript, bumps the conversation
    /// version, stores the outcome, releases the admission and completes the
    /// run. Returns the stored outcome.
    async fn commit(
        &self,
        fence: &Fence,
        checkpoint: &LoopCheckpoint,
        final_message: &Message,
    ) -> Result<StoredOutcome, Error>;

    /// Records why a run stopped, and saves `settled` (the turn's checkpoint
    /// in a pending phase) when the run knows nothing was left in flight.
    /// The admission stays held.
    async fn fail_run(
        &self,
        fence: &Fence,
        error: &str,
        settled: Option<&LoopCheckpoint>,
    ) -> Result<(), Error>;

    /// Releases the admission without committing; the request id is burned.
    async fn abandon(
        &self,
        conversation_id: ConversationId,
        request_id: RequestId,
        expected_revision: Revision,
    ) -> Result<Revision, Error>;

    /// The last `limit` committed messages of a conversation, oldest first.
    async fn transcript_window(
        &self,
        conversation_id: ConversationId,
        limit: u32,
    ) -> Result<Vec<TranscriptEntry>, Error>;

    /// Committed messages with `from <= seq < to`, oldest first.
    async fn transcript_range(
        &self,
        conversation_id: ConversationId,
        from: u64,
        to: u64,
    ) -> Result<Vec<TranscriptEntry>, Error>;

    /// The events of a conversation's log numbered after `after`, oldest
    /// first, at most `limit` (see [`LoggedEvent`]). Each was written in
    /// the transaction of the step it reports; the events of a pruned
    /// request are removed with it, and a deleted conversation's with it.
    ///
    /// # Errors
    /// When there is no event to return and the conversation does not
    /// exist: [`Error::Deleted`] for a deleted one, [`Error::NotFound`]
    /// otherwise (so a follower hears that the conversation is gone).
    async fn events_after(
        &self,
        conversation_id: ConversationId,
        after: u64,
        limit: u32,
    ) -> Result<Vec<LoggedEvent>, Error>;

    /// The latest loop checkpoint of a run.
    async fn latest_checkpoint(&self, run_id: RunId) -> Result<Option<LoopCheckpoint>, Error>;

    /// Every loop checkpoint of a run, by turn.
    async fn checkpoints(&self, run_id: RunId) -> Result<Vec<LoopCheckpoint>, Error>;

    /// The bytes of an image or file part, by their SHA-256; `None` if no
    /// message of this store holds them. A message read back holds its
    /// attachments' references only: this is what loads their bytes.
    async fn blob(&self, sha256: BlobHash) -> Result<Option<std::sync::Arc<[u8]>>, Error>;

    /// The first `count` pending messages of an uncommitted request.
    async fn request_messages(
        &self,
        request_id: RequestId,
        count: u64,
    ) -> Result<Vec<Message>, Error>;

    /// The tool-call journal of one turn of a request.
    async fn journal(&self, request_id: RequestId, turn: u32) -> Result<Vec<JournalEntry>, Error>;

    /// The latest persisted usage of an active request. [`Error::NotActive`]
    /// if it holds no admission.
    async fn recovery_usage(&self, request_id: RequestId) -> Result<Usage, Error>;

    /// The summary with the highest `through_seq` of a conversation: it
    /// summarizes every entry up to there.
    async fn latest_summary(
        &self,
        conversation_id: ConversationId,
    ) -> Result<Option<StoredSummary>, Error>;

    /// Records a summary pass in the admission before its model call, fenced
    /// by the owner's revision. The pass must start right after the latest
    /// summary and read the current conversation version, and no other pass
    /// may be in flight ([`Error::Conflict`] otherwise; recording the pass
    /// already in flight again is a no-op).
    async fn record_summary_pass(&self, fence: &Fence, pass: &SummaryPass) -> Result<(), Error>;

    /// Commits the summary of the pass in flight in one transaction, fenced:
    /// inserts the summary row, counts the pass, adds its usage to the
    /// request's, and clears the pass in flight. Idempotent: a summary this
    /// request already committed for the same range is returned as it is
    /// (same row), nothing is written. A pass that is not the one in flight,
    /// or a transcript that moved past its version, is [`Error::Conflict`].
    async fn commit_summary(
        &self,
        fence: &Fence,
        summary: &SummaryCommit,
    ) -> Result<StoredSummary, Error>;

    /// Stops a run to wait for approval of tool calls of its turn's recorded
    /// answer, in one transaction, fenced: journals each of `call_ids` as
    /// awaiting approval (a call with an approval row already keeps it),
    /// saves `settled` (phase `ToolsPending`) and marks the run stopped with
    /// `reason`. The admission stays held at its revision. Returns the calls
    /// as [`Store::pending_approvals`] lists them, in the order of
    /// `call_ids`.
    async fn await_approval(
        &self,
        fence: &Fence,
        settled: &LoopCheckpoint,
        call_ids: &[String],
        reason: &str,
    ) -> Result<Vec<PendingApproval>, Error>;

    /// The approval rows of one turn of a request.
    async fn approvals(
        &self,
        request_id: RequestId,
        turn: u32,
    ) -> Result<Vec<ApprovalRecord>, Error>;

    /// Tool calls awaiting a decision, of one conversation or of all: only
    /// calls of requests that still hold their admission and whose result
    /// is not journaled. Oldest first.
    async fn pending_approvals(
        &self,
        conversation_id: Option<ConversationId>,
    ) -> Result<Vec<PendingApproval>, Error>;

    /// Decides one awaiting tool call: one compare-and-swap on the
    /// admission's revision, which it bumps (fencing any run of the request
    /// still alive), with the decision and its time journaled. Returns the
    /// new revision.
    ///
    /// # Errors
    /// [`Error::NotActive`] when the request holds no admission,
    /// [`Error::Conflict`] for a stale revision, [`Error::Busy`] (at the
    /// expected revision) while a run of the request goes on, that is while
    /// the run holding the admission has not stopped (a decision must not
    /// fence a run executing calls decided before it),
    /// [`Error::NoPendingApproval`] when the call is not awaiting a decision
    /// (decided already, unknown, or answered). Nothing is written.
    async fn decide_approval(&self, decision: &ApprovalDecision) -> Result<Revision, Error>;

    /// Deletes a conversation in one transaction: its transcript, requests,
    /// runs, checkpoints, verification reports, tool-call journal,
    /// approvals, pending messages, summaries and admission. Its id, its
    /// request ids and its run ids stay as tombstones:
    /// [`Store::ensure_conversation`], a claim of one of those request ids
    /// and [`Store::run`] of one of those run ids answer [`Error::Deleted`], and
    /// every fenced write of an owner still running answers
    /// [`Error::Fenced`] and re-creates nothing. Then gives the space back
    /// (as `prune` does).
    ///
    /// # Errors
    /// [`Error::VersionConflict`] when the conversation's version is not
    /// `expected_version`; [`Error::Busy`] while a request holds the
    /// admission, unless `active_revision` is the admission's current
    /// revision (the caller owns, or takes over, that request);
    /// [`Error::NotFound`], [`Error::NamespaceMismatch`] as usual;
    /// [`Error::Deleted`] when it was deleted already. Nothing is written
    /// on any refusal.
    async fn delete_conversation(
        &self,
        namespace: &Namespace,
        id: ConversationId,
        expected_version: u64,
        active_revision: Option<Revision>,
    ) -> Result<DeleteReport, Error>;

    /// Creates `new_id` in `namespace` (idle admission) whose committed
    /// history is the first `through_seq` transcript entries of `from`,
    /// with a copy of the latest summary of `from` that covers no more than
    /// those entries. `from` is not changed, and may be busy: only its
    /// committed history is read. The fork's version is the number of
    /// requests whose entries it copied. One transaction.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for `through_seq` 0 or past the transcript,
    /// a cut between an assistant message with tool calls and its tool
    /// results, or a `new_id` that exists; [`Error::Deleted`] when `from`
    /// or `new_id` is a deleted conversation; [`Error::NotFound`],
    /// [`Error::NamespaceMismatch`] for `from`. Nothing is written on any
    /// refusal.
    async fn fork_conversation(
        &self,
        namespace: &Namespace,
        from: ConversationId,
        through_seq: u64,
        new_id: ConversationId,
    ) -> Result<ForkOutcome, Error>;

    /// Renews the lease of the admission `fence` owns: it expires at
    /// `expires_at` (Unix milliseconds). One fenced UPDATE that moves
    /// neither the revision nor the activity time. A lease is dropped by
    /// every change of owner (claim, recovery claim, commit, abandon,
    /// approval decision): the new owner takes its own with its first
    /// renewal.
    ///
    /// # Errors
    /// [`Error::Fenced`] when the admission moved on (another revision or
    /// run, or released). Nothing is written.
    async fn renew_lease(&self, fence: &Fence, expires_at: i64) -> Result<(), Error>;

    /// Held admissions whose lease has expired and whose owning run is
    /// still `running` (a run that stopped, failed or awaits approval is
    /// not taken over by a lease), soonest expired first, at most `limit`.
    /// An admission without a lease is never listed. "Expired" is read on
    /// the store's own clock: the Unix milliseconds of
    /// [`backend::now_ms`](crate::backend::now_ms), the clock lease times
    /// are written with ([`AgentSession::with_lease`](crate::AgentSession::with_lease)),
    /// so the caller passes no time. PostgreSQL skips rows locked by a
    /// takeover in progress (`FOR UPDATE SKIP LOCKED`), so concurrent
    /// recoverers spread over different rows.
    async fn expired_leases(&self, limit: u32) -> Result<Vec<ExpiredLease>, Error>;

    /// The metadata of a conversation of `namespace`: [`Error::NotFound`]
    /// if it does not exist, [`Error::NamespaceMismatch`] if it belongs to
    /// another namespace.
    async fn conversation_meta(
        &self,
        namespace: &Namespace,
        id: ConversationId,
    ) -> Result<ConversationMeta, Error>;

    /// Changes a conversation's metadata in one transaction: a
    /// compare-and-swap on its `meta_version`, which it moves on by one
    /// (the admission and its revision are untouched). With
    /// `expected_meta_version` 0 a conversation that does not exist is
    /// created first, with its idle admission (as
    /// [`Store::ensure_conversation`]): metadata set at creation. Returns
    /// the metadata as stored.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for an update or a result out of the bounds
    /// of [`meta`]; [`Error::MetaVersionConflict`] for a stale version;
    /// [`Error::NotFound`] / [`Error::NamespaceMismatch`] as
    /// [`Store::conversation_meta`]. Nothing is written.
    async fn set_conversation_meta(
        &self,
        namespace: &Namespace,
        id: ConversationId,
        expected_meta_version: u64,
        update: &MetaUpdate,
    ) -> Result<ConversationMeta, Error>;
}
