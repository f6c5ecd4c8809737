//! The chat-completions answers: the lenient structs they are read into
//! (the request is built in [`request`](crate::request)).
//!
//! Read leniently on purpose: OpenAI-compatible servers send null or missing
//! fields, `content` as a string, null or an array of parts, and `arguments`
//! as a string or an object. The strict generated types of crates like
//! async-openai refuse such answers, and their decoding errors quote the
//! offending value, which is model output; errors here never do (see
//! [`decode_error`](crate::errors::decode_error)).

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use turnstile_core::agent::ModelResponse;
use turnstile_core::message::{Content, Part, Reasoning, ToolCall, Usage};
use turnstile_core::ModelError;

use turnstile_model_http::{decode_error, json_kind};

use crate::errors::error_object;
use crate::extra::{Members, ANSWER_MEMBERS, CALL_MEMBERS};
use crate::OpenAiConfig;

/// The provider family of the reasoning this client reads and sends back.
pub(crate) const REASONING_PROVIDER: &str = "openai";

// The answer; every field may be missing or null.

#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct Completion {
    choices: Option<Vec<Choice>>,
    usage: Option<WireUsage>,
    error: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Choice {
    index: Option<u64>,
    /// Read as its text first, to keep the members this client does not
    /// read.
    message: Option<Box<RawValue>>,
    finish_reason: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireMessage {
    content: Option<Value>,
    /// Reasoning as most servers name it (vLLM, llama.cpp, DeepSeek).
    reasoning_content: Option<Value>,
    /// Reasoning as some gateways name it.
    reasoning: Option<Value>,
    tool_calls: Option<Vec<Box<RawValue>>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct WireToolCall {
    pub(crate) index: Option<u64>,
    pub(crate) id: Option<String>,
    pub(crate) function: Option<WireFunction>,
}

impl WireToolCall {
    /// A call (or a streamed fragment of one) from its text, with the
    /// members this client does not read.
    /// A decoding error says what was expected, never what came.
    pub(crate) fn read(raw: &RawValue) -> Result<(Self, Members), String> {
        let call =
            serde_json::from_str(raw.get()).map_err(|e| decode_error(&e, "a tool call object"))?;
        Ok((call, Members::unknown(raw, &CALL_MEMBERS)))
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct WireFunction {
    pub(crate) name: Option<String>,
    pub(crate) arguments: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct WireUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    prompt_tokens_details: Option<PromptTokensDetails>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct PromptTokensDetails {
    cached_tokens: Option<u64>,
}

impl WireUsage {
    pub(crate) fn into_usage(self) -> Usage {
        Usage {
            input_tokens: self.prompt_tokens.unwrap_or(0),
            output_tokens: self.completion_tokens.unwrap_or(0),
            cache_read_tokens: self
                .prompt_tokens_details
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
            cache_write_tokens: 0,
        }
    }
}

impl Completion {
    /// The answer of the first choice, or the error the server reported.
    pub(crate) fn into_response(self, config: &OpenAiConfig) -> Result<ModelResponse, ModelError> {
        if let Some(error) = &self.error {
            if !error.is_null() {
                return Err(error_object(config, error, "the chat completion response"));
            }
        }
        let choice = self
            .choices
            .unwrap_or_default()
            .into_iter()
            .min_by_key(|c| c.index.unwrap_or(0))
            .ok_or_else(|| ModelError::fatal("the chat completion response has no choices"))?;
        let usage = self.usage.map(WireUsage::into_usage).unwrap_or_default();
        // A cut or filtered answer is discarded; the tokens it spent count.
        check_finish(choice.finish_reason.as_ref().and_then(Value::as_str))
            .map_err(|e| e.with_usage(usage))?;
        let raw = choice
            .message
            .filter(|m| m.get() != "null")
            .ok_or_else(|| ModelError::fatal("the chat completion choice has no message"))?;
        let message: WireMessage = serde_json::from_str(raw.get()).map_err(|e| {
            ModelError::fatal(format!(
                "malformed chat completion response: {}",
                decode_error(&e, "a message object")
            ))
        })?;
        let provider_metadata = Members::unknown(&raw, &ANSWER_MEMBERS).into_metadata();
        let content = text_content(message.content)?;
        let reasoning = reasoning_text(message.reasoning_content, message.reasoning);
        let mut tool_calls = Vec::new();
        for (position, raw) in message
            .tool_calls
            .unwrap_or_default()
            .into_iter()
            .enumerate()
        {
            let (call, extra) = WireToolCall::read(&raw).map_err(|e| {
                ModelError::fatal(format!(
                    "malformed chat completion response: tool call {position}: {e}"
                ))
            })?;
            let function = call.function.unwrap_or_default();
            let mut arguments = String::new();
            push_arguments(&mut arguments, function.arguments);
            tool_calls.push(finish_call(
                position,
                call.id.unwrap_or_default(),
                function.name.unwrap_or_default(),
                arguments,
                extra,
            )?);
        }
        Ok(ModelResponse {
            content: answer_content(reasoning, content),
            tool_calls,
            provider_metadata,
            usage,
        })
    }
}

/// Refuses an answer the server did not let the model finish: one cut off
/// at the output limit or the context size (`finish_reason` `length`), or
/// withheld by a content filter (`content_filter`). Such an answer is
/// discarded whole: its text may stop mid-sentence and its last tool call
/// mid-arguments, so none of its tool calls may run. Not retryable: the same
/// request meets the same limit. Any other reason, or none, is a complete
/// answer.
pub(crate) fn check_finish(reason: Option<&str>) -> Result<(), ModelError> {
    let why = match reason {
        Some("length") => {
            "was cut off at the output token limit or the context size (finish_reason length)"
        }
        Some("content_filter") => {
            "was stopped by the server's content filter (finish_reason content_filter)"
        }
        _ => return Ok(()),
    };
    Err(ModelError::fatal(format!(
        "the chat completion {why}; the incomplete answer was discarded, its tool calls not run"
    )))
}

/// A message's `content`: a string, null, or an array of text parts.
fn text_content(content: Option<Value>) -> Result<String, ModelError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(text)) => Ok(text),
        Some(Value::Array(parts)) => Ok(parts
            .iter()
            .filter_map(|part| match part {
                Value::String(text) => Some(text.as_str()),
                part => part.get("text").and_then(Value::as_str),
            })
            .collect()),
        Some(other) => Err(ModelError::fatal(format!(
            "malformed chat completion response: message content is {}",
            json_kind(&other)
        ))),
    }
}

/// Reasoning as a server sent it: `reasoning_content`, else `reasoning`
/// (a server may send both, the same text twice); not a string is none.
pub(crate) fn reasoning_text(reasoning_content: Option<Value>, reasoning: Option<Value>) -> String {
    [reasoning_content, reasoning]
        .into_iter()
        .flatten()
        .find_map(|r| match r {
            Value::String(text) if !text.is_empty() => Some(text),
            _ => None,
        })
        .unwrap_or_default()
}

/// An answer's content: its reasoning (when the server sent any) before its
/// text, the text left out when it is empty and there is reasoning.
pub(crate) fn answer_content(reasoning: String, text: String) -> Content {
    if reasoning.is_empty() {
        return text.into();
    }
    let mut parts = vec![Part::Reasoning(Reasoning {
        provider: REASONING_PROVIDER.into(),
        text: Some(reasoning),
        signature: None,
        redacted: None,
    })];
    if !text.is_empty() {
        parts.push(Part::text(text));
    }
    Content::new(parts)
}

/// Appends a tool call's `arguments` (normally a JSON string; some servers
/// send the object itself).
pub(crate) fn push_arguments(arguments: &mut String, fragment: Option<Value>) {
    match fragment {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => arguments.push_str(&text),
        Some(other) => arguments.push_str(&other.to_string()),
    }
}

/// A complete tool call. A call without an id gets a generated one; a call
/// without arguments gets `{}`.
pub(crate) fn finish_call(
    position: usize,
    id: String,
    name: String,
    arguments: String,
    extra: Members,
) -> Result<ToolCall, ModelError> {
    if name.is_empty() {
        return Err(ModelError::fatal(format!(
            "malformed chat completion response: tool call {position} has no function name"
        )));
    }
    let id = if id.is_empty() {
        format!("call_{}", uuid::Uuid::new_v4().simple())
    } else {
        id
    };
    let arguments = if arguments.trim().is_empty() {
        "{}".to_owned()
    } else {
        arguments
    };
    Ok(ToolCall {
        id,
        name,
        arguments,
        provider_metadata: extra.into_metadata(),
    })
}

// A streamed answer: chunks of deltas, read as leniently.

#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct StreamChunk {
    pub(crate) choices: Option<Vec<StreamChoice>>,
    pub(crate) usage: Option<WireUsage>,
    pub(crate) error: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct StreamChoice {
    pub(crate) index: Option<u64>,
    /// Read as its text first, to keep the members this client does not
    /// read.
    pub(crate) delta: Option<Box<RawValue>>,
    pub(crate) finish_reason: Option<Value>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct StreamDelta {
    pub(crate) content: Option<String>,
    pub(crate) reasoning_content: Option<Value>,
    pub(crate) reasoning: Option<Value>,
    pub(crate) tool_calls: Option<Vec<Box<RawValue>>>,
}
