//! `AgentSession`: the public face of one conversation. Every request is
//! admitted exclusively before any model or tool work, runs the agent loop
//! with a durable checkpoint after every turn, and commits atomically with
//! the release of its admission.

mod admit;
mod approvals;
mod compact;
mod drive;
mod event_log;
mod lease;
mod meta;
mod reconcile;
mod resume;
mod state;
mod stream;
mod turns;

use std::pin::Pin;
use std::sync::Arc;

use futures_core::Stream;
use tracing::instrument;

pub use crate::outcome::Outcome;
pub use admit::MAX_INPUT_BYTES;
pub use event_log::LoggedEvents;
pub use lease::{recover_expired, LeasePolicy, Recovery};
pub use state::{ActiveRequest, AdmissionState};

use crate::agent::{Agent, RunContext};
use crate::error::Error;
use crate::events::Event;
use crate::ids::{ConversationId, Namespace, RequestId, Revision, RunId};
use crate::message::{Content, Message, Part, Reasoning, Usage};
use crate::store::Store;
pub use compact::{MaxPasses, DEFAULT_SUMMARY_PROMPT, MAX_SUMMARY_BYTES, SUMMARY_HEADING};
pub(crate) use stream::Emitter;
pub use turns::MAX_TOOL_OUTPUT_BYTES;

/// How much committed history the model sees, and how much of it one summary
/// pass absorbs.
///
/// Without a summary agent the window is a plain sliding window: the model
/// sees the last `window` committed entries (moved forward to start at a user
/// message, so it never opens with an orphaned tool result) and nothing older.
///
/// With a summary agent ([`AgentSession::with_summary_agent`]), nothing is
/// dropped unseen: before a request's first turn, entries older than the
/// window that no summary covers yet are summarized in batches of
/// `summary_batch` entries (a batch grows past that only to keep a tool call
/// with its results). A pass runs only for a full batch, so the model sees
/// the latest summary and then every later entry: at least the window, and
/// fewer than `window + summary_batch` entries (plus any tool results a batch
/// could not split off). One summary call is made per `summary_batch`
/// committed entries, each costing the summary model's tokens and one turn
/// of the request's budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextPolicy {
    window: u32,
    summary_batch: u32,
    past_reasoning: PastReasoning,
    images: u32,
}

/// What the model is sent of the reasoning of requests committed before the
/// current one. The current request's reasoning is always sent whole (a
/// provider may refuse a tool loop without it), and storage always keeps
/// all of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PastReasoning {
    /// Each reasoning part replaced by an empty one naming its provider (no
    /// text, signature or redacted data): the model client sees that the
    /// answer reasoned there, and sends of it what its protocol allows
    /// (the OpenAI-compatible client: nothing), without being given what
    /// providers ignore or strip from earlier turns and what can be large.
    /// Committed answers keep their text, tool calls and provider metadata.
    #[default]
    Placeholder,
    /// Left out, without a placeholder.
    Omitted,
    /// Sent as stored, for a provider that keeps earlier reasoning in its
    /// context.
    Sent,
}

impl ContextPolicy {
    /// The largest window and batch accepted.
    pub const MAX: u32 = 4096;

    /// How many of the context's newest images the model is sent by
    /// default.
    pub const DEFAULT_IMAGES: u32 = 20;

    /// A window of `window` recent committed entries (1–4096), summarized in
    /// batches of the same size.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] outside 1–4096.
    pub fn new(window: u32) -> Result<Self, Error> {
        let window = Self::check("window", window)?;
        Ok(Self {
            window,
            summary_batch: window,
            past_reasoning: PastReasoning::default(),
            images: Self::DEFAULT_IMAGES,
        })
    }

    /// Sets how many entries one summary pass absorbs (1–4096).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] outside 1–4096.
    pub fn with_summary_batch(self, summary_batch: u32) -> Result<Self, Error> {
        Ok(Self {
            summary_batch: Self::check("summary batch", summary_batch)?,
            ..self
        })
    }

    /// Sets what the model is sent of committed requests' reasoning: a
    /// placeholder (the default), nothing, or all of it.
    pub fn with_past_reasoning(self, past_reasoning: PastReasoning) -> Self {
        Self {
            past_reasoning,
            ..self
        }
    }

    /// What the model is sent of committed requests' reasoning.
    pub fn past_reasoning(&self) -> PastReasoning {
        self.past_reasoning
    }

    /// Sets how many of the context's newest images (of every request,
    /// the current one included) the model is sent; each older one is sent
    /// as a text placeholder saying what it was (`[image: image/png, 34
    /// KiB]`), and its bytes are not read. Storage keeps every image.
    /// Default [`ContextPolicy::DEFAULT_IMAGES`]; 0 sends none.
    pub fn with_images(self, images: u32) -> Self {
        Self { images, ..self }
    }

    /// How many of the context's newest images the model is sent.
    pub fn images(&self) -> u32 {
        self.images
    }

    /// A committed message as the model is shown it.
    pub(crate) fn shown(&self, message: Message) -> Message {
        match (self.past_reasoning, message) {
            (
                PastReasoning::Placeholder | PastReasoning::Omitted,
                Message::Assistant {
                    content,
                    tool_calls,
                    provider_metadata,
                },
            ) if content.reasoning().next().is_some() => Message::Assistant {
                content: Content::new(
                    content
                        .into_parts()
                        .into_iter()
                        .filter_map(|part| match (&part, self.past_reasoning) {
                            (Part::Reasoning(_), PastReasoning::Omitted) => None,
                            (Part::Reasoning(reasoning), _) => Some(Part::Reasoning(Reasoning {
                                provider: reasoning.provider.clone(),
                                ..Reasoning::default()
                            })),
                            _ => Some(part),
                        })
                        .collect(),
                ),
                tool_calls,
                provider_metadata,
            },
            (_, message) => message,
        }
    }

    /// The most recent committed entries always given to the model verbatim.
    pub fn window(&self) -> u32 {
        self.window
    }

    /// Entries one summary pass absorbs.
    pub fn summary_batch(&self) -> u32 {
        self.summary_batch
    }

    fn check(what: &str, value: u32) -> Result<u32, Error> {
        if (1..=Self::MAX).contains(&value) {
            Ok(value)
        } else {
            Err(Error::InvalidInput(format!(
                "context {what} must be 1-{}, got {value}",
                Self::MAX
            )))
        }
    }
}

impl Default for ContextPolicy {
    /// A window of 50 entries, summarized 50 at a time.
    fn default() -> Self {
        Self {
            window: 50,
            summary_batch: 50,
            past_reasoning: PastReasoning::default(),
            images: Self::DEFAULT_IMAGES,
        }
    }
}

/// What resuming does with a turn that was in flight when its run stopped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResumePolicy {
    /// Refuse with [`Error::AmbiguousCheckpoint`], unless the tool of the
    /// call in doubt settles it: [`Tool::reconcile`](crate::Tool::reconcile)
    /// answers done (journaled, nothing runs) or not done (it runs once), or
    /// the tool is [`Tool::idempotent`](crate::Tool::idempotent) (it runs
    /// again with the same key). Nothing else is re-executed.
    #[default]
    RejectAmbiguous,
    /// Re-run the interrupted turn. A recorded model answer is reused; tool
    /// calls whose results are journaled are not executed again.
    RetryInterruptedTurn,
    /// Ask the model again for a turn whose model call was in flight (a
    /// model call has no effect beyond its cost); a tool round in flight is
    /// refused as under [`ResumePolicy::RejectAmbiguous`], unless its tool
    /// settles it. Both are judged in the claim's own transaction. What a
    /// server that takes over a dead owner's requests wants.
    RetryModelCall,
}

/// The events of a streamed execution ([`AgentSession::stream`],
/// [`AgentSession::resume_stream`], [`AgentSession::recover_stream`]). It is
/// pinned already: `futures_util::StreamExt::next` works on it as it is.
pub type EventStream<'a> = Pin<Box<dyn Stream<Item = Result<Event, Error>> + Send + 'a>>;

/// One conversation, driven by one agent, on one store.
pub struct AgentSession {
    agent: Agent,
    store: Arc<dyn Store>,
    conversation_id: ConversationId,
    namespace: Namespace,
    policy: ContextPolicy,
    summary: Option<SummarySettings>,
    /// Set by [`AgentSession::with_lease`].
    lease: Option<LeasePolicy>,
}

/// The summary agent and the per-request pass limit.
struct SummarySettings {
    agent: Agent,
    max_passes: MaxPasses,
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
            summary: None,
            lease: None,
        }
    }

    /// Compacts old history with `agent` (DESIGN §6): before a request's
    /// first turn, committed entries older than the window are summarized
    /// batch by batch (see [`ContextPolicy`]), and the model's context becomes
    /// the system prompt, the latest summary, the later entries and the
    /// request. The summary model gets the summary agent's system prompt (or
    /// [`DEFAULT_SUMMARY_PROMPT`]),
    /// the previous summary and the batch as text; its tools are not offered.
    ///
    /// Each pass is durable: recorded in the admission, then the summary
    /// model is called, then the summary row is committed. A pass counts as
    /// one turn of the request and its usage as the request's usage: it
    /// shares the caller's budget, deadline and cancellation, and shows in
    /// [`Outcome::usage`], [`Outcome::turns`] and
    /// [`AgentSession::recovery_usage`]; the main model's turns are numbered
    /// after the passes (as are tool idempotency keys). An interrupted pass
    /// is re-run by the recovery under either [`ResumePolicy`] (it has no
    /// side effect but its cost) and counts once. One request runs at most
    /// `max_passes` passes, counted across its recoveries; past that it stops
    /// with [`Error::SummaryPassLimitExceeded`]. The summary agent, the limit
    /// and the context policy are part of the agent fingerprint: a held
    /// request resumed with other settings gets
    /// [`Error::ConfigurationMismatch`].
    pub fn with_summary_agent(mut self, agent: Agent, max_passes: MaxPasses) -> Self {
        self.summary = Some(SummarySettings { agent, max_passes });
        self
    }

    /// The conversation this session drives.
    pub fn conversation_id(&self) -> ConversationId {
        self.conversation_id
    }

    /// The namespace the conversation belongs to.
    pub fn namespace(&self) -> &Namespace {
        &self.namespace
    }

    /// The agent that answers the requests (not the summary agent).
    pub fn agent(&self) -> &Agent {
        &self.agent
    }

    /// The store everything is durable in.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// How much committed history the model sees.
    pub fn policy(&self) -> ContextPolicy {
        self.policy
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
    /// admission stays held and the last checkpoint is kept for recovery. A
    /// durable step already handed to the store completes (fenced) even so.
    /// A turn's write-ahead is committed with the step before it, so a run
    /// dropped between turns leaves the next turn in flight: resume it with
    /// [`ResumePolicy::RetryInterruptedTurn`]. To stop at a clean point that
    /// either policy resumes, cancel through [`RunContext`] instead.
    #[instrument(skip_all, fields(conversation_id = %self.conversation_id, request_id = %request_id, run_id = tracing::field::Empty), err)]
    pub async fn run(
        &self,
        request_id: RequestId,
        input: impl Into<Content>,
        ctx: RunContext,
    ) -> Result<Outcome, Error> {
        self.execute(request_id, &input.into(), &ctx, &Emitter::default())
            .await
    }

    /// Like [`AgentSession::run`], as a stream of [`Event`]s ending with
    /// [`Event::ConversationCommitted`] (sent only after the commit and the
    /// release are durable) or with the error. A replayed request yields only
    /// its committed result. The stream is an [`EventStream`], pinned
    /// already: `futures_util::StreamExt::next` works on it without pinning
    /// by hand.
    ///
    /// # Errors
    /// As [`AgentSession::run`], as the stream's last item.
    ///
    /// # Cancel safety
    /// The run goes on only while the stream is polled: a consumer that
    /// stops polling freezes it right after the event it last took. Dropping
    /// the stream is dropping the future of [`AgentSession::run`].
    pub fn stream(
        &self,
        request_id: RequestId,
        input: impl Into<Content>,
        ctx: RunContext,
    ) -> EventStream<'_> {
        let input = input.into();
        let span = tracing::info_span!(
            "stream",
            conversation_id = %self.conversation_id,
            request_id = %request_id,
            run_id = tracing::field::Empty,
        );
        stream::events(span, move |events| async move {
            self.execute(request_id, &input, &ctx, &events).await
        })
    }

    /// Continues a stopped run from its latest checkpoint in a new run
    /// (`resumed_from = run_id`), seeded with its usage, tool-call count,
    /// turn number and verification reports. The admission moves to the new
    /// run by compare-and-swap at `expected_revision`. The run keeps the
    /// request's stored deadline and budget; a limit set in `ctx.budget`
    /// replaces the stored one from this run on, recorded in the new run
    /// ([`RunContext::budget`]).
    ///
    /// # Errors
    /// [`Error::BudgetExceeded`] naming `run_id` and the current revision,
    /// with nothing written, when the run stopped between turns with a
    /// budget it has spent and `ctx` does not raise it;
    /// [`Error::AmbiguousCheckpoint`] under [`ResumePolicy::RejectAmbiguous`]
    /// when a turn was in flight; [`Error::Conflict`] or [`Error::Busy`] when
    /// another owner won; [`Error::ConfigurationMismatch`] when the agent
    /// changed; [`Error::NotFound`] for an unknown run;
    /// [`Error::RequestAbandoned`] when its request was abandoned. Then as
    /// `run`. A run whose request is already committed is not an error: the
    /// request's stored outcome is returned, marked
    /// [`replayed`](Outcome::replayed), with no model or tool work and
    /// whatever `expected_revision` and `policy`.
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

    /// Like [`AgentSession::resume_run`], as an [`EventStream`] like
    /// [`AgentSession::stream`]'s: the new run's events from
    /// [`Event::RunStarted`] (with `resumed_from`) to
    /// [`Event::ConversationCommitted`]. A committed request yields only its
    /// replayed result.
    ///
    /// # Errors
    /// As [`AgentSession::resume_run`], as the stream's last item.
    ///
    /// # Cancel safety
    /// As [`AgentSession::stream`].
    pub fn resume_stream(
        &self,
        run_id: RunId,
        ctx: RunContext,
        expected_revision: Revision,
        policy: ResumePolicy,
    ) -> EventStream<'_> {
        let span = tracing::info_span!(
            "resume_stream",
            conversation_id = %self.conversation_id,
            from_run = %run_id,
            run_id = tracing::field::Empty,
        );
        stream::events(span, move |events| async move {
            self.resume(run_id, &ctx, expected_revision, policy, &events)
                .await
        })
    }

    /// Takes over a request whose owner is gone (the host says so): one
    /// compare-and-swap claims it (among competing recoverers exactly one
    /// wins), then its latest run is resumed. `input` must be the input the
    /// request was admitted with.
    ///
    /// # Errors
    /// As [`AgentSession::resume_run`], plus [`Error::RequestMismatch`] for
    /// another input, [`Error::RequestAbandoned`] for an abandoned request
    /// and [`Error::NotActive`] when the conversation's admission is found
    /// idle (the request ended in the meantime). A request that was already
    /// committed is not an error: its stored outcome is replayed, as by
    /// `run`.
    ///
    /// # Cancel safety
    /// As [`AgentSession::run`].
    #[instrument(skip_all, fields(conversation_id = %self.conversation_id, request_id = %request_id, run_id = tracing::field::Empty), err)]
    pub async fn recover_after_owner_exit(
        &self,
        request_id: RequestId,
        input: impl Into<Content>,
        ctx: RunContext,
        expected_revision: Revision,
        policy: ResumePolicy,
    ) -> Result<Outcome, Error> {
        self.recover(
            request_id,
            &input.into(),
            &ctx,
            expected_revision,
            policy,
            &Emitter::default(),
        )
        .await
    }

    /// Like [`AgentSession::recover_after_owner_exit`], as an
    /// [`EventStream`] like [`AgentSession::stream`]'s: the new run's events
    /// from [`Event::RunStarted`] (with `resumed_from`) to
    /// [`Event::ConversationCommitted`]. A committed request yields only its
    /// replayed result.
    ///
    /// # Errors
    /// As [`AgentSession::recover_after_owner_exit`], as the stream's last
    /// item.
    ///
    /// # Cancel safety
    /// As [`AgentSession::stream`].
    pub fn recover_stream(
        &self,
        request_id: RequestId,
        input: impl Into<Content>,
        ctx: RunContext,
        expected_revision: Revision,
        policy: ResumePolicy,
    ) -> EventStream<'_> {
        let input = input.into();
        let span = tracing::info_span!(
            "recover_stream",
            conversation_id = %self.conversation_id,
            request_id = %request_id,
            run_id = tracing::field::Empty,
        );
        stream::events(span, move |events| async move {
            self.recover(request_id, &input, &ctx, expected_revision, policy, &events)
                .await
        })
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
