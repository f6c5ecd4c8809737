//! What a conversation is made of: messages, tool calls and token usage.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

pub use crate::attachment::{Attachment, BlobHash};
pub use crate::content::{Content, JsonText, Part, ProviderMetadata, Reasoning};

/// One message of a transcript. Serialized with a stable `role` tag.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    /// Instructions for the model.
    System {
        /// The instructions.
        content: Content,
    },
    /// What the user said.
    User {
        /// The user's text.
        content: Content,
    },
    /// The model's answer: text, reasoning and/or tool calls.
    Assistant {
        /// The answer's parts; may be empty when it only calls tools.
        content: Content,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        /// The tool calls it asks for.
        tool_calls: Vec<ToolCall>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        /// What the provider attached to the answer and needs back.
        provider_metadata: Option<ProviderMetadata>,
    },
    /// The result of one tool call, answering the call with `call_id`.
    Tool {
        /// The id of the call answered.
        call_id: String,
        /// The tool's output, or what went wrong.
        content: Content,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        /// Whether the call failed (the content says why).
        is_error: bool,
    },
}

impl Message {
    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Message::User {
            content: Content::from(content.into()),
        }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Message::System {
            content: Content::from(content.into()),
        }
    }

    /// An assistant message with text only.
    pub fn assistant(content: impl Into<String>) -> Self {
        Message::Assistant {
            content: Content::from(content.into()),
            tool_calls: Vec::new(),
            provider_metadata: None,
        }
    }

    /// An assistant message that calls tools, with text (may be empty).
    pub fn assistant_with_calls(content: impl Into<String>, tool_calls: Vec<ToolCall>) -> Self {
        Message::Assistant {
            content: Content::from(content.into()),
            tool_calls,
            provider_metadata: None,
        }
    }

    /// The result of the call `call_id`: its output, or what went wrong.
    pub fn tool(call_id: impl Into<String>, content: impl Into<Content>, is_error: bool) -> Self {
        Message::Tool {
            call_id: call_id.into(),
            content: content.into(),
            is_error,
        }
    }

    /// The message's role tag: `system`, `user`, `assistant` or `tool`.
    pub fn role(&self) -> &'static str {
        match self {
            Message::System { .. } => "system",
            Message::User { .. } => "user",
            Message::Assistant { .. } => "assistant",
            Message::Tool { .. } => "tool",
        }
    }

    /// The message's content: its parts.
    pub fn content(&self) -> &Content {
        match self {
            Message::System { content }
            | Message::User { content }
            | Message::Assistant { content, .. }
            | Message::Tool { content, .. } => content,
        }
    }

    /// The message's content, to change (to load its attachments' bytes,
    /// say).
    pub fn content_mut(&mut self) -> &mut Content {
        match self {
            Message::System { content }
            | Message::User { content }
            | Message::Assistant { content, .. }
            | Message::Tool { content, .. } => content,
        }
    }

    /// A user message of these parts (text, images, files).
    pub fn user_parts(parts: Vec<Part>) -> Self {
        Message::User {
            content: Content::new(parts),
        }
    }

    /// The message's text parts, joined (reasoning is not text).
    pub fn text(&self) -> Cow<'_, str> {
        self.content().text()
    }

    /// The tool calls of an assistant message (empty for every other role).
    pub fn tool_calls(&self) -> &[ToolCall] {
        match self {
            Message::Assistant { tool_calls, .. } => tool_calls,
            _ => &[],
        }
    }
}

/// A tool call the model asked for.
///
/// `arguments` is the JSON text exactly as the model produced it: a model may
/// produce invalid JSON, and the agent loop answers that with an error result
/// instead of failing the run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id, unique within its answer; a tool result names it.
    pub id: String,
    /// The tool asked for.
    pub name: String,
    /// The arguments, as JSON text.
    pub arguments: String,
    /// What the provider attached to the call and needs back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_metadata: Option<ProviderMetadata>,
}

impl ToolCall {
    /// A call with JSON arguments.
    pub fn new(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: serde_json::Value,
    ) -> Self {
        Self {
            id: id.into(),
            name: name.into(),
            arguments: arguments.to_string(),
            provider_metadata: None,
        }
    }
}

/// Token usage. Additions saturate at [`Usage::MAX_COUNT`] instead of
/// overflowing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens the model read (prompt).
    pub input_tokens: u64,
    /// Tokens the model wrote (answer).
    pub output_tokens: u64,
    /// Prompt tokens served from the provider's cache, as it reports them.
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the provider's cache, as it reports them.
    pub cache_write_tokens: u64,
}

impl Usage {
    /// The largest count a sum reaches: `i64::MAX`, the most every store
    /// keeps (a signed 64-bit column), so a run's usage is the same live
    /// and when its committed outcome is replayed.
    pub const MAX_COUNT: u64 = i64::MAX as u64;

    /// Input plus output tokens.
    pub fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// The sum of two usages, each count at most [`Usage::MAX_COUNT`].
    pub fn saturating_add(self, other: Usage) -> Usage {
        let add = |a: u64, b: u64| a.saturating_add(b).min(Self::MAX_COUNT);
        Usage {
            input_tokens: add(self.input_tokens, other.input_tokens),
            output_tokens: add(self.output_tokens, other.output_tokens),
            cache_read_tokens: add(self.cache_read_tokens, other.cache_read_tokens),
            cache_write_tokens: add(self.cache_write_tokens, other.cache_write_tokens),
        }
    }
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, other: Usage) {
        *self = self.saturating_add(other);
    }
}

/// A tool as the model sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The name the model calls it by; unique within an agent.
    pub name: String,
    /// What the tool does, for the model.
    pub description: String,
    /// JSON schema of the arguments.
    pub parameters: serde_json::Value,
}

/// What a [`Verifier`](crate::agent::Verifier) concluded after a tool round.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerificationReport {
    /// The turn whose tool round was verified.
    pub turn: u32,
    /// Whether the round passed.
    pub passed: bool,
    /// What the verifier found.
    pub detail: String,
}

/// The result of a tool call as journaled and shown to the model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The tool's output (text, images, files), or what went wrong.
    pub content: Content,
    /// Whether the call failed.
    pub is_error: bool,
}
