//! The Messages request: the body built from the transcript, the tool specs
//! and the configuration.
//!
//! Blocks are serialized one by one to JSON text: a tool call's input goes
//! back as the text the model wrote, and a paused answer's blocks go back
//! exactly as they came (see [`crate::AnthropicModel`]).

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use serde::Serialize;
use serde_json::value::{to_raw_value, RawValue};
use serde_json::{json, Map, Value};

use turnstile_core::agent::ModelRequest;
use turnstile_core::message::{Attachment, Content, Message, Part, ToolSpec};

use crate::wire::REASONING_PROVIDER;
use crate::AnthropicConfig;

/// A request body.
#[derive(Serialize)]
pub(crate) struct RequestBody<'a> {
    model: &'a str,
    max_tokens: u32,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    system: Vec<Box<RawValue>>,
    pub(crate) messages: Vec<WireMessage>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<Value>,
    stream: bool,
    #[serde(flatten)]
    extra: &'a Map<String, Value>,
}

/// One message of the body: its role and its blocks as JSON text.
#[derive(Serialize)]
pub(crate) struct WireMessage {
    role: &'static str,
    pub(crate) content: Vec<Box<RawValue>>,
}

impl WireMessage {
    /// An assistant message of these blocks, as the server sent them (a
    /// paused answer sent back to be continued).
    pub(crate) fn assistant(content: Vec<Box<RawValue>>) -> Self {
        Self {
            role: "assistant",
            content,
        }
    }
}

/// The body for `request`: system messages as the `system` blocks, the
/// others as alternating user and assistant messages (tool results are
/// user blocks), cache breakpoints where the configuration puts them.
pub(crate) fn request_body<'a>(
    config: &'a AnthropicConfig,
    request: &ModelRequest<'_>,
) -> RequestBody<'a> {
    let mut system = Vec::new();
    let mut messages: Vec<(&'static str, Vec<Block>)> = Vec::new();
    for message in request.messages {
        let (role, blocks) = match message {
            Message::System { content } => {
                system.extend(text_blocks(content));
                continue;
            }
            Message::User { content } => ("user", blocks(user_blocks(content))),
            Message::Assistant {
                content,
                tool_calls,
                ..
            } => {
                let mut blocks = blocks(assistant_blocks(content));
                blocks.extend(tool_calls.iter().map(|call| Block::ToolUse {
                    id: &call.id,
                    name: &call.name,
                    arguments: &call.arguments,
                    cached: false,
                }));
                ("assistant", blocks)
            }
            Message::Tool {
                call_id,
                content,
                is_error,
            } => {
                let mut result = json!({ "type": "tool_result", "tool_use_id": call_id });
                let mut blocks = tool_result_blocks(content);
                // The API refuses a failed result without content.
                if *is_error && blocks.is_empty() {
                    blocks.push(text_block("the tool failed without saying why"));
                }
                if !blocks.is_empty() {
                    result["content"] = Value::Array(blocks);
                }
                if *is_error {
                    result["is_error"] = Value::Bool(true);
                }
                ("user", vec![Block::Json(result)])
            }
        };
        if blocks.is_empty() {
            continue;
        }
        // The API wants the roles to alternate: tool results and the user's
        // next words are one user message.
        match messages.last_mut() {
            Some((last, previous)) if *last == role => previous.extend(blocks),
            _ => messages.push((role, blocks)),
        }
    }
    let cache = config.prompt_cache;
    if cache.system {
        mark_last(&mut system);
    }
    if cache.latest_turn {
        if let Some(block) = messages
            .last_mut()
            .and_then(|(_, blocks)| blocks.iter_mut().rev().find(|b| b.may_cache()))
        {
            block.cache();
        }
    }
    let mut tools: Vec<Value> = request.tools.iter().map(wire_tool).collect();
    if cache.tools {
        mark_last(&mut tools);
    }
    RequestBody {
        model: &config.model,
        max_tokens: config.max_tokens,
        system: system.iter().map(raw).collect(),
        messages: messages
            .into_iter()
            .map(|(role, blocks)| WireMessage {
                role,
                content: blocks.iter().map(Block::to_raw).collect(),
            })
            .collect(),
        tools,
        thinking: config
            .thinking_budget
            .map(|budget| json!({ "type": "enabled", "budget_tokens": budget })),
        stream: config.stream,
        extra: &config.extra_body,
    }
}

/// A block of a message: a JSON value, or a tool call whose input stays
/// the JSON text the model wrote.
enum Block<'a> {
    Json(Value),
    ToolUse {
        id: &'a str,
        name: &'a str,
        arguments: &'a str,
        cached: bool,
    },
}

/// A tool call's block as it is sent.
#[derive(Serialize)]
struct ToolUse<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    id: &'a str,
    name: &'a str,
    input: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<Value>,
}

impl Block<'_> {
    /// Whether a cache breakpoint may go on it (not on thinking blocks).
    fn may_cache(&self) -> bool {
        match self {
            Block::Json(block) => !matches!(
                block.get("type").and_then(Value::as_str),
                Some("thinking" | "redacted_thinking")
            ),
            Block::ToolUse { .. } => true,
        }
    }

    fn cache(&mut self) {
        match self {
            Block::Json(Value::Object(block)) => {
                block.insert("cache_control".into(), ephemeral());
            }
            Block::Json(_) => {}
            Block::ToolUse { cached, .. } => *cached = true,
        }
    }

    fn to_raw(&self) -> Box<RawValue> {
        match self {
            Block::Json(value) => raw(value),
            Block::ToolUse {
                id,
                name,
                arguments,
                cached,
            } => tool_use_block(id, name, arguments, *cached),
        }
    }
}

fn blocks<'a>(values: Vec<Value>) -> Vec<Block<'a>> {
    values.into_iter().map(Block::Json).collect()
}

fn ephemeral() -> Value {
    json!({ "type": "ephemeral" })
}

/// A tool call's block as JSON text, its input the text the model wrote
/// (for a request, and for a paused answer sent back).
pub(crate) fn tool_use_block(id: &str, name: &str, arguments: &str, cached: bool) -> Box<RawValue> {
    to_raw_value(&ToolUse {
        kind: "tool_use",
        id,
        name,
        input: &input(arguments),
        cache_control: cached.then(ephemeral),
    })
    .unwrap_or_default()
}

/// A tool call's input: the model's JSON text when it is an object, else
/// an empty object (the API takes nothing else).
fn input(arguments: &str) -> Box<RawValue> {
    match serde_json::from_str::<&RawValue>(arguments) {
        Ok(raw) if raw.get().starts_with('{') => raw.to_owned(),
        _ => to_raw_value(&Map::new()).unwrap_or_default(),
    }
}

/// A JSON value as JSON text; a value always serializes.
fn raw(value: &Value) -> Box<RawValue> {
    to_raw_value(value).unwrap_or_default()
}

/// Puts a cache breakpoint on the last of these blocks or tools.
fn mark_last(values: &mut [Value]) {
    if let Some(Value::Object(last)) = values.last_mut() {
        last.insert("cache_control".into(), ephemeral());
    }
}

fn text_block(text: &str) -> Value {
    json!({ "type": "text", "text": text })
}

/// Whether a text may be a block: the API refuses empty and
/// whitespace-only text blocks (an answer of blank lines is stored, and
/// left out here, or every later call of the conversation would fail).
fn has_text(text: &str) -> bool {
    !text.trim().is_empty()
}

/// Text parts as text blocks, other parts as their placeholders (for
/// content the API takes as text only: the system prompt). Empty texts
/// are left out: the API refuses empty text blocks.
fn text_blocks(content: &Content) -> Vec<Value> {
    content
        .parts()
        .iter()
        .filter_map(Part::as_text_or_placeholder)
        .filter(|text| has_text(text))
        .map(|text| text_block(&text))
        .collect()
}

/// The image types the API takes.
const IMAGE_TYPES: [&str; 4] = ["image/jpeg", "image/png", "image/gif", "image/webp"];

/// An image: its bytes base64-encoded, or its placeholder when its bytes
/// were not loaded (an image past the context's count) or its type is one
/// the API refuses (which would fail every later call of the
/// conversation).
fn image_block(part: &Part, attachment: &Attachment) -> Value {
    let media_type = essence(attachment.media_type());
    match attachment.bytes() {
        Some(bytes) if IMAGE_TYPES.contains(&media_type.as_str()) => json!({
            "type": "image",
            "source": {
                "type": "base64",
                "media_type": media_type,
                "data": BASE64.encode(bytes),
            },
        }),
        _ => text_block(&part.placeholder().unwrap_or_default()),
    }
}

/// A media type without its parameters, in lower case.
fn essence(media_type: &str) -> String {
    media_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// A user message's blocks: text, images (bytes or URL), PDFs and text
/// files as documents, other files as their placeholders.
fn user_blocks(content: &Content) -> Vec<Value> {
    content
        .parts()
        .iter()
        .filter_map(|part| match part {
            Part::Reasoning(_) => None,
            Part::Image(attachment) => Some(image_block(part, attachment)),
            Part::ImageUrl { url } => {
                Some(json!({ "type": "image", "source": { "type": "url", "url": url } }))
            }
            Part::File(attachment) => Some(document_block(part, attachment)),
            part => part.as_text().filter(|text| has_text(text)).map(text_block),
        })
        .collect()
}

/// A file: a PDF as a base64 document, text and JSON as a text document
/// titled by its name, anything else as its placeholder.
fn document_block(part: &Part, attachment: &Attachment) -> Value {
    let essence = essence(attachment.media_type());
    let source = match attachment.bytes() {
        Some(bytes) if essence == "application/pdf" => json!({
            "type": "base64",
            "media_type": "application/pdf",
            "data": BASE64.encode(bytes),
        }),
        Some(bytes)
            if essence.starts_with("text/")
                || essence == "application/json"
                || essence.ends_with("+json") =>
        {
            json!({
                "type": "text",
                "media_type": "text/plain",
                "data": String::from_utf8_lossy(bytes),
            })
        }
        _ => return text_block(&part.placeholder().unwrap_or_default()),
    };
    let mut block = json!({ "type": "document", "source": source });
    if let Some(name) = attachment.name() {
        block["title"] = json!(name);
    }
    block
}

/// An answer's blocks: this client's reasoning as the `thinking` or
/// `redacted_thinking` block it came as (signature and data exactly), text,
/// and placeholders for images. Reasoning of another provider, or this
/// provider's left in the context as a placeholder (no signature), is not
/// sent: the API takes only signed thinking back.
fn assistant_blocks(content: &Content) -> Vec<Value> {
    content
        .parts()
        .iter()
        .filter_map(|part| match part {
            Part::Reasoning(reasoning) if reasoning.provider == REASONING_PROVIDER => {
                match (&reasoning.redacted, &reasoning.signature) {
                    (Some(data), _) => Some(json!({ "type": "redacted_thinking", "data": data })),
                    (None, Some(signature)) => Some(json!({
                        "type": "thinking",
                        "thinking": reasoning.text.as_deref().unwrap_or(""),
                        "signature": signature,
                    })),
                    (None, None) => None,
                }
            }
            Part::Reasoning(_) => None,
            part => part
                .as_text_or_placeholder()
                .filter(|text| has_text(text))
                .map(|text| text_block(&text)),
        })
        .collect()
}

/// A tool result's blocks: text and images; other parts as placeholders.
fn tool_result_blocks(content: &Content) -> Vec<Value> {
    content
        .parts()
        .iter()
        .filter_map(|part| match part {
            Part::Image(attachment) => Some(image_block(part, attachment)),
            Part::ImageUrl { url } => {
                Some(json!({ "type": "image", "source": { "type": "url", "url": url } }))
            }
            part => part
                .as_text_or_placeholder()
                .filter(|text| has_text(text))
                .map(|text| text_block(&text)),
        })
        .collect()
}

fn wire_tool(spec: &ToolSpec) -> Value {
    json!({
        "name": spec.name,
        "description": spec.description,
        "input_schema": spec.parameters,
    })
}
