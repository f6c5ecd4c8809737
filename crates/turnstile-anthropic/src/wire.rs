//! The Messages answers: a response's blocks read into an answer, its stop
//! reason checked and its usage counted.
//!
//! Read leniently (missing or null fields are defaults) and never quoted
//! into errors: what the server sends is model output.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use turnstile_core::agent::ModelResponse;
use turnstile_core::message::{Content, Part, Reasoning, ToolCall, Usage};
use turnstile_core::ModelError;
use turnstile_model_http::decode_error;

use crate::request::tool_use_block;

/// The provider family of the reasoning this client reads and sends back.
pub(crate) const REASONING_PROVIDER: &str = "anthropic";

/// A non-streamed response.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct WireResponse {
    pub(crate) content: Option<Vec<Box<RawValue>>>,
    pub(crate) stop_reason: Option<String>,
    pub(crate) usage: Option<WireUsage>,
}

/// Token counts as the API reports them: `input_tokens` leaves out the
/// tokens written to and read from the cache.
#[derive(Deserialize, Default, Clone, Copy)]
#[serde(default)]
pub(crate) struct WireUsage {
    pub(crate) input_tokens: Option<u64>,
    pub(crate) output_tokens: Option<u64>,
    pub(crate) cache_creation_input_tokens: Option<u64>,
    pub(crate) cache_read_input_tokens: Option<u64>,
}

impl WireUsage {
    /// These counts where they are given, `earlier`'s elsewhere (a
    /// stream's final counts over its first).
    pub(crate) fn over(self, earlier: WireUsage) -> WireUsage {
        WireUsage {
            input_tokens: self.input_tokens.or(earlier.input_tokens),
            output_tokens: self.output_tokens.or(earlier.output_tokens),
            cache_creation_input_tokens: self
                .cache_creation_input_tokens
                .or(earlier.cache_creation_input_tokens),
            cache_read_input_tokens: self
                .cache_read_input_tokens
                .or(earlier.cache_read_input_tokens),
        }
    }

    /// As turnstile counts: `input_tokens` is every token the model read,
    /// cached or not (as OpenAI-compatible servers count it), of which
    /// `cache_write_tokens` were written to the cache and
    /// `cache_read_tokens` read from it.
    pub(crate) fn into_usage(self) -> Usage {
        let write = self.cache_creation_input_tokens.unwrap_or(0);
        let read = self.cache_read_input_tokens.unwrap_or(0);
        Usage {
            input_tokens: self
                .input_tokens
                .unwrap_or(0)
                .saturating_add(write)
                .saturating_add(read),
            output_tokens: self.output_tokens.unwrap_or(0),
            cache_read_tokens: read,
            cache_write_tokens: write,
        }
    }
}

/// One block of an answer.
#[derive(Debug)]
pub(crate) enum AnswerBlock {
    Text(String),
    Thinking {
        thinking: String,
        signature: String,
    },
    RedactedThinking(String),
    ToolUse {
        id: String,
        name: String,
        input: String,
    },
    /// A block this client does not read (a server tool's use or result),
    /// as the server sent it: sent back only to continue a paused answer.
    Other(Box<RawValue>),
}

/// A block's fields, read without an internally tagged enum: those
/// buffer their input, which a raw tool input cannot be read from.
#[derive(Deserialize, Default)]
#[serde(default)]
struct BlockFields {
    #[serde(rename = "type")]
    kind: Option<String>,
    text: Option<String>,
    thinking: Option<String>,
    signature: Option<String>,
    data: Option<String>,
    id: Option<String>,
    name: Option<String>,
    input: Option<Box<RawValue>>,
}

impl AnswerBlock {
    /// Reads one block of a response.
    pub(crate) fn read(raw: Box<RawValue>) -> Result<AnswerBlock, ModelError> {
        let block: BlockFields = serde_json::from_str(raw.get()).map_err(|e| {
            ModelError::fatal(format!(
                "malformed messages response: {}",
                decode_error(&e, "a content block object")
            ))
        })?;
        Ok(match block.kind.as_deref() {
            Some("text") => AnswerBlock::Text(block.text.unwrap_or_default()),
            Some("thinking") => AnswerBlock::Thinking {
                thinking: block.thinking.unwrap_or_default(),
                signature: block.signature.unwrap_or_default(),
            },
            Some("redacted_thinking") => {
                AnswerBlock::RedactedThinking(block.data.unwrap_or_default())
            }
            Some("tool_use") => AnswerBlock::ToolUse {
                id: block.id.unwrap_or_default(),
                name: block.name.unwrap_or_default(),
                input: block
                    .input
                    .map_or_else(|| "{}".to_owned(), |raw| raw.get().to_owned()),
            },
            _ => AnswerBlock::Other(raw),
        })
    }

    /// The block as JSON text, to send a paused answer back.
    pub(crate) fn to_raw(&self) -> Box<RawValue> {
        use serde_json::json;
        let value = match self {
            AnswerBlock::Other(raw) => return raw.clone(),
            AnswerBlock::Text(text) => json!({ "type": "text", "text": text }),
            AnswerBlock::Thinking {
                thinking,
                signature,
            } => json!({ "type": "thinking", "thinking": thinking, "signature": signature }),
            AnswerBlock::RedactedThinking(data) => {
                json!({ "type": "redacted_thinking", "data": data })
            }
            AnswerBlock::ToolUse { id, name, input } => {
                return tool_use_block(id, name, input, false);
            }
        };
        serde_json::value::to_raw_value(&value).unwrap_or_default()
    }
}

/// Refuses an answer the model was not let finish.
pub(crate) fn check_stop(reason: Option<&str>, max_tokens: u32) -> Result<(), ModelError> {
    let why = match reason {
        Some("max_tokens") => {
            format!("was cut off at max_tokens ({max_tokens}; raise it if the answers need more)")
        }
        Some("refusal") => "was refused by the model (stop_reason refusal)".to_owned(),
        Some("model_context_window_exceeded") => {
            "was cut off at the model's context window (stop_reason \
             model_context_window_exceeded)"
                .to_owned()
        }
        _ => return Ok(()),
    };
    Err(ModelError::fatal(format!(
        "the anthropic answer {why}; the incomplete answer was discarded, its tool calls not run"
    )))
}

/// The answer these blocks make: text and reasoning parts in their order,
/// tool calls, usage.
pub(crate) fn into_response(
    blocks: Vec<AnswerBlock>,
    usage: Usage,
) -> Result<ModelResponse, ModelError> {
    let mut parts = Vec::new();
    let mut tool_calls = Vec::new();
    for block in blocks {
        match block {
            AnswerBlock::Text(text) if text.is_empty() => {}
            // Text split by a pause (or by citations) reads as one text,
            // as it streamed.
            AnswerBlock::Text(text) => match parts.last_mut() {
                Some(Part::Text { text: last }) => last.push_str(&text),
                _ => parts.push(Part::text(text)),
            },
            AnswerBlock::Thinking {
                thinking,
                signature,
            } => parts.push(Part::Reasoning(Reasoning {
                provider: REASONING_PROVIDER.into(),
                text: Some(thinking),
                // Kept even when empty (servers that imitate the API sign
                // nothing): its presence marks a thinking block to send
                // back.
                signature: Some(signature),
                redacted: None,
            })),
            AnswerBlock::RedactedThinking(data) => parts.push(Part::Reasoning(Reasoning {
                provider: REASONING_PROVIDER.into(),
                text: None,
                signature: None,
                redacted: Some(data),
            })),
            AnswerBlock::ToolUse { id, name, input } => {
                let position = tool_calls.len() + 1;
                if id.is_empty() {
                    return Err(ModelError::fatal(format!(
                        "malformed messages response: tool use {position} has no id"
                    )));
                }
                if name.is_empty() {
                    return Err(ModelError::fatal(format!(
                        "malformed messages response: tool use {position} has no name"
                    )));
                }
                tool_calls.push(ToolCall {
                    id,
                    name,
                    arguments: input,
                    provider_metadata: None,
                });
            }
            AnswerBlock::Other(_) => {}
        }
    }
    Ok(ModelResponse {
        content: Content::new(parts),
        tool_calls,
        provider_metadata: None,
        usage,
    })
}

/// The human-readable part of an error object: `error.message`, then its
/// `type`.
pub(crate) fn error_text(body: &Value) -> (Option<String>, Option<String>) {
    let error = body.get("error").unwrap_or(body);
    let kind = error.get("type").and_then(Value::as_str).map(str::to_owned);
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .map(str::to_owned);
    (kind, message)
}
