//! What a tool declares about itself, and the approval policy turnstile
//! derives from it.

use std::collections::BTreeMap;

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
}

/// Which of a server's tools need approval: what their annotations say
/// ([`Annotations::requires_approval`]) unless overridden here, per tool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct McpPolicy {
    approval: BTreeMap<String, bool>,
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
}
