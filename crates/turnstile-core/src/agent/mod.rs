//! The agent: a model, its tools, a system prompt and limits. The loop that
//! runs it turn by turn is the session's (`session/turns.rs`).

mod approval;
mod arguments;
mod context;
mod model;
mod scripted;
mod tool;
mod verifier;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sha2::{Digest, Sha256};

pub use approval::ApprovalPolicy;
pub use context::{AgentUpgrade, Budget, RunContext};
pub use model::{Model, ModelRequest, ModelResponse, TextDeltas};
pub use scripted::{ScriptedModel, ScriptedReply};
pub use tool::{Reconciliation, Tool, ToolContext, ToolError};
pub use verifier::Verifier;

use crate::message::ToolSpec;
use approval::ApprovalRules;
use arguments::ArgumentCheck;

/// Limits of the agent itself (the caller's [`Budget`] may be tighter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentLimits {
    /// Turns per request, across resumes.
    pub max_turns: u32,
    /// Tool calls one model answer may ask for; extra calls are answered
    /// with an error result without running.
    pub max_tool_calls_per_turn: u32,
    /// How long one tool call may take before it is answered with a timeout
    /// error result.
    pub tool_timeout: Duration,
}

impl Default for AgentLimits {
    fn default() -> Self {
        Self {
            max_turns: 32,
            max_tool_calls_per_turn: 16,
            tool_timeout: Duration::from_secs(60),
        }
    }
}

/// A model with tools, a system prompt, limits and an optional verifier.
#[derive(Clone)]
pub struct Agent {
    pub(crate) model: Arc<dyn Model>,
    pub(crate) tools: Vec<Arc<dyn Tool>>,
    pub(crate) specs: Vec<ToolSpec>,
    /// Each tool's compiled parameter schema, beside it.
    checks: Vec<ArgumentCheck>,
    pub(crate) system_prompt: String,
    pub(crate) limits: AgentLimits,
    pub(crate) verifier: Option<Arc<dyn Verifier>>,
    approvals: ApprovalRules,
}

impl Agent {
    /// An agent of `model` with no tools, no system prompt and the default
    /// [`AgentLimits`].
    pub fn new(model: Arc<dyn Model>) -> Self {
        Self {
            model,
            tools: Vec::new(),
            specs: Vec::new(),
            checks: Vec::new(),
            system_prompt: String::new(),
            limits: AgentLimits::default(),
            verifier: None,
            approvals: ApprovalRules::default(),
        }
    }

    /// Sets the system prompt, the first message the model sees each turn.
    pub fn with_system_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.system_prompt = prompt.into();
        self
    }

    /// Adds a tool. A later tool with the same name replaces the earlier one.
    /// Every call's arguments are checked against its parameter schema
    /// before it runs: a mismatch (or a schema that is not valid JSON
    /// Schema) is an error result to the model, and the tool is not called.
    pub fn with_tool(mut self, tool: Arc<dyn Tool>) -> Self {
        let spec = tool.spec();
        let check = ArgumentCheck::compile(&spec.parameters);
        if let Some(i) = self.specs.iter().position(|s| s.name == spec.name) {
            self.tools[i] = tool;
            self.specs[i] = spec;
            self.checks[i] = check;
        } else {
            self.tools.push(tool);
            self.specs.push(spec);
            self.checks.push(check);
        }
        self
    }

    /// Adds a tool whose every call waits for a human's approval: when the
    /// model asks for it, the run stops at a clean point with
    /// [`Error::AwaitingApproval`](crate::Error::AwaitingApproval) (the
    /// admission stays held), and the call runs only once it is approved
    /// in the store (`AgentSession::approve`). A rejected call is answered
    /// with the reason as an error result and never runs.
    pub fn with_tool_requiring_approval(mut self, tool: Arc<dyn Tool>) -> Self {
        self.approvals.require(tool.spec().name);
        self.with_tool(tool)
    }

    /// Asks `policy` of every call (of any tool) whether it needs approval,
    /// on top of the tools added with
    /// [`Agent::with_tool_requiring_approval`]. A call whose arguments are
    /// not valid JSON, or of an unknown tool, never runs, so it needs none.
    pub fn with_approval_policy(mut self, policy: Arc<dyn ApprovalPolicy>) -> Self {
        self.approvals.set_policy(policy);
        self
    }

    /// Whether this call waits for approval before it runs.
    pub(crate) fn requires_approval(&self, tool: &str, arguments: &str) -> bool {
        if self.approvals.is_empty() || self.tool(tool).is_none() {
            return false;
        }
        match serde_json::from_str(arguments) {
            Ok(arguments) => self.approvals.requires_approval(tool, &arguments),
            Err(_) => false,
        }
    }

    /// Sets the agent's own limits.
    pub fn with_limits(mut self, limits: AgentLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Sets the verifier, asked after each tool round.
    pub fn with_verifier(mut self, verifier: Arc<dyn Verifier>) -> Self {
        self.verifier = Some(verifier);
        self
    }

    /// The agent's own limits.
    pub fn limits(&self) -> AgentLimits {
        self.limits
    }

    /// The tools as the model sees them, in the order they were added.
    pub fn tool_specs(&self) -> &[ToolSpec] {
        &self.specs
    }

    pub(crate) fn tool(&self, name: &str) -> Option<(&Arc<dyn Tool>, &ArgumentCheck)> {
        self.specs
            .iter()
            .position(|s| s.name == name)
            .map(|i| (&self.tools[i], &self.checks[i]))
    }

    /// SHA-256 over what defines the agent's plan: model name, system
    /// prompt, tool names and parameter schemas, which calls need approval,
    /// which tools are idempotent,
    /// plus `extra` (the summary settings). A request admitted with one fingerprint is never continued
    /// by an agent with another.
    pub fn fingerprint(&self) -> String {
        self.fingerprint_with(&serde_json::Value::Null)
    }

    pub(crate) fn fingerprint_with(&self, extra: &serde_json::Value) -> String {
        let tools: Vec<_> = self
            .specs
            .iter()
            .map(|s| json!({ "name": s.name, "parameters": s.parameters }))
            .collect();
        let mut canonical = json!({
            "model": self.model.name(),
            "system_prompt": self.system_prompt,
            "tools": tools,
            "extra": extra,
        });
        // Added only when set, so an agent without approvals keeps the
        // fingerprint it had before approvals existed (its held requests
        // still resume).
        if !self.approvals.is_empty() {
            canonical["approvals"] = self.approvals.fingerprint();
        }
        // Likewise for which tools run again when a recovery finds their
        // call in doubt.
        let idempotent: Vec<&str> = self
            .tools
            .iter()
            .zip(&self.specs)
            .filter(|(tool, _)| tool.idempotent())
            .map(|(_, spec)| spec.name.as_str())
            .collect();
        if !idempotent.is_empty() {
            canonical["idempotent"] = json!(idempotent);
        }
        let digest = Sha256::digest(canonical.to_string().as_bytes());
        digest.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("model", &self.model.name())
            .field(
                "tools",
                &self.specs.iter().map(|s| &s.name).collect::<Vec<_>>(),
            )
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}
