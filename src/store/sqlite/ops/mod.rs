//! Operations on a SQLite database, for people and scripts: listings
//! (`ls`, `show`), retention (`prune`) and health checks (`doctor`).
//!
//! These are SQLite operations, not part of the backend-neutral
//! [`Store`](crate::store::Store) contract: inherent methods of
//! [`SqliteStore`](super::SqliteStore), returning the small records below.
//!
//! # Stuck admissions
//! The database cannot know whether the process running a run is alive. An
//! admission is **stuck** when it is held by a run that is not live as far as
//! the rows can tell: the run's status is `failed` (it stopped and nobody
//! resumed it), or it is `running` but the admission has not changed for
//! [`ListFilter::stale_after`] (every claim, turn write and checkpoint of the
//! owner touches it). A live run inside one model or tool call longer than
//! `stale_after` therefore looks stuck too: choose it above your longest
//! step. An admission naming a run with no row, or a run in a final status,
//! is stuck whatever its age.

mod doctor;
mod list;
mod prune;

use std::time::Duration;

use serde::Serialize;

use super::codec::now_ms;
use crate::checkpoint::CheckpointPhase;
use crate::ids::{ConversationId, Namespace, RequestId, Revision, RunId};
use crate::store::{RequestStatus, RunStatus};

pub use doctor::DoctorReport;
pub use prune::{PruneOptions, PruneReport, TableCounts};

/// Where a run stands: its latest checkpoint row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CheckpointMark {
    pub turn: u32,
    pub phase: CheckpointPhase,
    /// Unix milliseconds.
    pub created_at: i64,
}

/// An admission held by an active request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HeldAdmission {
    pub conversation_id: ConversationId,
    /// The compare-and-swap token `resume`, `recover` and `abandon` need.
    pub revision: Revision,
    pub request_id: RequestId,
    /// The run that owns the admission.
    pub run_id: RunId,
    /// `None` when the admission names a run that has no row.
    pub run_status: Option<RunStatus>,
    /// Unix milliseconds of the admission's last change (claim, fenced write,
    /// checkpoint).
    pub updated_at: i64,
    /// The owning run's latest checkpoint.
    pub last_checkpoint: Option<CheckpointMark>,
    /// Held by a run that is not live (see the module docs).
    pub stuck: bool,
}

/// A conversation: its header, admission and transcript length.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ConversationSummary {
    pub id: ConversationId,
    pub namespace: Namespace,
    /// Number of committed requests.
    pub version: u64,
    /// The admission's revision.
    pub revision: Revision,
    /// Committed messages (the transcript's next `seq`).
    pub transcript_entries: u64,
    /// Unix milliseconds.
    pub created_at: i64,
    /// Unix milliseconds of the admission's last change: the last claim,
    /// turn write, commit or abandon.
    pub last_activity_at: i64,
    /// The active request holding the conversation, if any.
    pub held: Option<HeldAdmission>,
}

/// A request: its status, its latest run and where that run stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RequestSummary {
    pub request_id: RequestId,
    pub conversation_id: ConversationId,
    pub namespace: Namespace,
    pub status: RequestStatus,
    /// The conversation version its commit produced (completed requests).
    pub conversation_version: Option<u64>,
    /// How many runs it took (resumes and recoveries add one each).
    pub runs: u64,
    /// The committing run, the admission's owner, or the newest run.
    pub latest_run: Option<RunId>,
    pub latest_run_status: Option<RunStatus>,
    /// The latest checkpoint of `latest_run`.
    pub last_checkpoint: Option<CheckpointMark>,
    /// Unix milliseconds.
    pub created_at: i64,
    /// Unix milliseconds of the commit or abandon.
    pub completed_at: Option<i64>,
    /// The admission, while this request holds it.
    pub held: Option<HeldAdmission>,
}

/// A run: one execution attempt of a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RunSummary {
    pub run_id: RunId,
    pub request_id: RequestId,
    pub conversation_id: ConversationId,
    pub namespace: Namespace,
    /// The run it continues.
    pub resumed_from: Option<RunId>,
    pub status: RunStatus,
    /// Why it stopped.
    pub error: Option<String>,
    /// Number of checkpoint rows (one per turn that started).
    pub checkpoints: u64,
    pub last_checkpoint: Option<CheckpointMark>,
    /// Unix milliseconds.
    pub started_at: i64,
    pub ended_at: Option<i64>,
    /// The admission, while this run owns it.
    pub held: Option<HeldAdmission>,
}

/// Which rows a listing returns. Listings are newest first.
#[derive(Clone, Debug)]
pub struct ListFilter {
    pub namespace: Option<Namespace>,
    pub conversation_id: Option<ConversationId>,
    /// Only what stuck admissions hold: the conversations, their active
    /// requests, their owning runs (stalest first).
    pub stuck_only: bool,
    /// How long a `running` owner may leave its admission unchanged before it
    /// counts as stuck.
    pub stale_after: Duration,
    /// At most this many rows.
    pub limit: u32,
}

impl Default for ListFilter {
    fn default() -> Self {
        Self {
            namespace: None,
            conversation_id: None,
            stuck_only: false,
            stale_after: Duration::from_secs(300),
            limit: 50,
        }
    }
}

/// Unix milliseconds `age` ago.
fn cutoff(age: Duration) -> i64 {
    now_ms().saturating_sub(i64::try_from(age.as_millis()).unwrap_or(i64::MAX))
}

/// Whether an admission held by a run of `status`, last changed at
/// `updated_at`, is stuck. The SQL of `stuck_keys` says the same.
fn is_stuck(status: Option<RunStatus>, updated_at: i64, cutoff: i64) -> bool {
    match status {
        Some(RunStatus::Running) => updated_at < cutoff,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_or_unknown_owners_are_stuck_and_running_ones_only_when_stale() {
        assert!(is_stuck(Some(RunStatus::Failed), 1_000, 0));
        assert!(is_stuck(None, 1_000, 0));
        assert!(!is_stuck(Some(RunStatus::Running), 1_000, 1_000));
        assert!(is_stuck(Some(RunStatus::Running), 999, 1_000));
    }
}
