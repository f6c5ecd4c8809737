//! The PostgreSQL store: the contract of the embedded SQLite store on a
//! server that many processes on many machines share.
//!
//! Each durable step is one statement that commits on its own (one round
//! trip): a claim, each turn write, a tool result, a commit, an abandon, an
//! approval decision; a recovery claim, the summary writes, a stop for
//! approval, and a claim or a commit that writes more than its statement
//! (a run with an id of its own, verification reports, rows from before
//! migrations 0027 and 0028) are one short transaction (the steps are in
//! `steps/`, under the names of SQLite's). So no connection is held across
//! a model or tool call. Every ownership change is one guarded `UPDATE
//! admissions … WHERE revision = $n` whose row count decides it; every write of a run's owner starts with a fenced
//! update of the same row, which also holds its lock until the step
//! commits, so a takeover waits for a step in progress and the step after it
//! is fenced. Transient failures are retried inside the store (`retry.rs`).
//! The schema is ready for a distributed Postgres (`docs/scale-out.md`).

mod admission;
mod approvals;
mod blobs;
mod codec;
mod connect;
mod deletion;
mod event_log;
mod fork;
mod leases;
mod meta;
mod ops;
mod reads;
mod retry;
#[cfg(test)]
mod schema_sql;
mod steps;
mod summaries;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::PgPool;

use retry::{autocommit, transaction};
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
use turnstile_core::Error;

/// Options for [`PostgresStore::connect_with`].
#[derive(Clone)]
pub struct PostgresOptions {
    /// A libpq-style URL: `postgres://user[:password]@host[:port]/database`.
    pub url: String,
    /// Connections in the pool. Each step takes one only while its
    /// transaction runs; concurrent sessions' commits share the server's
    /// group commit.
    pub pool_size: u32,
    /// How long a step waits for a free connection before it fails busy.
    pub acquire_timeout: Duration,
    /// The server's `statement_timeout` for every statement; `None` (the
    /// default) keeps the server's. A statement past it fails busy.
    pub statement_timeout: Option<Duration>,
    /// The schema that holds the tables (created if missing); `None` uses
    /// the connection's `search_path` (normally `public`). Lowercase letters,
    /// digits and `_`.
    pub schema: Option<String>,
    /// Connect only to a database that has this build's schema, and change
    /// nothing: [`Error::NotFound`] without the schema,
    /// [`Error::SchemaTooOld`] for an older one. For tools that only look.
    pub existing_only: bool,
    /// How much one message may hold, per part and in all; a message over
    /// a limit is refused with [`Error::InvalidInput`] and nothing is
    /// written.
    pub part_limits: PartLimits,
}

impl PostgresOptions {
    /// The defaults for `url`: 16 connections, a 30 s acquire timeout, the
    /// server's statement timeout, the default schema.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            pool_size: 16,
            acquire_timeout: Duration::from_secs(30),
            statement_timeout: None,
            schema: None,
            existing_only: false,
            part_limits: PartLimits::default(),
        }
    }
}

impl std::fmt::Debug for PostgresOptions {
    // The URL may hold a password: never print it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresOptions")
            .field("pool_size", &self.pool_size)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("statement_timeout", &self.statement_timeout)
            .field("schema", &self.schema)
            .field("existing_only", &self.existing_only)
            .field("part_limits", &self.part_limits)
            .finish_non_exhaustive()
    }
}

/// The PostgreSQL implementation of [`Store`] and
/// [`StoreAdmin`](turnstile_core::admin::StoreAdmin).
#[derive(Clone, Debug)]
pub struct PostgresStore {
    pool: PgPool,
    /// `postgres://user@host:port/database`, without the password.
    location: String,
    schema: Option<String>,
    part_limits: PartLimits,
    /// Conversations' states after their commits, shared by the store's
    /// clones: their next requests claim without reading first.
    claim_memory: Arc<ClaimMemory>,
}

/// A step whose messages name blobs (`$blobs`): one transaction that
/// stores them, runs the step and removes those it came not to name (a
/// replayed claim writes no message).
macro_rules! with_blobs {
    ($store:expr, $blobs:expr, |$conn:ident, $retry:ident| $step:expr) => {{
        let step_blobs: &StepBlobs = $blobs;
        transaction!($store, |$conn, $retry| async move {
            blobs::store($conn, step_blobs).await?;
            let value = $step.await?;
            blobs::drop_unnamed($conn, step_blobs).await?;
            Ok::<_, Error>(value)
        })
    }};
}

impl PostgresStore {
    /// Where the store is, without any password.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// Closes every connection of the pool; waits for those in use.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

#[async_trait]
impl Store for PostgresStore {
    async fn ensure_conversation(
        &self,
        namespace: &Namespace,
        id: ConversationId,
    ) -> Result<Conversation, Error> {
        autocommit!(self, |conn, _retry| conversation_open::ensure_conversation(
            conn, namespace, id
        ))
    }

    async fn conversation(
        &self,
        namespace: &Namespace,
        id: ConversationId,
    ) -> Result<Conversation, Error> {
        autocommit!(self, |conn, _retry| admission::load_conversation(
            conn, namespace, id
        ))
    }

    async fn claim_context(
        &self,
        namespace: &Namespace,
        conversation_id: ConversationId,
        request_id: RequestId,
        window: Option<u32>,
    ) -> Result<ClaimContext, Error> {
        autocommit!(self, |conn, _retry| reads::load_claim_context(
            conn,
            namespace,
            conversation_id,
            request_id,
            window
        ))
    }

    async fn admission(&self, conversation_id: ConversationId) -> Result<Admission, Error> {
        autocommit!(self, |conn, _retry| admission::load_admission(
            conn,
            conversation_id
        ))
    }

    fn claim_memory(&self) -> Option<&ClaimMemory> {
        Some(&self.claim_memory)
    }

    async fn claim(&self, claim: &NewRequest) -> Result<ClaimOutcome, Error> {
        let input = std::slice::from_ref(&claim.input);
        self.part_limits.check(input)?;
        match StepBlobs::of(input) {
            None => autocommit!(self, |conn, retry| claim::claim(conn, claim, retry, false)),
            Some(blobs) => {
                with_blobs!(self, &blobs, |conn, retry| claim::claim(
                    conn, claim, retry, true
                ))
            }
        }
    }

    async fn claim_recovery(&self, claim: &RecoveryClaim) -> Result<Fence, Error> {
        transaction!(self, |conn, retry| recovery_claim::claim_recovery_in(
            conn, claim, retry
        ))
    }

    async fn request(&self, request_id: RequestId) -> Result<Option<RequestRecord>, Error> {
        autocommit!(self, |conn, _retry| reads::load_request(conn, request_id))
    }

    async fn run(&self, run_id: RunId) -> Result<Option<RunRecord>, Error> {
        autocommit!(self, |conn, _retry| reads::load_run(conn, run_id))
    }

    async fn begin_turn(&self, fence: &Fence, checkpoint: &LoopCheckpoint) -> Result<(), Error> {
        autocommit!(self, |conn, _retry| turn_write::begin_turn(
            conn, fence, checkpoint
        ))
    }

    async fn record_model_response(
        &self,
        fence: &Fence,
        checkpoint: &LoopCheckpoint,
        assistant: &Message,
    ) -> Result<(), Error> {
        let answer = std::slice::from_ref(assistant);
        self.part_limits.check(answer)?;
        match StepBlobs::of(answer) {
            None => autocommit!(self, |conn, retry| turn_write::record_model_response(
                conn, fence, checkpoint, assistant, retry
            )),
            Some(blobs) => with_blobs!(self, &blobs, |conn, retry| {
                turn_write::record_model_response(conn, fence, checkpoint, assistant, retry)
            }),
        }
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
        match StepBlobs::of_contents(output) {
            None => autocommit!(self, |conn, retry| tool_result::record_tool_result(
                conn, fence, turn, call_id, result, retry
            )),
            Some(blobs) => with_blobs!(self, &blobs, |conn, retry| {
                tool_result::record_tool_result(conn, fence, turn, call_id, result, retry)
            }),
        }
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
        self.part_limits.check(messages)?;
        match StepBlobs::of(messages) {
            None => autocommit!(self, |conn, retry| turn_write::finish_turn(
                conn, fence, checkpoint, first_seq, messages, next, retry
            )),
            Some(blobs) => with_blobs!(self, &blobs, |conn, retry| {
                turn_write::finish_turn(conn, fence, checkpoint, first_seq, messages, next, retry)
            }),
        }
    }

    async fn commit(
        &self,
        fence: &Fence,
        checkpoint: &LoopCheckpoint,
        final_message: &Message,
    ) -> Result<StoredOutcome, Error> {
        let answer = std::slice::from_ref(final_message);
        self.part_limits.check(answer)?;
        match StepBlobs::of(answer) {
            None => autocommit!(self, |conn, retry| commit::commit(
                conn,
                fence,
                checkpoint,
                final_message,
                retry
            )),
            Some(blobs) => with_blobs!(self, &blobs, |conn, retry| {
                commit::commit(conn, fence, checkpoint, final_message, retry)
            }),
        }
    }

    async fn fail_run(
        &self,
        fence: &Fence,
        error: &str,
        settled: Option<&LoopCheckpoint>,
    ) -> Result<(), Error> {
        autocommit!(self, |conn, _retry| turn_write::fail_run(
            conn, fence, error, settled
        ))
    }

    async fn abandon(
        &self,
        conversation_id: ConversationId,
        request_id: RequestId,
        expected_revision: Revision,
    ) -> Result<Revision, Error> {
        // One token per call, the same across its attempts.
        let token = uuid::Uuid::new_v4();
        transaction!(self, |conn, retry| abandon::abandon(
            conn,
            conversation_id,
            request_id,
            expected_revision,
            token,
            retry
        ))
    }

    async fn transcript_window(
        &self,
        conversation_id: ConversationId,
        limit: u32,
    ) -> Result<Vec<TranscriptEntry>, Error> {
        autocommit!(self, |conn, _retry| reads::load_transcript_window(
            conn,
            conversation_id,
            limit
        ))
    }

    async fn events_after(
        &self,
        conversation_id: ConversationId,
        after: u64,
        limit: u32,
    ) -> Result<Vec<LoggedEvent>, Error> {
        autocommit!(self, |conn, _retry| event_log::load_events_after(
            conn,
            conversation_id,
            after,
            limit
        ))
    }

    async fn transcript_range(
        &self,
        conversation_id: ConversationId,
        from: u64,
        to: u64,
    ) -> Result<Vec<TranscriptEntry>, Error> {
        autocommit!(self, |conn, _retry| reads::load_transcript_range(
            conn,
            conversation_id,
            from,
            to
        ))
    }

    async fn latest_checkpoint(&self, run_id: RunId) -> Result<Option<LoopCheckpoint>, Error> {
        let mut checkpoints = autocommit!(self, |conn, _retry| reads::load_checkpoints(
            conn, run_id, true
        ))?;
        Ok(checkpoints.pop())
    }

    async fn checkpoints(&self, run_id: RunId) -> Result<Vec<LoopCheckpoint>, Error> {
        autocommit!(self, |conn, _retry| reads::load_checkpoints(
            conn, run_id, false
        ))
    }

    async fn blob(&self, sha256: BlobHash) -> Result<Option<std::sync::Arc<[u8]>>, Error> {
        autocommit!(self, |conn, _retry| blobs::load(conn, sha256))
    }

    async fn request_messages(
        &self,
        request_id: RequestId,
        count: u64,
    ) -> Result<Vec<Message>, Error> {
        autocommit!(self, |conn, _retry| reads::load_request_messages(
            conn, request_id, count
        ))
    }

    async fn journal(&self, request_id: RequestId, turn: u32) -> Result<Vec<JournalEntry>, Error> {
        autocommit!(self, |conn, _retry| reads::load_journal(
            conn, request_id, turn
        ))
    }

    async fn recovery_usage(&self, request_id: RequestId) -> Result<Usage, Error> {
        autocommit!(self, |conn, _retry| admission::load_recovery_usage(
            conn, request_id
        ))
    }

    async fn latest_summary(
        &self,
        conversation_id: ConversationId,
    ) -> Result<Option<StoredSummary>, Error> {
        autocommit!(self, |conn, _retry| summaries::load_latest_summary(
            conn,
            conversation_id
        ))
    }

    async fn record_summary_pass(&self, fence: &Fence, pass: &SummaryPass) -> Result<(), Error> {
        transaction!(self, |conn, _retry| summaries::record_summary_pass_in(
            conn, fence, pass
        ))
    }

    async fn commit_summary(
        &self,
        fence: &Fence,
        summary: &SummaryCommit,
    ) -> Result<StoredSummary, Error> {
        transaction!(self, |conn, _retry| summaries::commit_summary_in(
            conn, fence, summary
        ))
    }

    async fn await_approval(
        &self,
        fence: &Fence,
        settled: &LoopCheckpoint,
        call_ids: &[String],
        reason: &str,
    ) -> Result<Vec<PendingApproval>, Error> {
        transaction!(self, |conn, _retry| approvals::await_approval_in(
            conn, fence, settled, call_ids, reason
        ))
    }

    async fn approvals(
        &self,
        request_id: RequestId,
        turn: u32,
    ) -> Result<Vec<ApprovalRecord>, Error> {
        autocommit!(self, |conn, _retry| approvals::load_approvals(
            conn, request_id, turn
        ))
    }

    async fn pending_approvals(
        &self,
        conversation_id: Option<ConversationId>,
    ) -> Result<Vec<PendingApproval>, Error> {
        autocommit!(self, |conn, _retry| approvals::load_pending_approvals(
            conn,
            conversation_id
        ))
    }

    async fn decide_approval(&self, decision: &ApprovalDecision) -> Result<Revision, Error> {
        // One token per call, the same across its attempts.
        let token = uuid::Uuid::new_v4();
        autocommit!(self, |conn, retry| approvals::decide_approval(
            conn, decision, token, retry
        ))
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
        // One token per call, the same across its attempts.
        let token = uuid::Uuid::new_v4();
        transaction!(self, |conn, _retry| deletion::delete_in(
            conn,
            namespace,
            id,
            expected_version,
            active_revision,
            token
        ))
    }

    async fn fork_conversation(
        &self,
        namespace: &Namespace,
        from: ConversationId,
        through_seq: u64,
        new_id: ConversationId,
    ) -> Result<ForkOutcome, Error> {
        transaction!(self, |conn, retry| fork::fork_in(
            conn,
            namespace,
            from,
            through_seq,
            new_id,
            retry
        ))
    }

    async fn renew_lease(&self, fence: &Fence, expires_at: i64) -> Result<(), Error> {
        autocommit!(self, |conn, _retry| leases::renew_lease_in(
            conn, fence, expires_at
        ))
    }

    async fn expired_leases(&self, limit: u32) -> Result<Vec<ExpiredLease>, Error> {
        autocommit!(self, |conn, _retry| leases::load_expired_leases(
            conn, limit
        ))
    }

    async fn conversation_meta(
        &self,
        namespace: &Namespace,
        id: ConversationId,
    ) -> Result<turnstile_core::store::ConversationMeta, Error> {
        transaction!(self, |conn, _retry| meta::load_meta(conn, namespace, id))
    }

    async fn set_conversation_meta(
        &self,
        namespace: &Namespace,
        id: ConversationId,
        expected_meta_version: u64,
        update: &turnstile_core::store::MetaUpdate,
    ) -> Result<turnstile_core::store::ConversationMeta, Error> {
        // One token per call, the same across its attempts.
        let token = uuid::Uuid::new_v4();
        transaction!(self, |conn, retry| meta::set_meta(
            conn,
            namespace,
            id,
            expected_meta_version,
            update,
            token,
            retry
        ))
    }
}
