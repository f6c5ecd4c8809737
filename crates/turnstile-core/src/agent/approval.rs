//! Which tool calls wait for a human's approval before they run.

use std::collections::BTreeSet;
use std::sync::Arc;

/// Decides, from a call's tool and arguments, whether it needs approval.
/// Object-safe: agents hold it as `Arc<dyn ApprovalPolicy>`.
pub trait ApprovalPolicy: Send + Sync {
    /// A name for the policy. It is part of the agent fingerprint: a request
    /// held under one policy is not continued under another unless the
    /// caller accepts the change.
    fn name(&self) -> &str;

    /// Whether a call of `tool` with `arguments` needs approval.
    fn requires_approval(&self, tool: &str, arguments: &serde_json::Value) -> bool;
}

/// The agent's approval rules: tools that always need approval, and an
/// optional policy on arguments.
#[derive(Clone, Default)]
pub(crate) struct ApprovalRules {
    tools: BTreeSet<String>,
    policy: Option<Arc<dyn ApprovalPolicy>>,
}

impl ApprovalRules {
    pub(crate) fn require(&mut self, tool: String) {
        self.tools.insert(tool);
    }

    pub(crate) fn set_policy(&mut self, policy: Arc<dyn ApprovalPolicy>) {
        self.policy = Some(policy);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.tools.is_empty() && self.policy.is_none()
    }

    pub(crate) fn requires_approval(&self, tool: &str, arguments: &serde_json::Value) -> bool {
        self.tools.contains(tool)
            || self
                .policy
                .as_ref()
                .is_some_and(|p| p.requires_approval(tool, arguments))
    }

    /// What the fingerprint covers: the tool names, sorted, and the policy's
    /// name.
    pub(crate) fn fingerprint(&self) -> serde_json::Value {
        serde_json::json!({
            "tools": self.tools,
            "policy": self.policy.as_ref().map(|p| p.name()),
        })
    }
}
