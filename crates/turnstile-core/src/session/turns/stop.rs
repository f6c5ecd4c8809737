//! How a run stops: the deadline and cancellation around each await, and
//! what is recorded when it stops, by choice or because a durable step
//! failed in the store.

use std::future::Future;

use super::{turn_limit, RunLoop};
use crate::agent::{Agent, RunContext};
use crate::checkpoint::{CheckpointPhase, LoopCheckpoint};
use crate::error::{Error, StoreError};
use crate::store::Fence;

impl RunLoop<'_> {
    /// Records why the run stopped. A stop the loop chose (not a crash)
    /// knows what was in flight: unless a tool was running, the turn's
    /// checkpoint is settled to a pending phase, so resuming with the default
    /// policy is not refused as ambiguous.
    pub(super) async fn record_stop(&mut self, error: &Error) {
        let settled = match self.checkpoint.phase {
            CheckpointPhase::TurnInFlight => Some(CheckpointPhase::ModelPending),
            CheckpointPhase::ToolsInFlight if !self.tool_running => {
                Some(CheckpointPhase::ToolsPending)
            }
            _ => None,
        };
        let settled = settled.map(|phase| LoopCheckpoint {
            phase,
            ..self.checkpoint.clone()
        });
        let message = error.to_string();
        if let Err(e) = self
            .store
            .fail_run(&self.fence, &message, settled.as_ref())
            .await
        {
            tracing::warn!(run_id = %self.fence.run_id, error = %e, "could not record run failure");
        }
    }

    /// Records a durable step that failed in the store (a full disk, an I/O
    /// error), when the store still takes a small write: the run is marked
    /// failed, so it counts as stuck at once, and unless a tool's effect
    /// may be unjournaled, its latest durable checkpoint is settled to a
    /// pending phase, so the default policy resumes it. What the database
    /// holds decides, not the loop's own state, which the failed step may
    /// have moved ahead.
    pub(super) async fn record_failed_step(&mut self, failure: &StoreError) {
        let durable: Option<LoopCheckpoint> = self
            .store
            .latest_checkpoint(self.fence.run_id)
            .await
            .unwrap_or_default();
        let settled = durable.and_then(|durable| {
            let phase = match durable.phase {
                // The model may have answered; its answer was not recorded
                // and no tool ran: calling it again repeats no effect.
                CheckpointPhase::TurnInFlight => CheckpointPhase::ModelPending,
                CheckpointPhase::ToolsInFlight if !self.tool_running => {
                    CheckpointPhase::ToolsPending
                }
                _ => return None,
            };
            // The usage of a model call whose answer was lost still counts.
            let usage = match durable.turn == self.checkpoint.turn {
                true => self.checkpoint.usage,
                false => durable.usage,
            };
            Some(LoopCheckpoint {
                phase,
                usage,
                ..durable
            })
        });
        let message = format!("a durable step failed: {failure}");
        if let Err(e) = self
            .store
            .fail_run(&self.fence, &message, settled.as_ref())
            .await
        {
            tracing::warn!(run_id = %self.fence.run_id, error = %e, "could not record the failed step");
        }
    }
}

/// Awaits `future` unless the run is cancelled or its deadline passes.
pub(in crate::session) async fn guarded<T>(
    ctx: &RunContext,
    fence: &Fence,
    future: impl Future<Output = T>,
) -> Result<T, Error> {
    tokio::select! {
        biased;
        _ = ctx.cancel.cancelled() => Err(Error::Cancelled {
            run_id: fence.run_id,
            revision: fence.revision,
        }),
        value = until_deadline(ctx, fence, future) => value,
    }
}

/// Awaits `future` unless the run's deadline passes. Cancellation does not
/// interrupt it: a started tool call finishes, so a cancelled run stops at
/// a clean point instead of aborting a side effect half way.
pub(super) async fn until_deadline<T>(
    ctx: &RunContext,
    fence: &Fence,
    future: impl Future<Output = T>,
) -> Result<T, Error> {
    let deadline = async {
        match ctx.deadline {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        biased;
        _ = deadline => Err(Error::DeadlineExceeded {
            run_id: fence.run_id,
            revision: fence.revision,
        }),
        value = future => Ok(value),
    }
}

/// Whether a request's first turn may start at once: the checks of a turn's
/// start that need no run (its turn limit, a token budget of zero, the
/// deadline, cancellation).
pub(in crate::session) fn first_turn_may_start(agent: &Agent, ctx: &RunContext) -> bool {
    turn_limit(agent, ctx) >= 1
        && ctx.budget.max_tokens != Some(0)
        && !ctx.cancel.is_cancelled()
        && !past_deadline(ctx)
}

/// Refuses to start work once the run is cancelled or past its deadline.
pub(in crate::session) fn check_stop(ctx: &RunContext, fence: &Fence) -> Result<(), Error> {
    if ctx.cancel.is_cancelled() {
        return Err(Error::Cancelled {
            run_id: fence.run_id,
            revision: fence.revision,
        });
    }
    if past_deadline(ctx) {
        return Err(Error::DeadlineExceeded {
            run_id: fence.run_id,
            revision: fence.revision,
        });
    }
    Ok(())
}

fn past_deadline(ctx: &RunContext) -> bool {
    ctx.deadline
        .is_some_and(|at| tokio::time::Instant::now() >= at)
}
