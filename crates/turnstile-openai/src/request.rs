//! The chat-completions request: the body built from the transcript, the
//! tool specs and the configuration.

use std::borrow::Cow;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use serde::Serialize;
use serde_json::value::{to_raw_value, RawValue};
use serde_json::{json, Map, Value};

use turnstile_core::agent::ModelRequest;
use turnstile_core::message::{Attachment, Content, Message, Part, ToolSpec};

use crate::extra::{Members, ANSWER_MEMBERS, CALL_MEMBERS};
use crate::wire::REASONING_PROVIDER;
use crate::{OpenAiConfig, ReasoningReplay};

/// Extra body members that only mean something with tools.
const TOOL_MEMBERS: [&str; 2] = ["tool_choice", "parallel_tool_calls"];

/// A request body. The messages are JSON text: an answer's provider
/// metadata goes back into its message as the server sent it.
#[derive(Serialize)]
pub(crate) struct RequestBody {
    model: String,
    messages: Vec<Box<RawValue>>,
    #[serde(flatten)]
    rest: Map<String, Value>,
}

/// The request body: the transcript, the tools, the stream options when
/// `stream`, and the configuration's extra members.
pub(crate) fn request_body(
    config: &OpenAiConfig,
    request: &ModelRequest<'_>,
    stream: bool,
) -> RequestBody {
    let mut body = Map::new();
    // The current tool cycle: the answers after the last user message.
    let cycle_start = request
        .messages
        .iter()
        .rposition(|m| matches!(m, Message::User { .. }))
        .map_or(0, |i| i + 1);
    let messages = request.messages.iter().enumerate().map(|(i, message)| {
        let replay = match config.reasoning_replay {
            ReasoningReplay::Always => true,
            ReasoningReplay::CurrentToolCycle => i >= cycle_start,
            ReasoningReplay::Never => false,
        };
        wire_message(message, replay)
    });
    let messages = messages.collect();
    if !request.tools.is_empty() {
        body.insert(
            "tools".into(),
            request.tools.iter().map(wire_tool).collect(),
        );
    }
    if let Some(max) = config.max_output_tokens {
        body.insert("max_tokens".into(), json!(max));
    }
    if stream {
        body.insert("stream".into(), Value::Bool(true));
        body.insert("stream_options".into(), json!({ "include_usage": true }));
    }
    // The reserved members are refused by `OpenAiModel::new`.
    for (name, value) in &config.extra_body {
        if request.tools.is_empty() && TOOL_MEMBERS.contains(&name.as_str()) {
            continue;
        }
        body.insert(name.clone(), value.clone());
    }
    RequestBody {
        model: config.model.clone(),
        messages,
        rest: body,
    }
}

/// A message's text parts as one string, each on its own line, with a
/// placeholder for each image or file (`[image: image/png, 34 KiB]`): a
/// placeholder stays apart from the text around it. For the messages whose
/// content the protocol takes as text only (system, assistant, tool).
fn wire_text(content: &Content) -> Cow<'_, str> {
    if let Some(text) = content.as_plain_text() {
        return Cow::Borrowed(text);
    }
    let texts: Vec<Cow<'_, str>> = content
        .parts()
        .iter()
        .filter_map(Part::as_text_or_placeholder)
        .collect();
    Cow::Owned(texts.join("\n"))
}

/// A user message's content: its text as a string, or, when it holds
/// images or files, an array of parts (`text`, `image_url` with the URL or
/// a base64 data URL, `file` with a data URL and its name, a text file as
/// `text` headed by its name). An attachment
/// whose bytes were not loaded (an image past the context's count is a
/// placeholder already) goes as its placeholder.
fn user_content(content: &Content) -> Value {
    if !content
        .parts()
        .iter()
        .any(|part| matches!(part, Part::Image(_) | Part::ImageUrl { .. } | Part::File(_)))
    {
        return Value::String(wire_text(content).into_owned());
    }
    let data_url = |attachment: &Attachment, bytes: &[u8]| {
        format!(
            "data:{};base64,{}",
            attachment.media_type(),
            BASE64.encode(bytes)
        )
    };
    let parts = content
        .parts()
        .iter()
        .filter_map(|part| match part {
            Part::ImageUrl { url } => {
                Some(json!({ "type": "image_url", "image_url": { "url": url } }))
            }
            Part::Image(attachment) => Some(match attachment.bytes() {
                Some(bytes) => json!({
                    "type": "image_url",
                    "image_url": { "url": data_url(attachment, bytes) },
                }),
                None => json!({ "type": "text", "text": part.placeholder() }),
            }),
            Part::File(attachment) => Some(match attachment.bytes() {
                // Servers take documents (PDF) as files; text as text.
                Some(bytes) if is_text(attachment.media_type()) => {
                    let text = String::from_utf8_lossy(bytes);
                    let text = match attachment.name() {
                        Some(name) => format!("{name}:\n{text}"),
                        None => text.into_owned(),
                    };
                    json!({ "type": "text", "text": text })
                }
                Some(bytes) => {
                    let mut file = json!({ "file_data": data_url(attachment, bytes) });
                    if let Some(name) = attachment.name() {
                        file["filename"] = json!(name);
                    }
                    json!({ "type": "file", "file": file })
                }
                None => json!({ "type": "text", "text": part.placeholder() }),
            }),
            Part::Reasoning(_) => None,
            part => part
                .as_text()
                .map(|text| json!({ "type": "text", "text": text })),
        })
        .collect();
    Value::Array(parts)
}

/// Whether a file of this media type is text (`text/*`, JSON).
fn is_text(media_type: &str) -> bool {
    let essence = media_type.split(';').next().unwrap_or("").trim();
    essence.starts_with("text/") || essence == "application/json" || essence.ends_with("+json")
}

/// The text of the reasoning parts this client read, for
/// `reasoning_content`; `None` when there is none.
fn own_reasoning(content: &Content) -> Option<String> {
    let texts: Vec<&str> = content
        .reasoning()
        .filter(|r| r.provider == REASONING_PROVIDER)
        .filter_map(|r| r.text.as_deref())
        .collect();
    (!texts.is_empty()).then(|| texts.concat())
}

/// A message on the wire, as JSON text: images and files in a user
/// message; elsewhere text, with placeholders for what the protocol does not
/// take there. An answer carries its own reasoning when `replay`, and it and
/// its tool calls the members their provider metadata keeps (after their
/// own: metadata cannot replace what this client sends).
fn wire_message(message: &Message, replay: bool) -> Box<RawValue> {
    // A JSON value always serializes.
    let raw = |value: Value| to_raw_value(&value).unwrap_or_default();
    match message {
        Message::System { content } => {
            raw(json!({ "role": "system", "content": wire_text(content) }))
        }
        Message::User { content } => {
            raw(json!({ "role": "user", "content": user_content(content) }))
        }
        Message::Assistant {
            content,
            tool_calls,
            provider_metadata,
        } => {
            let mut wire = Map::new();
            wire.insert("role".into(), "assistant".into());
            let text = wire_text(content);
            let text = if text.is_empty() && !tool_calls.is_empty() {
                Value::Null
            } else {
                Value::String(text.into_owned())
            };
            wire.insert("content".into(), text);
            if let Some(reasoning) = own_reasoning(content).filter(|_| replay) {
                wire.insert("reasoning_content".into(), Value::String(reasoning));
            }
            let mut members = Members::default();
            if !tool_calls.is_empty() {
                let calls: Vec<String> = tool_calls
                    .iter()
                    .map(|call| {
                        let mut wire = Map::new();
                        wire.insert("id".into(), json!(call.id));
                        wire.insert("type".into(), json!("function"));
                        wire.insert(
                            "function".into(),
                            json!({ "name": call.name, "arguments": call.arguments }),
                        );
                        Members::of(call.provider_metadata.as_ref(), &CALL_MEMBERS)
                            .appended_to(&wire)
                            .get()
                            .to_owned()
                    })
                    .collect();
                let calls = RawValue::from_string(format!("[{}]", calls.join(",")));
                members = Members::one("tool_calls", calls.unwrap_or_default());
            }
            members.absorb(Members::of(provider_metadata.as_ref(), &ANSWER_MEMBERS));
            members.appended_to(&wire)
        }
        // The protocol has no error flag: the tool's text says what failed.
        Message::Tool {
            call_id, content, ..
        } => raw(json!({ "role": "tool", "tool_call_id": call_id, "content": wire_text(content) })),
    }
}

fn wire_tool(spec: &ToolSpec) -> Value {
    json!({
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": spec.parameters,
        },
    })
}
