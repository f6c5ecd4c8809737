//! `AgentSession`: the public face of one conversation. Every request is
//! admitted exclusively before any model or tool work, runs the agent loop
//! with a durable checkpoint after every turn, and commits atomically with
//! the release of its admission.

mod admit;
mod drive;
mod outcome;
mod resume;
mod stream;

use std::sync::Arc;

use futures_core::Stream;
use tracing::{instrument, Instrument};

pub use admit::MAX_INPUT_BYTES;
pub use outcome::Outcome;

use crate::agent::{Agent, RunContext};
use crate::events::{Emitter, Event};
use crate::ids::{ConversationId, Namespace, RequestId, Revision, RunId};
use crate::message::Usage;
use crate::store::Store;
use crate::Error;

/// How much committed history the model sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextPolicy {
    /// The most recent committed transcript entries given to the model. The
    /// window is a plain sliding window: it is moved forward to start at a
    /// user message, so it never opens with an orphaned tool result.
    pub window: u32,
}

impl Default for ContextPolicy {
    fn default() -> Self {
        Self { window: 50 }
    }
}

/// What resuming does with a turn that was in flight when its run stopped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ResumePolicy {
    /// Refuse with [`Error::AmbiguousCheckpoint`]: nothing is re-executed.
    #[default]
    RejectAmbiguous,
    /// Re-run the interrupted turn. A recorded model answer is reused; tool
    /// calls whose results are journaled are not executed again.
    RetryInterruptedTurn,
}

/// One conversation, driven by one agent, on one store.
pub struct AgentSession {
    agent: Agent,
    store: Arc<dyn Store>,
    conversation_id: ConversationId,
    namespace: Namespace,
    policy: ContextPolicy,
}

impl AgentSession {
    /// A session on `conversation_id` in `namespace`. The conversation is
    /// created by its first request if it does not exist yet.
    pub fn new(
        agent: Agent,
        store: Arc<dyn Store>,
        conversation_id: ConversationId,
        namespace: Namespace,
        policy: ContextPolicy,
    ) -> Self {
        Self {
            agent,
            store,
            conversation_id,
            namespace,
            policy,
        }
    }

    pub fn conversation_id(&self) -> ConversationId {
        self.conversation_id
    }

    pub fn namespace(&self) -> &Namespace {
        &self.namespace
    }

    pub fn agent(&self) -> &Agent {
        &self.agent
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Runs a request to its commit, or replays its stored answer.
    ///
    /// # Errors
    /// Refusals before any work ([`Error::Busy`], [`Error::RequestMismatch`],
    /// [`Error::RequestAbandoned`], [`Error::NamespaceMismatch`],
    /// [`Error::InvalidInput`]) write nothing. A stopped run
    /// ([`Error::BudgetExceeded`], [`Error::DeadlineExceeded`],
    /// [`Error::Cancelled`], [`Error::Model`]) keeps the admission held and
    /// carries the run id and revision for [`AgentSession::resume_run`].
    ///
    /// # Cancel safety
    /// Dropping the future stops the run at its next await point; the
    /// admission stays held and the last checkpoint is kept for recovery.
    #[instrument(skip_all, fields(conversation_id = %self.conversation_id, request_id = %request_id, run_id = tracing::field::Empty), err)]
    pub async fn run(
        &self,
        request_id: RequestId,
        input: &str,
        ctx: RunContext,
    ) -> Result<Outcome, Error> {
        self.execute(request_id, input, &ctx, &Emitter::default())
            .await
    }

    /// Like [`AgentSession::run`], as a stream of [`Event`]s ending with
    /// [`Event::ConversationCommitted`] (sent only after the commit and the
    /// release are durable) or with the error. A replayed request yields only
    /// its committed result. Dropping the stream stops the run and keeps the
    /// admission for recovery.
    pub fn stream(
        &self,
        request_id: RequestId,
        input: impl Into<String>,
        ctx: RunContext,
    ) -> impl Stream<Item = Result<Event, Error>> + Send + '_ {
        let input = input.into();
        let span = tracing::info_span!(
            "stream",
            conversation_id = %self.conversation_id,
            request_id = %request_id,
            run_id = tracing::field::Empty,
        );
        stream::events(move |events| {
            async move { self.execute(request_id, &input, &ctx, &events).await }.instrument(span)
        })
    }

    /// Continues a stopped run from its latest checkpoint in a new run
    /// (`resumed_from = run_id`), seeded with its usage, tool-call count,
    /// turn number and verification reports. The admission moves to the new
    /// run by compare-and-swap at `expected_revision`.
    ///
    /// # Errors
    /// [`Error::AmbiguousCheckpoint`] under [`ResumePolicy::RejectAmbiguous`]
    /// when a turn was in flight; [`Error::Conflict`] or [`Error::Busy`] when
    /// another owner won; [`Error::ConfigurationMismatch`] when the agent
    /// changed; [`Error::NotFound`] for an unknown run. Then as `run`.
    ///
    /// # Cancel safety
    /// As [`AgentSession::run`].
    #[instrument(skip_all, fields(conversation_id = %self.conversation_id, from_run = %run_id, run_id = tracing::field::Empty), err)]
    pub async fn resume_run(
        &self,
        run_id: RunId,
        ctx: RunContext,
        expected_revision: Revision,
        policy: ResumePolicy,
    ) -> Result<Outcome, Error> {
        self.resume(run_id, &ctx, expected_revision, policy, &Emitter::default())
            .await
    }

    /// Takes over a request whose owner is gone (the host says so): one
    /// compare-and-swap claims it (among competing recoverers exactly one
    /// wins), then its latest run is resumed. `input` must be the input the
    /// request was admitted with.
    ///
    /// # Errors
    /// As [`AgentSession::resume_run`], plus [`Error::RequestMismatch`] for
    /// another input and [`Error::NotActive`] for a request that holds no
    /// admission.
    ///
    /// # Cancel safety
    /// As [`AgentSession::run`].
    #[instrument(skip_all, fields(conversation_id = %self.conversation_id, request_id = %request_id, run_id = tracing::field::Empty), err)]
    pub async fn recover_after_owner_exit(
        &self,
        request_id: RequestId,
        input: &str,
        ctx: RunContext,
        expected_revision: Revision,
        policy: ResumePolicy,
    ) -> Result<Outcome, Error> {
        self.recover(
            request_id,
            input,
            &ctx,
            expected_revision,
            policy,
            &Emitter::default(),
        )
        .await
    }

    /// The latest persisted usage of an active request: a lower bound, since
    /// remote work in flight when its run stopped may have cost more.
    ///
    /// # Errors
    /// [`Error::NotActive`] for a request that holds no admission,
    /// [`Error::RequestMismatch`] for another conversation's request.
    #[instrument(skip_all, fields(conversation_id = %self.conversation_id, request_id = %request_id), err)]
    pub async fn recovery_usage(&self, request_id: RequestId) -> Result<Usage, Error> {
        self.own_request(request_id).await?;
        self.store.recovery_usage(request_id).await
    }

    /// Releases the admission without committing. The request id is burned
    /// (a later `run` with it gets [`Error::RequestAbandoned`]); its runs
    /// stay inspectable. Returns the new revision.
    ///
    /// # Errors
    /// [`Error::Conflict`] for a stale revision, [`Error::NotActive`] for a
    /// request that holds no admission.
    #[instrument(skip_all, fields(conversation_id = %self.conversation_id, request_id = %request_id), err)]
    pub async fn abandon(
        &self,
        request_id: RequestId,
        expected_revision: Revision,
    ) -> Result<Revision, Error> {
        self.own_request(request_id).await?;
        self.store
            .abandon(self.conversation_id, request_id, expected_revision)
            .await
    }
}
