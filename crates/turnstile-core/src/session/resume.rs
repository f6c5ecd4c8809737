//! Taking over an active request: `resume_run` (by run) and
//! `recover_after_owner_exit` (by request).

use super::stream::Emitter;
use super::{AgentSession, ResumePolicy};
use crate::agent::{AgentUpgrade, RunContext};
use crate::error::Error;
use crate::ids::{RequestId, Revision, RunId};
use crate::outcome::Outcome;
use crate::store::{AgentChange, InputHash, RecoveryClaim, RequestStatus};

impl AgentSession {
    pub(super) async fn resume(
        &self,
        run_id: RunId,
        ctx: &RunContext,
        expected_revision: Revision,
        policy: ResumePolicy,
        events: &Emitter,
    ) -> Result<Outcome, Error> {
        let run = self
            .store
            .run(run_id)
            .await?
            .ok_or_else(|| Error::NotFound {
                what: "run",
                id: run_id.to_string(),
            })?;
        let record = self.own_request(run.request_id).await?;
        match record.status {
            RequestStatus::Completed => self.replay(record).await,
            RequestStatus::Abandoned => Err(Error::RequestAbandoned {
                request_id: record.request_id,
            }),
            RequestStatus::Active => {
                self.take_over(
                    record.request_id,
                    Some(run_id),
                    &ctx.with_deadlines(record.deadline_at),
                    expected_revision,
                    policy,
                    events,
                )
                .await
            }
        }
    }

    pub(super) async fn recover(
        &self,
        request_id: RequestId,
        input: &str,
        ctx: &RunContext,
        expected_revision: Revision,
        policy: ResumePolicy,
        events: &Emitter,
    ) -> Result<Outcome, Error> {
        self.validate(request_id, input)?;
        let record = self.own_request(request_id).await?;
        self.check_binding(&record, InputHash::of(input))?;
        match record.status {
            RequestStatus::Completed => self.replay(record).await,
            RequestStatus::Abandoned => Err(Error::RequestAbandoned { request_id }),
            RequestStatus::Active => {
                let ctx = ctx.with_deadlines(record.deadline_at);
                self.take_over(request_id, None, &ctx, expected_revision, policy, events)
                    .await
            }
        }
    }

    /// Checks everything that can be checked without writing, then claims
    /// the admission for a new run with one compare-and-swap.
    pub(super) async fn take_over(
        &self,
        request_id: RequestId,
        from_run: Option<RunId>,
        ctx: &RunContext,
        expected_revision: Revision,
        policy: ResumePolicy,
        events: &Emitter,
    ) -> Result<Outcome, Error> {
        let admission = self.store.admission(self.conversation_id).await?;
        let active = match admission.active {
            Some(active) if active.request_id == request_id => active,
            Some(other) => {
                return Err(Error::Busy {
                    conversation_id: self.conversation_id,
                    request_id: other.request_id,
                    revision: admission.revision,
                })
            }
            None => return Err(Error::NotActive { request_id }),
        };
        let fingerprint = self.fingerprint();
        let agent_change = match active.agent_fingerprint == fingerprint {
            true => None,
            false if ctx.agent_upgrade == AgentUpgrade::Accept => Some(AgentChange {
                from: active.agent_fingerprint.clone(),
                to: fingerprint,
            }),
            false => return Err(Error::ConfigurationMismatch { request_id }),
        };
        if admission.revision != expected_revision {
            return Err(Error::Conflict {
                conversation_id: self.conversation_id,
                expected: expected_revision,
                actual: admission.revision,
            });
        }
        let from_run = from_run.unwrap_or(active.run_id);
        if from_run != active.run_id {
            // Only the run that owns the admission can be continued.
            return Err(Error::Busy {
                conversation_id: self.conversation_id,
                request_id,
                revision: admission.revision,
            });
        }
        // The store refuses an in-flight turn under `RejectAmbiguous` inside
        // the claim's own transaction, so the check and the claim cannot race.
        let fence = self
            .store
            .claim_recovery(&RecoveryClaim {
                conversation_id: self.conversation_id,
                request_id,
                expected_revision,
                from_run,
                new_run: RunId::new(),
                reject_in_flight: policy == ResumePolicy::RejectAmbiguous,
                agent_fingerprint: agent_change.as_ref().map(|c| c.to.clone()),
            })
            .await?;
        self.drive_resumed(fence, from_run, agent_change, ctx, events)
            .await
    }
}
