//! Admission of a new request: validation, replay of completed requests and
//! the claim of the idle admission.

use super::stream::Emitter;
use super::turns::first_turn;
use super::turns::first_turn_may_start;
use super::AgentSession;
use crate::agent::{Budget, RunContext};
use crate::error::Error;
use crate::ids::{RequestId, Revision, RunId};
use crate::message::{Content, Message};
use crate::outcome::Outcome;
use crate::store::{
    ClaimOutcome, Fence, InputHash, NewRequest, Recalled, RequestRecord, RequestStatus,
};

/// The largest input accepted, in bytes.
pub const MAX_INPUT_BYTES: usize = 1 << 20;

/// Claims raced by other requests that came and went are retried this often.
const CLAIM_ATTEMPTS: usize = 8;

enum Admitted {
    Replay(Outcome),
    /// With the window the model's context is made from when the claim
    /// saved the first turn's write-ahead.
    Claimed(Fence, Option<Window>),
}

/// The committed entries a claim's context is made from, the last `limit`
/// of the conversation, as read or remembered (`state.window`).
struct Window {
    limit: u32,
    state: Recalled,
}

impl AgentSession {
    pub(super) async fn execute(
        &self,
        request_id: RequestId,
        input: &Content,
        ctx: &RunContext,
        events: &Emitter,
    ) -> Result<Outcome, Error> {
        // A wall-clock deadline and the budget are stored with the claim;
        // this run keeps the earliest of its deadlines as one instant.
        let deadline_at = ctx.deadline_at_ms();
        let ctx = &ctx.with_deadlines(None);
        // Without summary passes to run first, the claim also saves the
        // first turn's write-ahead: one commit fewer per request.
        let first_turn_ahead = self.summary.is_none() && first_turn_may_start(&self.agent, ctx);
        match self
            .admit(request_id, input, first_turn_ahead, deadline_at, ctx.budget)
            .await?
        {
            Admitted::Replay(outcome) => Ok(outcome),
            Admitted::Claimed(fence, window) => {
                let input = Message::User {
                    content: input.clone(),
                };
                let prefix = window.as_ref().map(|w| self.window_prefix(&w.state.window));
                let outcome = self.drive_fresh(fence, input, prefix, ctx, events).await?;
                if let (Some(memory), Some(mut window)) = (self.store.claim_memory(), window) {
                    // The commit moved the revision on from the claim's.
                    window.state.revision = Revision(fence.revision.0 + 1);
                    let id = self.conversation_id;
                    let added = &outcome.messages;
                    memory.remember(&self.namespace, id, window.limit, window.state, added);
                }
                Ok(outcome)
            }
        }
    }

    async fn admit(
        &self,
        request_id: RequestId,
        input: &Content,
        first_turn_ahead: bool,
        deadline_at: Option<i64>,
        budget: Budget,
    ) -> Result<Admitted, Error> {
        self.validate(request_id, input)?;
        // Everything the claim depends on, read at once (one query where
        // the store can): the conversation (its namespace is judged first:
        // a replay must not cross it), whether the request is known, the
        // admission and, when the claim saves the first turn's write-ahead,
        // the model's context. The conversation is created only once the
        // request is known to be new, so a refusal writes nothing.
        let window = first_turn_ahead.then(|| self.policy.window());
        let hash = InputHash::of_content(input)?;
        if let Some(limit) = window {
            let recalled = self.claim_recalled(request_id, input, hash, limit, deadline_at, budget);
            if let Some(admitted) = recalled.await? {
                return Ok(admitted);
            }
        }
        let read = || {
            self.store
                .claim_context(&self.namespace, self.conversation_id, request_id, window)
        };
        let mut context = read().await?;
        if let Some(record) = context.request.take() {
            return self.existing(record, hash).await.map(Admitted::Replay);
        }
        if context.conversation.is_none() {
            self.store
                .ensure_conversation(&self.namespace, self.conversation_id)
                .await?;
            context = read().await?;
        }
        let mut attempt = 0;
        loop {
            attempt += 1;
            if attempt > 1 {
                context = read().await?;
            }
            // A request of this id that came meanwhile (a claim racing
            // this one) is answered from its row.
            if let Some(record) = context.request.take() {
                return self.existing(record, hash).await.map(Admitted::Replay);
            }
            let Some(admission) = context.admission.take() else {
                // Gone since it was read (deleted): the store says so.
                self.store
                    .conversation(&self.namespace, self.conversation_id)
                    .await?;
                return Err(Error::NotFound {
                    what: "conversation",
                    id: self.conversation_id.to_string(),
                });
            };
            if let Some(active) = admission.active {
                return Err(Error::Busy {
                    conversation_id: self.conversation_id,
                    request_id: active.request_id,
                    revision: admission.revision,
                });
            }
            // The context is read with the admission, at the revision the
            // claim expects: no commit can come between (a commit moves the
            // revision), and a damaged transcript refuses the request before
            // it holds the conversation or claims a turn in flight.
            let created_at = context.conversation.as_ref().map(|c| c.created_at);
            let window = window.zip(created_at).map(|(limit, created_at)| {
                let messages = std::mem::take(&mut context.window)
                    .into_iter()
                    .map(|entry| entry.message)
                    .collect();
                Window {
                    limit,
                    state: Recalled::read(admission.revision, created_at, messages),
                }
            });
            let claim = self.new_request(
                request_id,
                input,
                hash,
                (admission.revision, created_at),
                first_turn_ahead,
                deadline_at,
                budget,
            );
            match self.store.claim(&claim).await {
                Ok(ClaimOutcome::Admitted(fence)) => return Ok(Admitted::Claimed(fence, window)),
                Ok(ClaimOutcome::Existing(record)) => {
                    return self.existing(record, hash).await.map(Admitted::Replay)
                }
                // Another request was admitted and released in between:
                // read the admission again.
                Err(Error::Conflict { .. }) if attempt < CLAIM_ATTEMPTS => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The claim of a conversation whose last commit the store remembers,
    /// at the revision and with the window it remembers, without reading
    /// first (see [`ClaimMemory`](crate::store::ClaimMemory)). `None` when
    /// it remembers nothing or the claim was refused (the admission moved
    /// since, or the conversation is gone): the caller reads and claims as
    /// ever.
    async fn claim_recalled(
        &self,
        request_id: RequestId,
        input: &Content,
        hash: InputHash,
        limit: u32,
        deadline_at: Option<i64>,
        budget: Budget,
    ) -> Result<Option<Admitted>, Error> {
        let Some(recalled) = self
            .store
            .claim_memory()
            .and_then(|memory| memory.take(&self.namespace, self.conversation_id, limit))
        else {
            return Ok(None);
        };
        let claim = self.new_request(
            request_id,
            input,
            hash,
            (recalled.revision, Some(recalled.created_at)),
            true,
            deadline_at,
            budget,
        );
        match self.store.claim(&claim).await {
            Ok(ClaimOutcome::Admitted(fence)) => {
                let window = Window {
                    limit,
                    state: recalled,
                };
                Ok(Some(Admitted::Claimed(fence, Some(window))))
            }
            Ok(ClaimOutcome::Existing(record)) => self
                .existing(record, hash)
                .await
                .map(|o| Some(Admitted::Replay(o))),
            Err(
                Error::Conflict { .. }
                | Error::Busy { .. }
                | Error::NotFound { .. }
                | Error::Deleted { .. },
            ) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The claim of `request_id` at `expected`, the admission's revision
    /// and the conversation's creation time as read or remembered, saving
    /// its first turn's write-ahead when `first_turn_ahead`.
    #[allow(clippy::too_many_arguments)]
    fn new_request(
        &self,
        request_id: RequestId,
        input: &Content,
        hash: InputHash,
        (expected_revision, expected_created_at): (Revision, Option<i64>),
        first_turn_ahead: bool,
        deadline_at: Option<i64>,
        budget: Budget,
    ) -> NewRequest {
        let run_id = RunId::first_of(request_id);
        NewRequest {
            conversation_id: self.conversation_id,
            request_id,
            input_sha256: hash,
            input: Message::User {
                content: input.clone(),
            },
            expected_revision,
            expected_created_at,
            run_id,
            agent_fingerprint: self.fingerprint(),
            first_turn: first_turn_ahead.then(|| first_turn(run_id)),
            deadline_at,
            budget,
        }
    }

    /// A retry of a known request id: replay, or refuse without writing.
    pub(super) async fn existing(
        &self,
        record: RequestRecord,
        hash: InputHash,
    ) -> Result<Outcome, Error> {
        let request_id = record.request_id;
        self.check_binding(&record, hash)?;
        match record.status {
            RequestStatus::Completed => self.replay(record).await,
            RequestStatus::Abandoned => Err(Error::RequestAbandoned { request_id }),
            RequestStatus::Active => {
                let admission = self.store.admission(self.conversation_id).await?;
                Err(Error::Busy {
                    conversation_id: self.conversation_id,
                    request_id,
                    revision: admission.revision,
                })
            }
        }
    }

    /// A request id is bound to one conversation and one input.
    pub(super) fn check_binding(
        &self,
        record: &RequestRecord,
        hash: InputHash,
    ) -> Result<(), Error> {
        let reason = if record.conversation_id != self.conversation_id {
            "it belongs to another conversation"
        } else if record.input_sha256 != hash {
            "it is bound to another input"
        } else {
            return Ok(());
        };
        Err(Error::RequestMismatch {
            request_id: record.request_id,
            reason,
        })
    }

    /// The stored answer of a completed request; no model or tool work.
    pub(super) async fn replay(&self, record: RequestRecord) -> Result<Outcome, Error> {
        let stored = record.outcome.ok_or_else(|| Error::Corrupt {
            table: "requests",
            key: record.request_id.to_string(),
            reason: "completed without an outcome".into(),
        })?;
        let messages = self
            .store
            .transcript_range(self.conversation_id, stored.first_seq, stored.end_seq)
            .await?
            .into_iter()
            .map(|entry| entry.message)
            .collect();
        Ok(Outcome::from_stored(
            record.request_id,
            stored,
            messages,
            true,
        ))
    }

    pub(super) fn validate(&self, request_id: RequestId, input: &Content) -> Result<(), Error> {
        if request_id.as_uuid() == self.conversation_id.as_uuid() {
            return Err(Error::InvalidInput(format!(
                "request id {request_id} equals the conversation id"
            )));
        }
        let text = input.text();
        if text.trim().is_empty()
            && input
                .parts()
                .iter()
                .all(|part| part.placeholder().is_none())
        {
            return Err(Error::InvalidInput("input is empty".into()));
        }
        if text.len() > MAX_INPUT_BYTES {
            return Err(Error::InvalidInput(format!(
                "input of {} bytes of text exceeds the {MAX_INPUT_BYTES}-byte limit",
                text.len()
            )));
        }
        Ok(())
    }

    /// A request of this conversation (in this namespace).
    pub(super) async fn own_request(&self, request_id: RequestId) -> Result<RequestRecord, Error> {
        self.store
            .conversation(&self.namespace, self.conversation_id)
            .await?;
        let record = self
            .store
            .request(request_id)
            .await?
            .ok_or_else(|| Error::NotFound {
                what: "request",
                id: request_id.to_string(),
            })?;
        if record.conversation_id != self.conversation_id {
            return Err(Error::RequestMismatch {
                request_id,
                reason: "it belongs to another conversation",
            });
        }
        Ok(record)
    }

    /// The agent's fingerprint, with the summary settings when compaction
    /// is on (without it, the plain agent fingerprint: nothing changes for
    /// sessions that do not summarize).
    pub(super) fn fingerprint(&self) -> String {
        match &self.summary {
            None => self.agent.fingerprint(),
            Some(summary) => self.agent.fingerprint_with(&serde_json::json!({
                "summary_agent": summary.agent.fingerprint(),
                "max_passes": summary.max_passes.get(),
                "window": self.policy.window(),
                "summary_batch": self.policy.summary_batch(),
            })),
        }
    }
}
