//! Human approval of tool calls: the pending calls, the decisions (each a
//! compare-and-swap on the admission's revision, kept in the store) and
//! continuing the request once every call is decided.

use tracing::instrument;

use super::stream::Emitter;
use super::{AgentSession, ResumePolicy};
use crate::agent::RunContext;
use crate::error::Error;
use crate::ids::{RequestId, Revision};
use crate::outcome::Outcome;
use crate::store::{
    ApprovalDecision, PendingApproval, RequestStatus, Verdict, MAX_REJECTION_REASON_BYTES,
};

impl AgentSession {
    /// The tool calls of this conversation that wait for a decision, oldest
    /// first, each with the revision a decision must name.
    #[instrument(skip_all, fields(conversation_id = %self.conversation_id), err)]
    pub async fn pending_approvals(&self) -> Result<Vec<PendingApproval>, Error> {
        self.store
            .conversation(&self.namespace, self.conversation_id)
            .await?;
        self.store
            .pending_approvals(Some(self.conversation_id))
            .await
    }

    /// Approves one awaiting tool call of an active request: the next run
    /// that continues the request executes it (once: its result is
    /// journaled). One compare-and-swap at `expected_revision`, which moves
    /// the revision on (any run of the request still alive is fenced).
    /// Returns the new revision.
    ///
    /// # Errors
    /// [`Error::Conflict`] for a stale revision, [`Error::NotActive`] for a
    /// request that holds no admission, [`Error::Busy`] while a run of the
    /// request goes on (one that took it over, say, and may be executing
    /// calls decided before: decide once it has stopped),
    /// [`Error::NoPendingApproval`] for a call that awaits no decision
    /// (decided already, or not asked for). Nothing is written.
    #[instrument(skip_all, fields(conversation_id = %self.conversation_id, request_id = %request_id, call_id), err)]
    pub async fn approve(
        &self,
        request_id: RequestId,
        call_id: &str,
        expected_revision: Revision,
    ) -> Result<Revision, Error> {
        self.decide(request_id, call_id, expected_revision, Verdict::Approve)
            .await
    }

    /// Rejects one awaiting tool call: it never runs, and the next run that
    /// continues the request gives the model `reason` as the call's error
    /// result. As [`AgentSession::approve`] otherwise; a reason longer than
    /// [`MAX_REJECTION_REASON_BYTES`] is [`Error::InvalidInput`].
    ///
    /// # Errors
    /// As [`AgentSession::approve`], [`Error::Busy`] included: no decision
    /// is written while a run of the request goes on.
    #[instrument(skip_all, fields(conversation_id = %self.conversation_id, request_id = %request_id, call_id), err)]
    pub async fn reject(
        &self,
        request_id: RequestId,
        call_id: &str,
        expected_revision: Revision,
        reason: &str,
    ) -> Result<Revision, Error> {
        if reason.len() > MAX_REJECTION_REASON_BYTES {
            return Err(Error::InvalidInput(format!(
                "a rejection reason of {} bytes exceeds the {MAX_REJECTION_REASON_BYTES}-byte limit",
                reason.len()
            )));
        }
        let verdict = Verdict::Reject {
            reason: reason.to_owned(),
        };
        self.decide(request_id, call_id, expected_revision, verdict)
            .await
    }

    /// Continues a request whose run stopped for approval, once every call
    /// it asked about is decided: a new run takes the admission by
    /// compare-and-swap at `expected_revision` (the revision the last
    /// decision returned), runs each approved call, answers each rejected
    /// one with its reason, and goes on to the commit. The same as
    /// [`AgentSession::resume_run`] of the request's current run under
    /// [`ResumePolicy::RejectAmbiguous`], from any process.
    ///
    /// # Errors
    /// [`Error::AwaitingApproval`] (nothing written) while a call still
    /// awaits its decision; otherwise as [`AgentSession::resume_run`].
    #[instrument(skip_all, fields(conversation_id = %self.conversation_id, request_id = %request_id, run_id = tracing::field::Empty), err)]
    pub async fn continue_after_approval(
        &self,
        request_id: RequestId,
        ctx: RunContext,
        expected_revision: Revision,
    ) -> Result<Outcome, Error> {
        self.continue_request(request_id, ctx, expected_revision, &Emitter::default())
            .await
    }

    /// Like [`AgentSession::continue_after_approval`], as an
    /// [`EventStream`](super::EventStream) like
    /// [`AgentSession::resume_stream`]'s. A committed request yields only
    /// its replayed result.
    ///
    /// # Errors
    /// As [`AgentSession::continue_after_approval`], as the stream's last
    /// item.
    pub fn continue_stream(
        &self,
        request_id: RequestId,
        ctx: RunContext,
        expected_revision: Revision,
    ) -> super::EventStream<'_> {
        let span = tracing::info_span!(
            "continue_stream",
            conversation_id = %self.conversation_id,
            request_id = %request_id,
            run_id = tracing::field::Empty,
        );
        super::stream::events(span, move |events| async move {
            self.continue_request(request_id, ctx, expected_revision, &events)
                .await
        })
    }

    async fn continue_request(
        &self,
        request_id: RequestId,
        ctx: RunContext,
        expected_revision: Revision,
        events: &Emitter,
    ) -> Result<Outcome, Error> {
        let record = self.own_request(request_id).await?;
        match record.status {
            RequestStatus::Completed => return self.replay(record).await,
            RequestStatus::Abandoned => return Err(Error::RequestAbandoned { request_id }),
            RequestStatus::Active => {}
        }
        let pending: Vec<PendingApproval> = self
            .store
            .pending_approvals(Some(self.conversation_id))
            .await?
            .into_iter()
            .filter(|p| p.request_id == request_id)
            .collect();
        if let Some(first) = pending.first() {
            return Err(Error::AwaitingApproval {
                request_id,
                run_id: first.run_id,
                revision: first.revision,
                pending,
            });
        }
        self.take_over(
            &record,
            None,
            &ctx,
            expected_revision,
            ResumePolicy::RejectAmbiguous,
            events,
        )
        .await
    }

    async fn decide(
        &self,
        request_id: RequestId,
        call_id: &str,
        expected_revision: Revision,
        verdict: Verdict,
    ) -> Result<Revision, Error> {
        self.own_request(request_id).await?;
        self.store
            .decide_approval(&ApprovalDecision {
                conversation_id: self.conversation_id,
                request_id,
                call_id: call_id.to_owned(),
                expected_revision,
                verdict,
            })
            .await
    }
}
