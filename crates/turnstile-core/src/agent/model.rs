//! The model abstraction: messages and tool specs in, an assistant message
//! and its token usage out.

use async_trait::async_trait;
use tokio::time::Instant;

use crate::error::ModelError;
use crate::message::{Content, Message, ProviderMetadata, ToolCall, ToolSpec, Usage};

/// Receives text deltas while a model streams its answer.
pub type TextDeltas<'a> = &'a (dyn Fn(&str) + Send + Sync);

/// What the model is asked.
#[derive(Clone, Copy)]
pub struct ModelRequest<'a> {
    /// System prompt, summary, transcript window and the request's messages.
    pub messages: &'a [Message],
    /// The tools the model may call.
    pub tools: &'a [ToolSpec],
    /// Set when the caller wants text deltas (a stream); a model that cannot
    /// stream may ignore it.
    pub deltas: Option<TextDeltas<'a>>,
    /// When the run stops waiting for the answer (its deadline), if it has
    /// one: a model that waits to retry (a rate limit's `retry-after`)
    /// gives up at once rather than wait past it.
    pub deadline: Option<Instant>,
}

/// What the model answered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelResponse {
    /// The answer's parts: text, and reasoning to be sent back (may be
    /// empty when it calls tools). A `String` converts: `"text".into()`.
    pub content: Content,
    /// The tool calls it asks for.
    pub tool_calls: Vec<ToolCall>,
    /// What the provider attached to the answer and needs back.
    pub provider_metadata: Option<ProviderMetadata>,
    /// What the call cost.
    pub usage: Usage,
}

/// A language model. Object-safe: agents hold it as `Arc<dyn Model>`.
#[async_trait]
pub trait Model: Send + Sync {
    /// A stable name; part of the agent fingerprint checked on resume.
    fn name(&self) -> &str;

    /// Answers one turn.
    ///
    /// # Errors
    /// A [`ModelError`]; its `retryable` flag says whether trying again may
    /// help.
    async fn respond(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ModelError>;
}
