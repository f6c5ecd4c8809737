//! The tool abstraction.

use async_trait::async_trait;

use crate::ids::{RequestId, RunId};
use crate::message::{Content, ToolSpec};

/// What a tool call knows about where it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolContext {
    /// The run executing the call.
    pub run_id: RunId,
    /// The request the call belongs to.
    pub request_id: RequestId,
    /// The request's turn that asked for it.
    pub turn: u32,
    /// The call's id, as the model gave it.
    pub call_id: String,
    /// `request/turn/call`: the same for every execution attempt of this call,
    /// across resumes and recoveries. Pass it to external services that
    /// deduplicate, since turnstile cannot fence them.
    pub idempotency_key: String,
}

/// A tool failed; the message is fed back to the model as an error result.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ToolError(pub String);

impl ToolError {
    /// A failure with `message` for the model.
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// A tool the model may call. Object-safe: agents hold it as `Arc<dyn Tool>`.
#[async_trait]
pub trait Tool: Send + Sync {
    /// Name, description and JSON-schema parameters, as the model sees them.
    fn spec(&self) -> ToolSpec;

    /// Runs the tool on parsed JSON arguments. Its output is text
    /// (`Ok(text.into())`) or parts: text, images and files
    /// (`Ok(Content::new(parts))`), stored with the call's journal entry
    /// and its tool message. Errors, timeouts and panics become error
    /// results for the model; they never crash the run.
    async fn call(
        &self,
        arguments: serde_json::Value,
        context: ToolContext,
    ) -> Result<Content, ToolError>;
}
