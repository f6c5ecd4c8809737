//! Taking over an active request: `resume_run` (by run) and
//! `recover_after_owner_exit` (by request).

use super::stream::Emitter;
use super::turns::spent_between_turns;
use super::{AgentSession, ResumePolicy};
use crate::agent::{AgentUpgrade, RunContext};
use crate::checkpoint::CheckpointPhase;
use crate::error::Error;
use crate::ids::{RequestId, Revision, RunId};
use crate::message::Content;
use crate::outcome::Outcome;
use crate::store::{AgentChange, InputHash, RecoveryClaim, RequestRecord, RequestStatus};

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
                    &record,
                    Some(run_id),
                    ctx,
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
        input: &Content,
        ctx: &RunContext,
        expected_revision: Revision,
        policy: ResumePolicy,
        events: &Emitter,
    ) -> Result<Outcome, Error> {
        self.validate(request_id, input)?;
        let record = self.own_request(request_id).await?;
        self.check_binding(&record, InputHash::of_content(input)?)?;
        match record.status {
            RequestStatus::Completed => self.replay(record).await,
            RequestStatus::Abandoned => Err(Error::RequestAbandoned { request_id }),
            RequestStatus::Active => {
                self.take_over(&record, None, ctx, expected_revision, policy, events)
                    .await
            }
        }
    }

    /// Checks everything that can be checked without writing, then claims
    /// the admission for a new run with one compare-and-swap. The run keeps
    /// the request's stored deadline and budget, the budget changed where
    /// `ctx` sets other limits.
    pub(super) async fn take_over(
        &self,
        record: &RequestRecord,
        from_run: Option<RunId>,
        ctx: &RunContext,
        expected_revision: Revision,
        policy: ResumePolicy,
        events: &Emitter,
    ) -> Result<Outcome, Error> {
        let request_id = record.request_id;
        let (ctx, budget_change) = ctx
            .with_deadlines(record.deadline_at)
            .with_stored_budget(record.budget);
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
        // Continued under a budget it has already spent, the request would
        // stop at once: refused before anything is written, so pasting the
        // same resume again never loops.
        let latest = self.store.latest_checkpoint(from_run).await?;
        if let Some(checkpoint) = &latest {
            if let Some((kind, used, limit)) = spent_between_turns(&self.agent, &ctx, checkpoint) {
                return Err(Error::BudgetExceeded {
                    run_id: from_run,
                    revision: admission.revision,
                    kind,
                    used,
                    limit,
                });
            }
        }
        // A tool round in flight: its call in doubt is reconciled first, by
        // the agent that ran it (an upgraded agent may have other tools or
        // rules, so which call was in doubt is not for it to say).
        let in_doubt = match &latest {
            Some(checkpoint)
                if checkpoint.phase == CheckpointPhase::ToolsInFlight && agent_change.is_none() =>
            {
                Some(
                    self.in_doubt(request_id, from_run, checkpoint, &ctx)
                        .await?,
                )
            }
            _ => None,
        };
        // The store refuses an in-flight turn under `RejectAmbiguous` inside
        // the claim's own transaction, so the check and the claim cannot race;
        // a resolved tool round is let through if it is still as read.
        let resolved = in_doubt.as_ref().and_then(|d| d.resolved());
        let fence = self
            .store
            .claim_recovery(&RecoveryClaim {
                conversation_id: self.conversation_id,
                request_id,
                expected_revision,
                from_run,
                new_run: RunId::new(),
                reject_in_flight: policy != ResumePolicy::RetryInterruptedTurn,
                retry_model_call: policy == ResumePolicy::RetryModelCall,
                resolved,
                agent_fingerprint: agent_change.as_ref().map(|c| c.to.clone()),
                budget_change,
            })
            .await?;
        self.drive_resumed(fence, from_run, agent_change, in_doubt, &ctx, events)
            .await
    }
}
