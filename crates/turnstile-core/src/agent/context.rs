//! What a caller gives one run: budget, deadline, cancellation, metadata.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::store::BudgetChange;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Limits counted over the whole request, across its runs: a resumed run is
/// seeded with what was already spent (the usage of failed and interrupted
/// runs included, as far as their last checkpoint). The budget is stored
/// with the request's claim, so every later run of it, in any process,
/// honours the same limits; see [`RunContext::budget`] for raising them.
/// The agent's own [`AgentLimits::max_turns`](crate::AgentLimits::max_turns)
/// caps the turns whatever the budget says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    /// Turns of the request (summary passes count as turns).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<u32>,
    /// Input plus output tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Tool calls of the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_calls: Option<u64>,
}

impl Budget {
    /// Whether no limit is set.
    pub fn is_unlimited(&self) -> bool {
        *self == Budget::default()
    }

    /// `stored` with each limit this budget sets in its place.
    fn over(self, stored: Budget) -> Budget {
        Budget {
            max_turns: self.max_turns.or(stored.max_turns),
            max_tokens: self.max_tokens.or(stored.max_tokens),
            max_tool_calls: self.max_tool_calls.or(stored.max_tool_calls),
        }
    }
}

/// Per-call settings of `run`, `stream`, `resume_run` and
/// `recover_after_owner_exit`.
#[derive(Clone, Debug, Default)]
pub struct RunContext {
    /// Limits over the whole request. `run` stores them with the request's
    /// claim. A resume or recovery (`resume_run`, `recover_after_owner_exit`,
    /// `continue_after_approval`, in any process) runs under the stored
    /// ones; each limit set here replaces the stored one from that run on
    /// (raised or lowered), and the run records the change
    /// ([`RunRecord::budget_change`](crate::store::RunRecord::budget_change)).
    /// A limit left `None` keeps the stored one.
    pub budget: Budget,
    /// Interrupts a model or tool call in flight; the turn is left in flight
    /// only if a tool was interrupted. A monotonic instant of this process:
    /// it is not stored, so a run resumed or recovered elsewhere (or after
    /// a restart) does not know it. Use [`RunContext::deadline_at`] for one
    /// that outlives the process.
    pub deadline: Option<Instant>,
    /// A wall-clock deadline, stored with the request by the run that admits
    /// it: every later run of the request (`resume_run`,
    /// `recover_after_owner_exit`, `continue_after_approval`, in any process)
    /// stops at the same moment, as with [`RunContext::deadline`]. Given to
    /// a resume or recovery it tightens the stored one for that run only.
    /// Where both are set the earlier wins.
    pub deadline_at: Option<SystemTime>,
    /// Whether a resume or recovery may continue a request that was admitted
    /// with another agent (model, prompt, tools). Ignored by `run`.
    pub agent_upgrade: AgentUpgrade,
    /// Cancels the run at its next clean point: a model call in flight is
    /// abandoned (it has no side effects; its cost may be lost), a tool call
    /// in flight finishes and is journaled first, and no new call starts. The
    /// turn's checkpoint is settled, so the default policy resumes it.
    pub cancel: CancellationToken,
    /// Free-form caller data carried with the run for the host's own use;
    /// turnstile neither stores nor logs it.
    pub metadata: BTreeMap<String, String>,
}

impl RunContext {
    /// Sets the request's budget.
    pub fn with_budget(mut self, budget: Budget) -> Self {
        self.budget = budget;
        self
    }

    /// Sets a deadline of this process ([`RunContext::deadline`]).
    pub fn with_deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Sets a wall-clock deadline stored with the request
    /// ([`RunContext::deadline_at`]).
    pub fn with_deadline_at(mut self, deadline: SystemTime) -> Self {
        self.deadline_at = Some(deadline);
        self
    }

    /// Says what a resume or recovery does with a request admitted by
    /// another agent.
    pub fn with_agent_upgrade(mut self, upgrade: AgentUpgrade) -> Self {
        self.agent_upgrade = upgrade;
        self
    }

    /// [`RunContext::deadline_at`] as Unix milliseconds, as it is stored.
    pub(crate) fn deadline_at_ms(&self) -> Option<i64> {
        self.deadline_at.map(|at| {
            let since = at.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
            i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
        })
    }

    /// This context with one monotonic deadline: the earliest of
    /// [`RunContext::deadline`], [`RunContext::deadline_at`] and `stored`
    /// (a request's stored deadline, Unix milliseconds). A wall-clock time
    /// is turned into an instant of this process once, here.
    pub(crate) fn with_deadlines(&self, stored: Option<i64>) -> RunContext {
        // A time past what `SystemTime` holds on this platform is no deadline.
        let stored =
            stored.and_then(|ms| UNIX_EPOCH.checked_add(Duration::from_millis(ms.max(0) as u64)));
        let wall = [self.deadline_at, stored].into_iter().flatten().min();
        let mut ctx = self.clone();
        if let Some(wall) = wall {
            let now = Instant::now();
            let at = match wall.duration_since(SystemTime::now()) {
                Ok(left) => now.checked_add(left),
                Err(_) => Some(now),
            };
            ctx.deadline = match (ctx.deadline, at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        ctx
    }

    /// This context under a request's stored budget, with the change when
    /// it sets other limits than `stored` (see [`RunContext::budget`]).
    pub(crate) fn with_stored_budget(&self, stored: Budget) -> (RunContext, Option<BudgetChange>) {
        let budget = self.budget.over(stored);
        let change = (budget != stored).then_some(BudgetChange {
            from: stored,
            to: budget,
        });
        let mut ctx = self.clone();
        ctx.budget = budget;
        (ctx, change)
    }

    /// Cancels the run when `cancel` is cancelled ([`RunContext::cancel`]).
    pub fn with_cancel(mut self, cancel: CancellationToken) -> Self {
        self.cancel = cancel;
        self
    }
}

/// What a resume or recovery does with a request admitted by another agent
/// (its fingerprint differs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AgentUpgrade {
    /// Refuse with [`Error::ConfigurationMismatch`](crate::Error::ConfigurationMismatch):
    /// a request is continued only by the agent that planned it.
    #[default]
    Refuse,
    /// Continue with this agent: the admission takes its fingerprint, the
    /// new run records the old and the new one
    /// ([`RunRecord::agent_change`](crate::store::RunRecord::agent_change)),
    /// and the stream says so ([`Event::AgentChanged`](crate::events::Event::AgentChanged)).
    /// The messages, journal and checkpoint are kept as they are: the new
    /// agent sees the request where the old one left it.
    Accept,
}
