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
    pub deadline: Option<Instant>,
    pub cancel: CancellationToken,
    /// Free-form caller data, recorded in tracing spans only.
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
