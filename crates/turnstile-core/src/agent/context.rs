//! What a caller gives one run: budget, deadline, cancellation, metadata.

use std::collections::BTreeMap;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Limits counted over the whole request, across resumes: a resumed run is
/// seeded with what was already spent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    pub max_turns: Option<u32>,
    /// Input plus output tokens.
    pub max_tokens: Option<u64>,
    pub max_tool_calls: Option<u64>,
}

/// Per-call settings of `run`, `stream`, `resume_run` and
/// `recover_after_owner_exit`.
#[derive(Clone, Debug, Default)]
pub struct RunContext {
    pub budget: Budget,
    /// Interrupts a model or tool call in flight; the turn is left in flight
    /// only if a tool was interrupted.
    pub deadline: Option<Instant>,
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
    pub fn with_budget(mut self, budget: Budget) -> Self {
        self.budget = budget;
        self
    }

    pub fn with_deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    pub fn with_cancel(mut self, cancel: CancellationToken) -> Self {
        self.cancel = cancel;
        self
    }
}
