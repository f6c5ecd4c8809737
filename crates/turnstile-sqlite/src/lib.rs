//! The embedded SQLite store: the only module that talks to sqlx.
//!
//! One writer connection takes every write transaction with
//! `BEGIN IMMEDIATE` (so concurrent writers queue on the busy timeout instead
//! of failing a read-to-write upgrade), or as one writing statement, which
//! SQLite starts the same way; reads go to reader connections of their own
//! (`read_connections.rs`; in memory, the writer's). Every write of the
//! `Store` contract reaches that connection through the group writer
//! (`writer.rs`), which commits the steps of concurrent sessions together,
//! the steps of one kind as one statement (`batch.rs`); only the
//! maintenance operations (`prune`, delete, fork) take it directly
//! (`write_connection.rs`). Each durable step, its SQL and its Rust side,
//! is in `steps/`.

mod admission;
mod approvals;
mod batch;
mod blobs;
mod close;
mod codec;
mod deletion;
mod event_log;
mod fork;
mod leases;
mod meta;
mod migrate;
mod open;
mod ops;
mod read_connections;
mod reads;
#[cfg(test)]
mod schema_sql;
mod steps;
mod summaries;
mod write_connection;
mod writer;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use batch::{Applied, BatchKind};
use codec::db;
use futures_core::future::BoxFuture;
use steps::{abandon, claim, commit, conversation_open, recovery_claim, tool_result, turn_write};
use turnstile_core::backend::StepBlobs;
use turnstile_core::checkpoint::LoopCheckpoint;
use turnstile_core::ids::{ConversationId, Namespace, RequestId, Revision, RunId};
use turnstile_core::message::{BlobHash, Message, Usage};
use turnstile_core::store::ClaimMemory;
use turnstile_core::store::{
    Admission, ApprovalDecision, ApprovalRecord, ClaimContext, ClaimOutcome, Conversation,
    DeleteReport, Fence, ForkOutcome, JournalEntry, LoggedEvent, NewRequest, PendingApproval,
    RecoveryClaim, RequestRecord, RunRecord, Store, StoredOutcome, StoredSummary, SummaryCommit,
    SummaryPass, ToolResult, TranscriptEntry,
};
use turnstile_core::store::{ExpiredLease, PartLimits};
use turnstile_core::{Error, StoreError};
use writer::{Batchable, Isolation};

pub use migrate::{MigrationEvent, MigrationObserver};

/// How hard a commit insists on reaching the disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// `synchronous=FULL`: a committed step survives power loss. The default,
    /// because a lost admission after power loss would let a retry repeat
    /// external effects.
    #[default]
    Full,
    /// `synchronous=NORMAL`: survives a process crash; the last commits may be
    /// lost on power loss. An explicit opt-in.
    Normal,
}

/// Options for [`SqliteStore::open_with`].
#[derive(Clone, Debug)]
pub struct SqliteOptions {
    pub durability: Durability,
    /// How long a write waits for another process's write lock.
    pub busy_timeout: Duration,
    /// The most reader connections (each opened when first needed). By
    /// default one per core, at least two and at most four (four when the
    /// core count is unknown): each is a thread, and more of them than
    /// cores only take turns on the cores (`docs/performance.md`,
    /// "Readers"); two, so that one long read (a listing of every
    /// conversation, in one transaction) leaves one for the rest.
    pub readers: u32,
    /// A size quota for the database file, in bytes; `None` (the default)
    /// sets none. A write that would grow the database past it fails with
    /// [`Error::Store`], whose [`StoreError::is_full`](turnstile_core::StoreError::is_full)
    /// is true, exactly as on a full disk, and loses nothing: the failed
    /// step writes no row, an active request keeps its admission, and it can
    /// be recovered once there is room again (space freed inside the file,
    /// by `prune` for example, is reused first; or reopen with a larger
    /// quota).
    ///
    /// SQLite counts the quota in whole pages (`PRAGMA max_page_count`): it
    /// is rounded down to the database's page size (8 KiB for a database
    /// this version creates; an older file keeps the size it was made
    /// with). It never shrinks an existing database: a file already past
    /// the quota opens and reads as before, and only writes that need a
    /// new page fail. Migrating an older database is not held to it (a
    /// migration that copies a table needs room for both copies for a
    /// moment). The write-ahead log is not counted. A new
    /// database needs about 300 KiB for its schema; a smaller quota makes
    /// opening it fail with the same error, and the file that open created
    /// is removed.
    pub max_database_bytes: Option<u64>,
    /// Open only an existing database at this build's schema, as it is:
    /// create no file and migrate nothing. A missing file (or one that is
    /// not a regular file, or has no turnstile schema) is
    /// [`Error::NotFound`]; an older schema is [`Error::SchemaTooOld`]. For
    /// tools that only look.
    ///
    /// A file this process cannot write (a read-only medium, another
    /// user's file) with no `-wal` file beside it (no writer has it open,
    /// and every commit is in the file) is opened read-only and immutable:
    /// SQLite creates no `-wal` or `-shm` file beside it, which it could
    /// not remove, or not create at all in a read-only directory. Such a
    /// store sees the file as it was when opened.
    pub existing_only: bool,
    /// How much one message may hold, per part and in all; a message over
    /// a limit is refused with [`Error::InvalidInput`] and nothing is
    /// written.
    pub part_limits: PartLimits,
    /// Told of each migration that opening an older database applies, as
    /// it starts and once it has committed (`turnstile` prints them on
    /// stderr). Each migration is one transaction: one killed midway
    /// leaves the database as it was before it, and the next open applies
    /// it again. Not told of a new database's schema.
    pub on_migration: Option<MigrationObserver>,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            durability: Durability::Full,
            busy_timeout: Duration::from_secs(30),
            readers: default_readers(),
            max_database_bytes: None,
            existing_only: false,
            part_limits: PartLimits::default(),
            on_migration: None,
        }
    }
}

fn default_readers() -> u32 {
    let cores = std::thread::available_parallelism().map_or(4, std::num::NonZeroUsize::get);
    cores.clamp(2, 4) as u32
}

/// The SQLite implementation of [`Store`].
///
/// Its writes go through a writer task on the runtime it was opened on,
/// which SQLite's worker thread wakes with each statement's result. A task
/// woken from outside a multi-thread runtime waits in the runtime's global
/// queue, so with many sessions at once the writer, which every step of a
/// group waits on, can wait behind them; a runtime built with
/// `tokio::runtime::Builder::global_queue_interval(4)` lets it in sooner
/// (`turnstile bench` and `turnstile serve` do).
#[derive(Clone, Debug)]
pub struct SqliteStore {
    writer: write_connection::WriteConnection,
    /// Commits runs' steps, batching concurrent sessions' steps.
    group: writer::GroupWriter,
    reader: read_connections::ReadConnections,
    /// The database file (`None` in memory): `prune` reports its size.
    path: Option<PathBuf>,
    /// Opened to look only, read-only and immutable (a file this process
    /// cannot write): there is no log to fold at close.
    look_only: bool,
    part_limits: PartLimits,
    /// Conversations' states after their commits, shared by the store's
    /// clones: their next requests claim without reading first.
    claim_memory: Arc<ClaimMemory>,
}

impl SqliteStore {
    /// The database file, if the store has one (not in memory).
    pub fn path(&self) -> Option<&std::path::Path> {
        self.path.as_deref()
    }

    /// Sets how much one message may hold (in memory, where there are no
    /// [`SqliteOptions`]).
    pub fn with_part_limits(self, part_limits: PartLimits) -> Self {
        Self {
            part_limits,
            ..self
        }
    }

    /// Writes a step whose messages name blobs: the blobs first, then the
    /// step, in a savepoint of their own, so a refused step leaves no blob;
    /// a blob the step came not to name (a replayed claim) is removed.
    async fn write_with_blobs<T, F>(&self, blobs: StepBlobs, step: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut sqlx::SqliteConnection) -> BoxFuture<'c, Result<T, Error>>
            + Send
            + 'static,
    {
        self.group
            .write(Isolation::Savepoint, move |conn| {
                Box::pin(async move {
                    blobs::store(conn, &blobs).await?;
                    let value = step(conn).await?;
                    blobs::drop_unnamed(conn, &blobs).await?;
                    Ok(value)
                })
            })
            .await
    }

    /// Writes a step of a run's owner: alone, or in one statement with the
    /// other turn steps of its group transaction (alone when its messages
    /// name blobs).
    async fn write_turn(
        &self,
        step: turn_write::TurnStep,
        messages: &[Message],
    ) -> Result<(), Error> {
        self.part_limits.check(messages)?;
        let step = Arc::new(step);
        if let Some(blobs) = StepBlobs::of(messages) {
            return self
                .write_with_blobs(blobs, move |conn| {
                    Box::pin(async move { step.write(conn).await })
                })
                .await;
        }
        let row = step.clone();
        self.group
            .write_batchable(
                Batchable {
                    kind: BatchKind::TurnWrite,
                    row: Box::new(move || row.row()),
                },
                move |conn| Box::pin(async move { step.write(conn).await }),
                |returned| match returned {
                    Applied::TurnWrite => Ok(()),
                    other => Err(misanswered(other)),
                },
            )
            .await
    }
}

/// A shared statement's answer for another kind of step: a defect of the
/// group writer, reported rather than trusted.
fn misanswered(returned: Applied) -> Error {
    Error::Store(StoreError::new(
        format!("a step was answered with another kind's result: {returned:?}"),
        None,
    ))
}

// Each write moves its inputs into one step of the group writer, which runs
// the write's `*_in` function on the group transaction's connection.
#[async_trait]
impl Store for SqliteStore {
    async fn ensure_conversation(
        &self,
        namespace: &Namespace,
        id: ConversationId,
    ) -> Result<Conversation, Error> {
        let namespace = namespace.clone();
        self.group
            .write(Isolation::Statement, move |conn| {
                Box::pin(async move {
                    conversation_open::ensure_conversation_in(conn, &namespace, id).await
                })
            })
            .await
    }

    async fn conversation(
        &self,
        namespace: &Namespace,
        id: ConversationId,
    ) -> Result<Conversation, Error> {
        let mut conn = self.reader.acquire().await?;
        admission::load_conversation(&mut conn, namespace, id).await
    }

    async fn admission(&self, conversation_id: ConversationId) -> Result<Admission, Error> {
        let mut conn = self.reader.acquire().await?;
        admission::load_admission(&mut conn, conversation_id).await
    }

    async fn claim_context(
        &self,
        namespace: &Namespace,
        conversation_id: ConversationId,
        request_id: RequestId,
        window: Option<u32>,
    ) -> Result<ClaimContext, Error> {
        reads::load_claim_context(&self.reader, namespace, conversation_id, request_id, window)
            .await
    }

    fn claim_memory(&self) -> Option<&ClaimMemory> {
        Some(&self.claim_memory)
    }

    async fn claim(&self, claim: &NewRequest) -> Result<ClaimOutcome, Error> {
        let input = std::slice::from_ref(&claim.input);
        self.part_limits.check(input)?;
        let step = Arc::new(claim::ClaimStep::new(claim.clone())?);
        if let Some(blobs) = StepBlobs::of(input) {
            return self
                .write_with_blobs(blobs, move |conn| {
                    Box::pin(async move { step.write(conn).await })
                })
                .await;
        }
        let (row, applied) = (step.clone(), step.clone());
        self.group
            .write_batchable(
                Batchable {
                    kind: BatchKind::Claim,
                    row: Box::new(move || row.row()),
                },
                move |conn| Box::pin(async move { step.write(conn).await }),
                move |returned| match returned {
                    Applied::Claim { revision } => applied.admitted(revision),
                    other => Err(misanswered(other)),
                },
            )
            .await
    }

    async fn claim_recovery(&self, claim: &RecoveryClaim) -> Result<Fence, Error> {
        let claim = claim.clone();
        self.group
            .write(Isolation::Statement, move |conn| {
                Box::pin(async move { recovery_claim::claim_recovery_in(conn, &claim).await })
            })
            .await
    }

    async fn request(&self, request_id: RequestId) -> Result<Option<RequestRecord>, Error> {
        let mut conn = self.reader.acquire().await?;
        reads::load_request(&mut conn, request_id).await
    }

    async fn run(&self, run_id: RunId) -> Result<Option<RunRecord>, Error> {
        reads::load_run(&self.reader, run_id).await
    }

    async fn begin_turn(&self, fence: &Fence, checkpoint: &LoopCheckpoint) -> Result<(), Error> {
        self.write_turn(turn_write::begin_turn(fence, checkpoint)?, &[])
            .await
    }

    async fn record_model_response(
        &self,
        fence: &Fence,
        checkpoint: &LoopCheckpoint,
        assistant: &Message,
    ) -> Result<(), Error> {
        self.write_turn(
            turn_write::model_response(fence, checkpoint, assistant)?,
            std::slice::from_ref(assistant),
        )
        .await
    }

    async fn record_tool_result(
        &self,
        fence: &Fence,
        turn: u32,
        call_id: &str,
        result: &ToolResult,
    ) -> Result<(), Error> {
        let output = std::iter::once(&result.content);
        self.part_limits.check_contents(output.clone())?;
        let step = Arc::new(tool_result::ToolResultStep::new(
            fence, turn, call_id, result,
        )?);
        if let Some(blobs) = StepBlobs::of_contents(output) {
            return self
                .write_with_blobs(blobs, move |conn| {
                    Box::pin(async move { step.write(conn).await })
                })
                .await;
        }
        let row = step.clone();
        self.group
            .write_batchable(
                Batchable {
                    kind: BatchKind::ToolResult,
                    row: Box::new(move || row.row()),
                },
                move |conn| Box::pin(async move { step.write(conn).await }),
                |returned| match returned {
                    Applied::ToolResult => Ok(()),
                    other => Err(misanswered(other)),
                },
            )
            .await
    }

    async fn finish_turn(
        &self,
        fence: &Fence,
        checkpoint: &LoopCheckpoint,
        messages: &[Message],
        next: Option<&LoopCheckpoint>,
    ) -> Result<(), Error> {
        let first_seq = checkpoint
            .message_count
            .checked_sub(messages.len() as u64)
            .ok_or_else(|| {
                Error::InvalidInput("checkpoint message_count is below the turn's messages".into())
            })?;
        self.write_turn(
            turn_write::finish_turn(fence, checkpoint, first_seq, messages, next)?,
            messages,
        )
        .await
    }

    async fn commit(
        &self,
        fence: &Fence,
        checkpoint: &LoopCheckpoint,
        final_message: &Message,
    ) -> Result<StoredOutcome, Error> {
        let answer = std::slice::from_ref(final_message);
        self.part_limits.check(answer)?;
        let step = Arc::new(commit::CommitStep::new(fence, checkpoint, final_message)?);
        if let Some(blobs) = StepBlobs::of(answer) {
            return self
                .write_with_blobs(blobs, move |conn| {
                    Box::pin(async move { step.write(conn).await })
                })
                .await;
        }
        let (row, applied) = (step.clone(), step.clone());
        self.group
            .write_batchable(
                Batchable {
                    kind: BatchKind::Commit,
                    row: Box::new(move || row.row()),
                },
                move |conn| Box::pin(async move { step.write(conn).await }),
                move |returned| match returned {
                    Applied::Commit {
                        version,
                        first_seq,
                        end_seq,
                    } => applied.outcome(version, first_seq, end_seq),
                    other => Err(misanswered(other)),
                },
            )
            .await
    }

    async fn fail_run(
        &self,
        fence: &Fence,
        error: &str,
        settled: Option<&LoopCheckpoint>,
    ) -> Result<(), Error> {
        self.write_turn(turn_write::fail_run(fence, error, settled)?, &[])
            .await
    }

    async fn abandon(
        &self,
        conversation_id: ConversationId,
        request_id: RequestId,
        expected_revision: Revision,
    ) -> Result<Revision, Error> {
        self.group
            .write(Isolation::Statement, move |conn| {
                Box::pin(async move {
                    abandon::abandon_in(conn, conversation_id, request_id, expected_revision).await
                })
            })
            .await
    }

    async fn transcript_window(
        &self,
        conversation_id: ConversationId,
        limit: u32,
    ) -> Result<Vec<TranscriptEntry>, Error> {
        reads::load_transcript_window(&self.reader, conversation_id, limit).await
    }

    async fn events_after(
        &self,
        conversation_id: ConversationId,
        after: u64,
        limit: u32,
    ) -> Result<Vec<LoggedEvent>, Error> {
        event_log::load_events_after(&self.reader, conversation_id, after, limit).await
    }

    async fn transcript_range(
        &self,
        conversation_id: ConversationId,
        from: u64,
        to: u64,
    ) -> Result<Vec<TranscriptEntry>, Error> {
        reads::load_transcript_range(&self.reader, conversation_id, from, to).await
    }

    async fn latest_checkpoint(&self, run_id: RunId) -> Result<Option<LoopCheckpoint>, Error> {
        Ok(reads::load_checkpoints(&self.reader, run_id, true)
            .await?
            .pop())
    }

    async fn checkpoints(&self, run_id: RunId) -> Result<Vec<LoopCheckpoint>, Error> {
        reads::load_checkpoints(&self.reader, run_id, false).await
    }

    async fn blob(&self, sha256: BlobHash) -> Result<Option<Arc<[u8]>>, Error> {
        let mut conn = self.reader.acquire().await?;
        blobs::load(&mut conn, sha256).await
    }

    async fn request_messages(
        &self,
        request_id: RequestId,
        count: u64,
    ) -> Result<Vec<Message>, Error> {
        reads::load_request_messages(&self.reader, request_id, count).await
    }

    async fn journal(&self, request_id: RequestId, turn: u32) -> Result<Vec<JournalEntry>, Error> {
        reads::load_journal(&self.reader, request_id, turn).await
    }

    async fn recovery_usage(&self, request_id: RequestId) -> Result<Usage, Error> {
        admission::load_recovery_usage(&self.reader, request_id).await
    }

    async fn latest_summary(
        &self,
        conversation_id: ConversationId,
    ) -> Result<Option<StoredSummary>, Error> {
        summaries::load_latest_summary(&self.reader, conversation_id).await
    }

    async fn record_summary_pass(&self, fence: &Fence, pass: &SummaryPass) -> Result<(), Error> {
        let (fence, pass) = (*fence, pass.clone());
        self.group
            .write(Isolation::Statement, move |conn| {
                Box::pin(
                    async move { summaries::record_summary_pass_in(conn, &fence, &pass).await },
                )
            })
            .await
    }

    async fn commit_summary(
        &self,
        fence: &Fence,
        summary: &SummaryCommit,
    ) -> Result<StoredSummary, Error> {
        let (fence, summary) = (*fence, summary.clone());
        self.group
            .write(Isolation::Savepoint, move |conn| {
                Box::pin(async move { summaries::commit_summary_in(conn, &fence, &summary).await })
            })
            .await
    }

    async fn await_approval(
        &self,
        fence: &Fence,
        settled: &LoopCheckpoint,
        call_ids: &[String],
        reason: &str,
    ) -> Result<Vec<PendingApproval>, Error> {
        let (fence, settled) = (*fence, settled.clone());
        let (call_ids, reason) = (call_ids.to_vec(), reason.to_owned());
        self.group
            .write(Isolation::Savepoint, move |conn| {
                Box::pin(async move {
                    approvals::await_approval_in(conn, &fence, &settled, &call_ids, &reason).await
                })
            })
            .await
    }

    async fn approvals(
        &self,
        request_id: RequestId,
        turn: u32,
    ) -> Result<Vec<ApprovalRecord>, Error> {
        approvals::load_approvals(&self.reader, request_id, turn).await
    }

    async fn pending_approvals(
        &self,
        conversation_id: Option<ConversationId>,
    ) -> Result<Vec<PendingApproval>, Error> {
        approvals::load_pending_approvals(&self.reader, conversation_id).await
    }

    async fn decide_approval(&self, decision: &ApprovalDecision) -> Result<Revision, Error> {
        let decision = decision.clone();
        self.group
            .write(Isolation::Savepoint, move |conn| {
                Box::pin(async move { approvals::decide_approval_in(conn, &decision).await })
            })
            .await
    }

    async fn delete_conversation(
        &self,
        namespace: &Namespace,
        id: ConversationId,
        expected_version: u64,
        active_revision: Option<Revision>,
    ) -> Result<DeleteReport, Error> {
        // Its text leaves the process's memory with its rows.
        self.claim_memory.forget(id);
        deletion::delete_conversation(self, namespace, id, expected_version, active_revision).await
    }

    async fn fork_conversation(
        &self,
        namespace: &Namespace,
        from: ConversationId,
        through_seq: u64,
        new_id: ConversationId,
    ) -> Result<ForkOutcome, Error> {
        fork::fork_conversation(self, namespace, from, through_seq, new_id).await
    }

    async fn renew_lease(&self, fence: &Fence, expires_at: i64) -> Result<(), Error> {
        let fence = *fence;
        self.group
            .write(Isolation::Statement, move |conn| {
                Box::pin(async move { leases::renew_lease_in(conn, &fence, expires_at).await })
            })
            .await
    }

    async fn expired_leases(&self, limit: u32) -> Result<Vec<ExpiredLease>, Error> {
        leases::load_expired_leases(&self.reader, limit).await
    }

    async fn conversation_meta(
        &self,
        namespace: &Namespace,
        id: ConversationId,
    ) -> Result<turnstile_core::store::ConversationMeta, Error> {
        let mut reader = self.reader.acquire().await?;
        let mut tx = sqlx::Connection::begin(&mut *reader)
            .await
            .map_err(db("begin read"))?;
        meta::load_meta(&mut tx, namespace, id).await
    }

    async fn set_conversation_meta(
        &self,
        namespace: &Namespace,
        id: ConversationId,
        expected_meta_version: u64,
        update: &turnstile_core::store::MetaUpdate,
    ) -> Result<turnstile_core::store::ConversationMeta, Error> {
        let (namespace, update) = (namespace.clone(), update.clone());
        self.group
            .write(Isolation::Savepoint, move |conn| {
                Box::pin(async move {
                    meta::set_meta_in(conn, &namespace, id, expected_meta_version, &update).await
                })
            })
            .await
    }
}
