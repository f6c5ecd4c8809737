//! What a tool declares about itself, and the policy turnstile derives from
//! it: which calls need approval, and which run again when a crash leaves
//! them in doubt.

use std::collections::BTreeMap;
use std::time::Duration;

/// A tool's annotations, as its server declares them (`None` when it says
/// nothing). They are hints: a server may be wrong, so the policy derived
/// from them is the cautious one, and the caller may override it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Annotations {
    /// `readOnlyHint`: it changes nothing.
    pub read_only: Option<bool>,
    /// `destructiveHint`: it may destroy or overwrite.
    pub destructive: Option<bool>,
    /// `idempotentHint`: calling it again with the same arguments has no
    /// further effect.
    pub idempotent: Option<bool>,
    /// `openWorldHint`: it reaches outside the server (the web, say).
    pub open_world: Option<bool>,
}

impl Annotations {
    /// Whether a call needs approval by default: unless the tool says it
    /// is read-only and not destructive.
    pub fn requires_approval(&self) -> bool {
        self.read_only != Some(true) || self.destructive == Some(true)
    }

    /// Whether a call left in doubt by a crash runs again under the default
    /// recovery policy: when the tool says it is idempotent or read-only.
    pub fn retries_in_doubt(&self) -> bool {
        self.idempotent == Some(true) || self.read_only == Some(true)
    }
}

/// Which of a server's tools need approval, and which run again when a
/// crash leaves a call in doubt: what their annotations say
/// ([`Annotations::requires_approval`], [`Annotations::retries_in_doubt`])
/// unless overridden here, per tool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct McpPolicy {
    approval: BTreeMap<String, bool>,
    retry: BTreeMap<String, bool>,
    call_timeout: Option<Duration>,
}

impl McpPolicy {
    /// Calls of `tool` need approval, whatever it declares.
    pub fn require_approval(mut self, tool: impl Into<String>) -> Self {
        self.approval.insert(tool.into(), true);
        self
    }

    /// Calls of `tool` run without approval, whatever it declares.
    pub fn without_approval(mut self, tool: impl Into<String>) -> Self {
        self.approval.insert(tool.into(), false);
        self
    }

    /// A call the server has not answered within `limit` is in doubt: the
    /// run stops with its turn in flight, as if the server had gone away
    /// mid-call. By default nine tenths of the agent's tool timeout as it
    /// is when the tools are added, so that a slow call is in doubt rather
    /// than the timed-out error result the agent gives any tool (keep
    /// `limit` below the tool timeout for the same reason).
    pub fn call_timeout(mut self, limit: Duration) -> Self {
        self.call_timeout = Some(limit);
        self
    }

    /// How long a call may go unanswered before it is in doubt, for an
    /// agent whose tool timeout is `tool_timeout`.
    pub fn timeout(&self, tool_timeout: Duration) -> Duration {
        self.call_timeout.unwrap_or(tool_timeout * 9 / 10)
    }

    /// Whether a call of `tool` left in doubt by a crash runs again
    /// (`true`: the tool is treated as idempotent) or is ambiguous
    /// (`false`), whatever it declares.
    pub fn retry_in_doubt(mut self, tool: impl Into<String>, retry: bool) -> Self {
        self.retry.insert(tool.into(), retry);
        self
    }

    /// Whether a call of `tool`, which declares `annotations`, runs again
    /// when a crash leaves it in doubt and the server cannot reconcile it.
    pub fn retries_in_doubt(&self, tool: &str, annotations: &Annotations) -> bool {
        self.retry
            .get(tool)
            .copied()
            .unwrap_or_else(|| annotations.retries_in_doubt())
    }

    /// Whether calls of `tool`, which declares `annotations`, need
    /// approval.
    pub fn requires_approval(&self, tool: &str, annotations: &Annotations) -> bool {
        self.approval
            .get(tool)
            .copied()
            .unwrap_or_else(|| annotations.requires_approval())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_tools_that_say_they_change_nothing_run_without_approval() {
        let read_only = Annotations {
            read_only: Some(true),
            ..Annotations::default()
        };
        assert!(!read_only.requires_approval());
        for asks in [
            Annotations::default(),
            Annotations {
                idempotent: Some(true),
                destructive: Some(false),
                ..Annotations::default()
            },
            Annotations {
                read_only: Some(true),
                destructive: Some(true),
                ..Annotations::default()
            },
        ] {
            assert!(asks.requires_approval(), "{asks:?}");
        }
        let policy = McpPolicy::default()
            .without_approval("set_flag")
            .require_approval("lookup");
        assert!(!policy.requires_approval("set_flag", &Annotations::default()));
        assert!(policy.requires_approval("lookup", &read_only));
        assert!(!policy.requires_approval("other", &read_only));
    }

    #[test]
    fn only_tools_that_say_they_are_idempotent_or_read_only_run_again_in_doubt() {
        let says = |read_only, idempotent| Annotations {
            read_only,
            idempotent,
            ..Annotations::default()
        };
        assert!(says(Some(true), None).retries_in_doubt());
        assert!(says(None, Some(true)).retries_in_doubt());
        assert!(!says(None, None).retries_in_doubt());
        assert!(!says(Some(false), Some(false)).retries_in_doubt());
        let policy = McpPolicy::default()
            .retry_in_doubt("delete_file", true)
            .retry_in_doubt("lookup", false);
        assert!(policy.retries_in_doubt("delete_file", &says(None, None)));
        assert!(!policy.retries_in_doubt("lookup", &says(Some(true), None)));
        assert!(policy.retries_in_doubt("other", &says(Some(true), None)));
    }
}
