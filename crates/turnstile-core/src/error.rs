//! The crate's error type. Every variant names the ids involved; none
//! exposes a database driver type.

use std::fmt;

use crate::ids::{ConversationId, Namespace, RequestId, Revision, RunId};
use crate::message::Usage;
use crate::store::PendingApproval;

/// Everything turnstile can refuse or fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The conversation is held by an active request (possibly this one).
    #[error(
        "conversation {conversation_id} is busy with request {request_id} at revision {revision}"
    )]
    Busy {
        /// The conversation asked for.
        conversation_id: ConversationId,
        /// The request that holds it.
        request_id: RequestId,
        /// The admission's revision now: what a takeover or a delete of the
        /// held conversation names.
        revision: Revision,
    },
    /// The request id is bound to another input or another conversation.
    #[error("request {request_id} does not match: {reason}")]
    RequestMismatch {
        /// The request id given.
        request_id: RequestId,
        /// What differs: the input, or the conversation.
        reason: &'static str,
    },
    /// The request id was abandoned and cannot be used again.
    #[error("request {request_id} was abandoned")]
    RequestAbandoned {
        /// The abandoned request.
        request_id: RequestId,
    },
    /// The request exists but holds no admission (it is not active).
    #[error("request {request_id} is not active")]
    NotActive {
        /// The request that holds no admission.
        request_id: RequestId,
    },
    /// The conversation belongs to another namespace.
    #[error("conversation {conversation_id} is not in namespace {namespace}")]
    NamespaceMismatch {
        /// The conversation asked for.
        conversation_id: ConversationId,
        /// The namespace it was asked for in, which is not its own.
        namespace: Namespace,
    },
    /// Bad caller input; nothing was written.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A conversation, request or run that does not exist (in this namespace).
    #[error("{what} {id} not found")]
    NotFound {
        /// What is missing: `conversation`, `request`, `run`, …
        what: &'static str,
        /// Its id as given.
        id: String,
    },
    /// The run's last checkpoint has a turn in flight: a model or tool call may
    /// have happened after it. Resume with `ResumePolicy::RetryInterruptedTurn`
    /// to re-run the turn without repeating journaled tool calls.
    #[error("run {run_id} stopped with turn {turn} in flight")]
    AmbiguousCheckpoint {
        /// The stopped run.
        run_id: RunId,
        /// The turn in flight at its last checkpoint.
        turn: u32,
    },
    /// This owner was replaced: the admission moved past its revision.
    #[error("run {run_id} was fenced: it owned revision {revision}, which is no longer current")]
    Fenced {
        /// The replaced run.
        run_id: RunId,
        /// The revision it owned.
        revision: Revision,
    },
    /// A compare-and-swap lost: the admission is not at the expected revision.
    /// For a summary pass, `expected` and `actual` are conversation versions:
    /// the transcript (or the summary chain) moved away from what the pass
    /// read, so nothing was written.
    #[error(
        "conflict on conversation {conversation_id}: expected revision {expected}, found {actual}"
    )]
    Conflict {
        /// The conversation whose admission (or transcript) moved.
        conversation_id: ConversationId,
        /// The revision the caller named.
        expected: Revision,
        /// The revision found.
        actual: Revision,
    },

    /// The conversation was deleted: its id and its request ids are
    /// tombstones, never admitted again, and nothing of it is left to
    /// replay.
    #[error("conversation {conversation_id} was deleted")]
    Deleted {
        /// The deleted conversation.
        conversation_id: ConversationId,
    },
    /// The conversation's version (its committed requests) is not the one
    /// the caller expected: a request committed since it looked. Nothing
    /// was written.
    #[error("conversation {conversation_id} is at version {actual}, not the expected {expected}")]
    VersionConflict {
        /// The conversation.
        conversation_id: ConversationId,
        /// The version the caller expected.
        expected: u64,
        /// The version it is at.
        actual: u64,
    },
    /// A compare-and-swap of a conversation's metadata lost: it is not at
    /// the expected `meta_version`. Nothing was written.
    #[error("metadata of conversation {conversation_id} changed: expected meta version {expected}, found {actual}")]
    MetaVersionConflict {
        /// The conversation.
        conversation_id: ConversationId,
        /// The `meta_version` the caller named.
        expected: u64,
        /// The `meta_version` found.
        actual: u64,
    },

    /// The agent differs from the one the request was admitted with.
    #[error("request {request_id} was admitted with another agent configuration")]
    ConfigurationMismatch {
        /// The request, admitted with another agent.
        request_id: RequestId,
    },
    /// A budget ran out; the admission stays held.
    #[error("run {run_id} exceeded its {kind} budget ({used} of {limit}) at revision {revision}")]
    BudgetExceeded {
        /// The stopped run: resume it, or abandon the request.
        run_id: RunId,
        /// The revision to resume it at.
        revision: Revision,
        /// Which budget ran out.
        kind: BudgetKind,
        /// How much of it the request used, across its runs.
        used: u64,
        /// The budget's limit.
        limit: u64,
    },
    /// More transcript entries are waiting to be summarized than the
    /// request's summary passes can absorb: its passes are used up (they are
    /// counted across recoveries). The summaries committed so far are kept;
    /// the admission stays held. Abandon the request; a new request goes on
    /// compacting from the latest summary.
    #[error("run {run_id} used all {max_passes} summary passes with {remaining_entries} entries left to summarize, at revision {revision}")]
    SummaryPassLimitExceeded {
        /// The stopped run.
        run_id: RunId,
        /// The revision the admission is held at.
        revision: Revision,
        /// Entries older than the window not yet summarized.
        remaining_entries: u64,
        /// The request's summary passes ([`MaxPasses`](crate::MaxPasses)).
        max_passes: u32,
    },
    /// The summary model's answer was refused (empty, or larger than
    /// [`MAX_SUMMARY_BYTES`](crate::session::MAX_SUMMARY_BYTES)): nothing was
    /// committed, the pass stays in flight and the admission held.
    #[error("run {run_id} got an unusable summary at revision {revision}: {reason}")]
    InvalidSummary {
        /// The stopped run.
        run_id: RunId,
        /// The revision to resume it at.
        revision: Revision,
        /// Why the answer was refused.
        reason: String,
    },
    /// The run's deadline passed; the admission stays held.
    #[error("run {run_id} passed its deadline at revision {revision}")]
    DeadlineExceeded {
        /// The stopped run.
        run_id: RunId,
        /// The revision to resume it at.
        revision: Revision,
    },
    /// The run stopped to wait for approval of tool calls (every call of the
    /// answer that needed none has run and is journaled). The admission
    /// stays held at `revision`; decide each call with
    /// `AgentSession::approve` / `reject`, then continue the request.
    #[error("run {run_id} awaits approval of {} tool call(s) at revision {revision}: {}", pending.len(), call_list(pending))]
    AwaitingApproval {
        /// The request waiting for decisions.
        request_id: RequestId,
        /// The stopped run.
        run_id: RunId,
        /// The revision a decision must name.
        revision: Revision,
        /// The calls awaiting a decision.
        pending: Vec<PendingApproval>,
    },
    /// A decision for a tool call that is not awaiting one: it was decided
    /// already, it is not a call of the request's current turn, or its result
    /// is journaled. Nothing was written.
    #[error("tool call {call_id:?} of request {request_id} is not awaiting approval")]
    NoPendingApproval {
        /// The request.
        request_id: RequestId,
        /// The tool call's id, as given.
        call_id: String,
    },
    /// The run was cancelled; the admission stays held.
    #[error("run {run_id} was cancelled at revision {revision}")]
    Cancelled {
        /// The stopped run.
        run_id: RunId,
        /// The revision to resume it at.
        revision: Revision,
    },
    /// A tool call's outcome is unknown ([`ToolError::in_doubt`]: its
    /// connection to the service that runs it dropped mid-call, say). The
    /// run stopped with the call unjournaled and its turn in flight; the
    /// admission stays held. A recovery asks the tool first
    /// ([`Tool::reconcile`](crate::Tool::reconcile)); then the resume policy
    /// decides, as after a crash.
    ///
    /// [`ToolError::in_doubt`]: crate::ToolError::in_doubt
    #[error(
        "run {run_id} stopped at revision {revision}: tool call {:?} ({}) of turn {} may or \
         may not have taken effect: {}",
        call.call_id, call.tool, call.turn, call.message
    )]
    ToolInDoubt {
        /// The stopped run.
        run_id: RunId,
        /// The revision to resume it at.
        revision: Revision,
        /// The call, and what its tool said.
        call: Box<CallInDoubt>,
    },
    /// The model failed; the admission stays held.
    #[error("model failed in run {run_id} at revision {revision}: {source}")]
    Model {
        /// The stopped run.
        run_id: RunId,
        /// The revision to resume it at.
        revision: Revision,
        #[source]
        /// What the model answered with (boxed: it is the largest of the
        /// errors).
        source: Box<ModelError>,
    },
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A row could not be decoded.
    #[error("corrupt row in {table} ({key}): {reason}")]
    Corrupt {
        /// The table of the row.
        table: &'static str,
        /// The row's key (its id, or id and turn).
        key: String,
        /// What could not be decoded.
        reason: String,
    },
    /// The database was written by a newer turnstile; it was not modified.
    #[error("database schema version {found} is newer than the supported {supported}")]
    SchemaTooNew {
        /// The database's schema version.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// The database was opened to be read as it is, and its schema is older
    /// than this build's: it was not migrated. Opening it for writing
    /// migrates it.
    #[error("database schema version {found} is older than the supported {supported}; open it for writing to migrate it")]
    SchemaTooOld {
        /// The database's schema version.
        found: i64,
        /// The version this build needs.
        supported: i64,
    },
    /// The database holds the durable steps of a newer turnstile (its schema
    /// is this build's); it was not modified, and this build does not write
    /// to it.
    #[error("database steps version {found} is newer than this build's {supported}; open it with the newer turnstile that wrote it")]
    StepsTooNew {
        /// The step set version the database holds.
        found: i64,
        /// The newest step set this build knows.
        supported: i64,
    },
}

impl Error {
    /// The run id and revision an error of a stopped run carries, if any: what
    /// `resume_run` needs.
    pub fn stopped_run(&self) -> Option<(RunId, Revision)> {
        match self {
            Error::BudgetExceeded {
                run_id, revision, ..
            }
            | Error::DeadlineExceeded { run_id, revision }
            | Error::Cancelled { run_id, revision }
            | Error::ToolInDoubt {
                run_id, revision, ..
            }
            | Error::Model {
                run_id, revision, ..
            }
            | Error::SummaryPassLimitExceeded {
                run_id, revision, ..
            }
            | Error::InvalidSummary {
                run_id, revision, ..
            }
            | Error::AwaitingApproval {
                run_id, revision, ..
            } => Some((*run_id, *revision)),
            _ => None,
        }
    }
}

/// The call of [`Error::ToolInDoubt`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallInDoubt {
    /// The turn of the call.
    pub turn: u32,
    /// The call's id, as the model gave it.
    pub call_id: String,
    /// The call's tool.
    pub tool: String,
    /// What the tool said.
    pub message: String,
}

/// `id (tool), …` for the error line.
fn call_list(pending: &[PendingApproval]) -> String {
    let calls: Vec<String> = pending
        .iter()
        .map(|p| format!("{:?} ({})", p.call_id, p.tool))
        .collect();
    calls.join(", ")
}

/// Which budget ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BudgetKind {
    /// Turns of the request ([`Budget::max_turns`](crate::Budget::max_turns)).
    Turns,
    /// Input plus output tokens ([`Budget::max_tokens`](crate::Budget::max_tokens)).
    Tokens,
    /// Tool calls ([`Budget::max_tool_calls`](crate::Budget::max_tool_calls)).
    ToolCalls,
}

impl fmt::Display for BudgetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BudgetKind::Turns => "turns",
            BudgetKind::Tokens => "tokens",
            BudgetKind::ToolCalls => "tool calls",
        })
    }
}

/// A database failure. The driver's error is kept as the source, as an
/// opaque `dyn Error`; the backend that made it says, with [`Self::busy`],
/// [`Self::full`] and [`Self::unreachable`], whether it was contention, a
/// full database or a server that could not be reached.
#[derive(Debug, thiserror::Error)]
#[error("store error: {message}")]
pub struct StoreError {
    message: String,
    busy: bool,
    full: bool,
    unreachable: bool,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl StoreError {
    /// A failure described by `message`, with the driver's error as its
    /// source when there is one.
    pub fn new(
        message: impl Into<String>,
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self {
            message: message.into(),
            busy: false,
            full: false,
            unreachable: false,
            source,
        }
    }

    /// The same error, marked as contention with another connection.
    pub fn busy(mut self) -> Self {
        self.busy = true;
        self
    }

    /// The same error, marked as a database with no room for the write.
    pub fn full(mut self) -> Self {
        self.full = true;
        self
    }

    /// The same error, marked as a database server that could not be
    /// reached (down, restarting, or the network to it gone) past the
    /// store's own retries. Not contention: it is no longer marked busy.
    pub fn unreachable(mut self) -> Self {
        self.unreachable = true;
        self.busy = false;
        self
    }

    /// Whether another connection held the database longer than the busy
    /// timeout: the same operation may succeed when retried.
    pub fn is_busy(&self) -> bool {
        self.busy
    }

    /// Whether the database server could not be reached. Unlike a busy
    /// database, a step that failed so may have been applied before the
    /// connection was lost (a commit whose answer never came back): a run
    /// stopped by it may have written more than its caller saw.
    pub fn is_unreachable(&self) -> bool {
        self.unreachable
    }

    /// Whether the database had no room for the write: a full disk, or a
    /// size quota such as SQLite's `max_database_bytes`. The failed write
    /// changed nothing; the same operation may succeed once
    /// space is freed (for example with `prune`) or the quota is raised.
    pub fn is_full(&self) -> bool {
        self.full
    }

    /// What failed, in words.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The same error for one more caller (the source does not clone): the
    /// message and what it says about busy and full, without the source.
    pub fn replicate(&self) -> Self {
        Self {
            message: self.message.clone(),
            busy: self.busy,
            full: self.full,
            unreachable: self.unreachable,
            source: None,
        }
    }
}

/// A model call failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ModelError {
    /// What went wrong.
    pub message: String,
    /// Whether the same call may succeed later (rate limit, 5xx, timeout).
    pub retryable: bool,
    /// The HTTP status the provider answered, when it answered one
    /// (`Some(401)` for a refused key, `Some(429)` for a rate limit).
    pub status: Option<u16>,
    /// The tokens an answer that was discarded spent (one cut off at the
    /// output limit, or filtered), as the provider reported them: the run's
    /// usage counts them, and so does its token budget.
    pub usage: Usage,
}

impl ModelError {
    /// A failure that will not go away by retrying.
    pub fn fatal(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: false,
            status: None,
            usage: Usage::default(),
        }
    }

    /// A failure that may pass on retry.
    pub fn retryable(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: true,
            status: None,
            usage: Usage::default(),
        }
    }

    /// This error with the HTTP status the provider answered.
    pub fn with_status(mut self, status: u16) -> Self {
        self.status = Some(status);
        self
    }

    /// This error with the usage of the answer it discarded.
    pub fn with_usage(mut self, usage: Usage) -> Self {
        self.usage = usage;
        self
    }
}
