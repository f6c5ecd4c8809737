//! The operations contract, [`StoreAdmin`]: what people and scripts need to
//! look at and look after a store on any backend. Listings (`ls`, `show`),
//! retention (`prune`), health (`doctor`) and storage figures, as the small
//! records below. The `turnstile-conformance` suite holds every backend to
//! it.
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
//!
//! A `running` owner that holds a lease (`AgentSession::with_lease`) is
//! judged by the lease instead: stuck once the lease expired, whatever its
//! activity time; `stale_after` does not apply to it.
//!
//! A request whose tool calls await a decision ([`Store::await_approval`])
//! is not stuck, though its stopped run holds the admission: it waits for
//! a person to approve or reject. It is marked
//! [`awaiting_approval`](HeldAdmission::awaiting_approval), left out of
//! [`ListFilter::stuck_only`] listings and counted apart
//! ([`DoctorReport::awaiting_approval_admissions`]). Once every call is
//! decided it awaits nothing, and its stopped run is stuck until a run
//! continues it.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;

use crate::checkpoint::CheckpointPhase;
use crate::error::Error;
use crate::ids::{ConversationId, Namespace, RequestId, Revision, RunId};
use crate::store::meta::{check_filter_value, check_owner};
use crate::store::{ConversationCursor, ConversationMeta, RequestStatus, RunStatus, Store};

mod retention;
mod tokens;

pub use retention::{Retention, RetentionOutcome, RetentionPolicy, RetentionReport};
pub use tokens::{new_token, token_sha256, IssuedToken, NewToken, TokenRecord, TOKEN_PREFIX};

/// The operations on a store, for people and scripts: every command of the
/// `turnstile` tool works on a backend that implements it.
///
/// # Cancel safety
/// Reads are one read transaction each. [`StoreAdmin::prune`] works in
/// batches of one write transaction each: dropping its future leaves every
/// batch deleted whole or not at all.
#[async_trait]
pub trait StoreAdmin: Store {
    /// Conversations, newest first by `(created_at, id)`: header,
    /// admission, transcript length, metadata; one page of at most
    /// `filter.limit`, and the cursor of the next page when there is one
    /// (see [`ListFilter::after`]). With `stuck_only` or `conversation_id`
    /// the conversations are those, filtered, and there is no next page.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a bad owner or metadata filter;
    /// [`Error::Store`] if the database fails; [`Error::Corrupt`] for an
    /// undecodable row.
    async fn list_conversations(&self, filter: &ListFilter) -> Result<ConversationPage, Error>;

    /// One conversation, or `None` if it does not exist. `stale_after` as in
    /// [`ListFilter::stale_after`].
    ///
    /// # Errors
    /// As [`StoreAdmin::list_conversations`].
    async fn conversation_summary(
        &self,
        id: ConversationId,
        stale_after: Duration,
    ) -> Result<Option<ConversationSummary>, Error>;

    /// Requests, newest first: status, runs, where the latest run stands.
    ///
    /// # Errors
    /// As [`StoreAdmin::list_conversations`].
    async fn list_requests(&self, filter: &ListFilter) -> Result<Vec<RequestSummary>, Error>;

    /// Runs, newest first (stuck ones stalest first).
    ///
    /// # Errors
    /// As [`StoreAdmin::list_conversations`].
    async fn list_runs(&self, filter: &ListFilter) -> Result<Vec<RunSummary>, Error>;

    /// One run, or `None` if it does not exist.
    ///
    /// # Errors
    /// As [`StoreAdmin::list_conversations`].
    async fn run_summary(
        &self,
        run_id: RunId,
        stale_after: Duration,
    ) -> Result<Option<RunSummary>, Error>;

    /// Deletes what no replay needs from requests finished before
    /// `now - older_than` (see [`PruneOptions`]), optionally whole idle
    /// conversations, then gives the space back.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for `status: Some(Active)`; [`Error::Store`]
    /// if the database fails (batches already committed stay committed).
    async fn prune(&self, options: &PruneOptions) -> Result<PruneReport, Error>;

    /// Applies a [`RetentionPolicy`]: idle conversations first, then
    /// completed and abandoned requests, each as one [`StoreAdmin::prune`]
    /// pass (batches of one write transaction each, active requests never
    /// touched, what a replay needs kept). [`Retention::spawn`] runs it on
    /// a timer.
    ///
    /// # Errors
    /// As [`StoreAdmin::prune`]; the passes before a failing one stay done.
    async fn apply_retention(&self, policy: &RetentionPolicy) -> Result<RetentionReport, Error> {
        let mut passes = Vec::new();
        for options in policy.passes() {
            passes.push(self.prune(&options).await?);
        }
        Ok(RetentionReport { passes })
    }

    /// Checks the open database without changing it: integrity, schema
    /// version, sizes, held and stuck admissions.
    ///
    /// # Errors
    /// [`Error::Store`] only if no check could start; a check that fails or
    /// cannot run is in the report.
    async fn doctor(&self, stale_after: Duration) -> Result<DoctorReport, Error>;

    /// What the store occupies now.
    ///
    /// # Errors
    /// [`Error::Store`] if the database fails.
    async fn storage(&self) -> Result<StorageReport, Error>;

    /// Waits for the writes in progress, makes the database complete on its
    /// own (SQLite: folds the write-ahead log into the file) and releases
    /// the connections. Every clone of the store is closed with it: use
    /// none afterwards.
    ///
    /// # Errors
    /// [`Error::Store`] if the last step could not finish (SQLite: another
    /// process was reading, so the log was not folded whole). Nothing
    /// committed is lost either way.
    async fn close(&self) -> Result<(), Error>;

    /// Stores an access token (see [`new_token`]).
    ///
    /// # Errors
    /// [`Error::Store`] if the database fails.
    async fn store_token(&self, token: &NewToken) -> Result<(), Error>;

    /// The namespace of the token whose secret has this SHA-256, unless it
    /// is unknown or revoked.
    ///
    /// # Errors
    /// [`Error::Store`] if the database fails; [`Error::Corrupt`] for an
    /// undecodable row.
    async fn token_namespace(&self, sha256: &[u8; 32]) -> Result<Option<Namespace>, Error>;

    /// Revokes a token: it admits nothing from now on. `false` when no
    /// token has this id or it was revoked already.
    ///
    /// # Errors
    /// [`Error::Store`] if the database fails.
    async fn revoke_token(&self, id: uuid::Uuid) -> Result<bool, Error>;

    /// Every token, oldest first, without secrets.
    ///
    /// # Errors
    /// [`Error::Store`] if the database fails; [`Error::Corrupt`] for an
    /// undecodable row.
    async fn tokens(&self) -> Result<Vec<TokenRecord>, Error>;

    /// Issues a token for `namespace`: stores its SHA-256 and returns the
    /// secret, which is not kept anywhere else.
    ///
    /// # Errors
    /// As [`StoreAdmin::store_token`].
    async fn create_token(&self, namespace: &Namespace) -> Result<IssuedToken, Error> {
        let (issued, stored) = new_token(namespace, crate::backend::now_ms());
        self.store_token(&stored).await?;
        Ok(issued)
    }
}

/// Where a run stands: its latest checkpoint row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CheckpointMark {
    /// The turn it was saved for.
    pub turn: u32,
    /// Where that turn stands: settled, or with a call in flight.
    pub phase: CheckpointPhase,
    /// Unix milliseconds.
    pub created_at: i64,
}

/// An admission held by an active request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HeldAdmission {
    /// The conversation held.
    pub conversation_id: ConversationId,
    /// The compare-and-swap token `resume`, `recover` and `abandon` need.
    pub revision: Revision,
    /// The request holding it.
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
    /// Held by a run that is not live (see the module docs); never while
    /// the request awaits approval.
    pub stuck: bool,
    /// The request has tool calls awaiting a decision (approve or reject):
    /// held on purpose, not stuck.
    pub awaiting_approval: bool,
    /// Unix milliseconds at which the owner's lease expires, when it holds
    /// one: then `stuck` follows the lease, not `updated_at`.
    pub lease_expires_at: Option<i64>,
}

/// A conversation: its header, admission and transcript length.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ConversationSummary {
    /// The conversation (serialized as `conversation_id`, the name every
    /// other summary gives it).
    #[serde(rename = "conversation_id")]
    pub id: ConversationId,
    /// The namespace it belongs to.
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
    /// Title, owner and metadata.
    pub meta: ConversationMeta,
}

/// One page of [`StoreAdmin::list_conversations`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ConversationPage {
    /// The conversations of this page, newest first.
    pub conversations: Vec<ConversationSummary>,
    /// Where the next page starts (give it as [`ListFilter::after`]);
    /// `None` on the last page.
    pub next: Option<ConversationCursor>,
}

/// A request: its status, its latest run and where that run stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RequestSummary {
    /// The request.
    pub request_id: RequestId,
    /// The conversation it belongs to.
    pub conversation_id: ConversationId,
    /// That conversation's namespace.
    pub namespace: Namespace,
    /// Where the request stands.
    pub status: RequestStatus,
    /// The conversation version its commit produced (completed requests).
    pub conversation_version: Option<u64>,
    /// How many runs it took (resumes and recoveries add one each).
    pub runs: u64,
    /// The committing run, the admission's owner, or the newest run.
    pub latest_run: Option<RunId>,
    /// Where `latest_run` stands.
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
    /// The run.
    pub run_id: RunId,
    /// The request it runs.
    pub request_id: RequestId,
    /// The request's conversation.
    pub conversation_id: ConversationId,
    /// That conversation's namespace.
    pub namespace: Namespace,
    /// The run it continues.
    pub resumed_from: Option<RunId>,
    /// Where it stands.
    pub status: RunStatus,
    /// Why it stopped.
    pub error: Option<String>,
    /// Number of checkpoint rows (one per turn that started).
    pub checkpoints: u64,
    /// Its latest checkpoint.
    pub last_checkpoint: Option<CheckpointMark>,
    /// Unix milliseconds.
    pub started_at: i64,
    /// Unix milliseconds; set once it stops.
    pub ended_at: Option<i64>,
    /// The admission, while this run owns it.
    pub held: Option<HeldAdmission>,
}

/// Which rows a listing returns. Listings are newest first.
#[derive(Clone, Debug)]
pub struct ListFilter {
    /// Only this namespace; `None` lists every namespace.
    pub namespace: Option<Namespace>,
    /// Only this conversation (its requests and runs, for those listings).
    pub conversation_id: Option<ConversationId>,
    /// Only what stuck admissions hold: the conversations, their active
    /// requests, their owning runs (stalest first).
    pub stuck_only: bool,
    /// How long a `running` owner without a lease may leave its admission
    /// unchanged before it counts as stuck (one with a lease is stuck once
    /// the lease expired).
    pub stale_after: Duration,
    /// At most this many rows.
    pub limit: u32,
    /// Conversations: only those of this owner.
    pub owner: Option<String>,
    /// Conversations: only those whose metadata has this key with this
    /// value (a string, an integer, a boolean or null; see
    /// [`check_filter_value`]).
    pub meta: Option<(String, Value)>,
    /// Conversations created at or after this (Unix milliseconds).
    pub created_after: Option<i64>,
    /// Conversations created before this (Unix milliseconds).
    pub created_before: Option<i64>,
    /// Conversations updated at or after this (Unix milliseconds):
    /// "updated" is the later of the admission's last change
    /// ([`ConversationSummary::last_activity_at`]) and the metadata's
    /// ([`ConversationMeta::updated_at`]).
    pub updated_after: Option<i64>,
    /// Conversations updated before this (Unix milliseconds).
    pub updated_before: Option<i64>,
    /// Conversations: the page after this cursor (from
    /// [`ConversationPage::next`]). Keyset pagination: a conversation
    /// created meanwhile never shifts a page, so a walk lists every
    /// conversation that existed when it started exactly once.
    pub after: Option<ConversationCursor>,
}

impl ListFilter {
    /// Checks the conversation filters a backend passes to its query.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a bad owner, metadata key or value.
    pub fn check_conversation_filters(&self) -> Result<(), Error> {
        if let Some(owner) = &self.owner {
            check_owner(owner)?;
        }
        if let Some((key, value)) = &self.meta {
            crate::store::meta::check_key(key)?;
            check_filter_value(value)?;
        }
        Ok(())
    }

    /// Whether a conversation passes the owner, metadata and time filters:
    /// what a backend applies to conversations it did not select by them
    /// (`stuck_only`, `conversation_id`).
    pub fn admits(&self, summary: &ConversationSummary) -> bool {
        let meta = &summary.meta;
        let updated = summary.last_activity_at.max(meta.updated_at);
        self.owner
            .as_ref()
            .is_none_or(|o| meta.owner.as_ref() == Some(o))
            && self
                .meta
                .as_ref()
                .is_none_or(|(k, v)| meta.metadata.get(k) == Some(v))
            && self.created_after.is_none_or(|t| summary.created_at >= t)
            && self.created_before.is_none_or(|t| summary.created_at < t)
            && self.updated_after.is_none_or(|t| updated >= t)
            && self.updated_before.is_none_or(|t| updated < t)
    }
}

impl Default for ListFilter {
    fn default() -> Self {
        Self {
            namespace: None,
            conversation_id: None,
            stuck_only: false,
            stale_after: Duration::from_secs(300),
            limit: 50,
            owner: None,
            meta: None,
            created_after: None,
            created_before: None,
            updated_after: None,
            updated_before: None,
            after: None,
        }
    }
}

/// What [`StoreAdmin::prune`] deletes.
#[derive(Clone, Debug)]
pub struct PruneOptions {
    /// Prune requests that finished (committed or were abandoned) longer ago
    /// than this.
    pub older_than: Duration,
    /// Only requests of this status (`Completed` or `Abandoned`); both when
    /// `None`.
    pub status: Option<RequestStatus>,
    /// Also delete whole conversations that are idle (no active admission)
    /// and whose last activity is older than `conversations_older_than`
    /// (or `older_than`): transcript, requests (their ids are forgotten:
    /// reusable) and everything else.
    pub include_transcripts: bool,
    /// The idle age past which `include_transcripts` deletes a conversation;
    /// `older_than` when `None`.
    pub conversations_older_than: Option<Duration>,
    /// The newest this many requests of each conversation are not pruned,
    /// whatever their age (0: age alone decides). Every request counts
    /// among them whatever its status: one that holds the admission (never
    /// pruned itself) takes one of the N places, and so do the rows that
    /// earlier prunes kept (a pruned request keeps its row). Both backends
    /// count the same way (a conformance case checks it).
    pub keep_last_requests: u32,
    /// Count what would be deleted and delete nothing.
    pub dry_run: bool,
}

impl PruneOptions {
    /// Prune finished requests of any status older than `older_than`; keep
    /// transcripts; really delete.
    pub fn older_than(older_than: Duration) -> Self {
        Self {
            older_than,
            status: None,
            include_transcripts: false,
            conversations_older_than: None,
            keep_last_requests: 0,
            dry_run: false,
        }
    }

    /// The idle age of the conversations `include_transcripts` deletes.
    pub fn conversation_age(&self) -> Duration {
        self.conversations_older_than.unwrap_or(self.older_than)
    }
}

/// Rows deleted (or, in a dry run, that would be) per table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TableCounts {
    /// Conversation header rows (with their metadata).
    pub conversations: u64,
    /// Admission rows, one per conversation.
    pub admissions: u64,
    /// Committed transcript entries.
    pub transcript: u64,
    /// Request rows.
    pub requests: u64,
    /// Run rows.
    pub runs: u64,
    /// Loop checkpoint rows.
    pub loop_checkpoints: u64,
    /// Verifier report rows.
    pub verification_reports: u64,
    /// Tool-call journal rows.
    pub tool_calls: u64,
    /// Messages a request produced before its commit, which moves them into
    /// the transcript.
    pub run_messages: u64,
    /// Approval rows.
    pub approvals: u64,
    /// Event log rows.
    pub events: u64,
}

impl TableCounts {
    /// Every row, all tables together.
    pub fn total(&self) -> u64 {
        self.rows().iter().map(|(_, n)| n).sum()
    }

    /// `(table, rows)` in a fixed order.
    pub fn rows(&self) -> [(&'static str, u64); 11] {
        [
            ("conversations", self.conversations),
            ("admissions", self.admissions),
            ("transcript", self.transcript),
            ("requests", self.requests),
            ("runs", self.runs),
            ("loop_checkpoints", self.loop_checkpoints),
            ("verification_reports", self.verification_reports),
            ("tool_calls", self.tool_calls),
            ("run_messages", self.run_messages),
            ("approvals", self.approvals),
            ("events", self.events),
        ]
    }
}

/// What [`StoreAdmin::prune`] did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PruneReport {
    /// Nothing was deleted: the counts are what a real prune would delete.
    pub dry_run: bool,
    /// Unix milliseconds: requests finished and conversations last active
    /// before this were pruned.
    pub cutoff: i64,
    /// Finished requests older than the cutoff that were looked at (pruned
    /// now, or already by an earlier prune).
    pub requests_examined: u64,
    /// Rows deleted (or that would be), per table.
    pub deleted: TableCounts,
    /// The database, then its write-ahead log, in bytes, as
    /// [`StorageReport`] counts them.
    pub database_bytes_before: u64,
    /// The write-ahead log's size before, in bytes.
    pub wal_bytes_before: u64,
    /// The database's size after, in bytes.
    pub database_bytes_after: u64,
    /// The write-ahead log's size after, in bytes.
    pub wal_bytes_after: u64,
    /// Pages given back to the file system (SQLite's incremental vacuum;
    /// 0 where the backend reclaims space by itself).
    pub pages_freed: u64,
    /// Free pages left inside the database (SQLite: a database created
    /// without `auto_vacuum=INCREMENTAL` keeps them until a full `VACUUM`).
    pub free_pages_after: u64,
    /// The log could not be checkpointed whole: another connection was
    /// reading. It shrinks at a later checkpoint.
    pub wal_checkpoint_busy: bool,
}

/// The health of a database, as `doctor` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DoctorReport {
    /// Where the database is: a file path, or a server address without its
    /// password (as `PostgresStore::location` writes it).
    pub location: String,
    /// Whether the backend's integrity check passed; `None` when it could
    /// not run because the database could not be opened (see
    /// [`DoctorReport::cannot_open`]): that says nothing about its health.
    pub integrity_ok: Option<bool>,
    /// Why the database could not be opened for the check (not a file, no
    /// permission, a read-only directory its log needs, …).
    pub cannot_open: Option<String>,
    /// What the integrity check said (`["ok"]` when healthy), or why it
    /// could not run.
    pub integrity: Vec<String>,
    /// The newest migration applied to the database; `None` without a schema.
    pub schema_version: Option<i64>,
    /// The newest migration this build knows.
    pub supported_schema_version: i64,
    /// SQLite: `page_size`, `page_count`, `freelist_count`, `auto_vacuum`,
    /// `journal_mode`. Figures only this backend has; in JSON they stand
    /// beside the others.
    #[serde(flatten)]
    pub details: BTreeMap<String, Value>,
    /// The database's size on disk (SQLite: the file).
    pub database_bytes: u64,
    /// The write-ahead log's size (SQLite: the `-wal` file).
    pub wal_bytes: u64,
    /// Admissions held by an active request.
    pub held_admissions: Option<u64>,
    /// Held admissions whose run is not live (see the module docs); those
    /// awaiting approval are not among them.
    pub stuck_admissions: Option<u64>,
    /// Held admissions whose request has tool calls awaiting a decision.
    pub awaiting_approval_admissions: Option<u64>,
    /// Images' and files' bytes stored (each once, however many messages
    /// name them).
    pub blobs: Option<u64>,
    /// Their size in all.
    pub blob_bytes: Option<u64>,
    /// Stored blobs no message or journaled tool result names, found by
    /// reading every row's parts (not from the reference counts): 0 in a
    /// healthy store.
    pub unreferenced_blobs: Option<u64>,
    /// The checks that could not run, each with why (`admissions: …`).
    /// A check listed here says nothing either way.
    pub not_checked: Vec<String>,
}

/// What the store occupies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StorageReport {
    /// Bytes holding data (SQLite: pages in use × page size, free pages
    /// not counted).
    pub bytes_in_use: u64,
    /// The database's size on disk (SQLite: the file).
    pub database_bytes: u64,
    /// The write-ahead log's size (SQLite: the `-wal` file).
    pub wal_bytes: u64,
    /// SQLite: `page_size`, `page_count`, `freelist_count`.
    #[serde(flatten)]
    pub details: BTreeMap<String, Value>,
}
