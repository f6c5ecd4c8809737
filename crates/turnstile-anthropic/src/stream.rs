//! The streamed answer: server-sent events (parsed by the shared
//! [`SseParser`]) assembled block by block: text deltas go to the caller
//! as they arrive, thinking and its signature, tool inputs from their JSON
//! fragments.

use std::collections::BTreeMap;

use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use turnstile_core::agent::TextDeltas;
use turnstile_core::ModelError;
use turnstile_model_http::{decode_error, SseEvent, SseParser};

use crate::errors::{stream_error, transport_error};
use crate::wire::{AnswerBlock, WireUsage};
use crate::AnthropicConfig;

/// What errors call the stream.
const STREAM: &str = "anthropic messages stream";

/// A streamed answer: its blocks, stop reason and usage.
pub(crate) struct Streamed {
    pub(crate) blocks: Vec<AnswerBlock>,
    pub(crate) stop_reason: Option<String>,
    pub(crate) usage: WireUsage,
}

/// Reads a streamed answer; its text deltas go to `deltas`. A stream that
/// ends before `message_stop`, between events or within one, is truncated
/// and fails, retryable (the connection was cut).
pub(crate) async fn read_stream(
    config: &AnthropicConfig,
    response: reqwest::Response,
    deltas: TextDeltas<'_>,
) -> Result<Streamed, ModelError> {
    let mut body = std::pin::pin!(response.bytes_stream());
    let mut parser = SseParser::new(STREAM);
    let mut assembly = Assembly::default();
    let mut events = Vec::new();
    loop {
        let ended = match body.next().await {
            Some(Ok(bytes)) => {
                parser.push(&bytes, &mut events)?;
                false
            }
            Some(Err(e)) => return Err(transport_error(config, e, "reading the event stream")),
            None => {
                parser
                    .finish(&mut events, is_stop)
                    .map_err(|e| ModelError::retryable(e.message))?;
                true
            }
        };
        for event in events.drain(..) {
            if assembly.apply(&event, deltas, config)? {
                return assembly.finish();
            }
        }
        if ended {
            return Err(ModelError::retryable(format!(
                "truncated {STREAM}: it ended after {} events without message_stop",
                assembly.events
            )));
        }
    }
}

/// Whether an event cut off by the end of the stream is its last.
fn is_stop(data: &str) -> bool {
    serde_json::from_str::<Event>(data).is_ok_and(|e| e.kind == "message_stop")
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Event {
    #[serde(rename = "type")]
    kind: String,
    index: Option<u64>,
    message: Option<StartMessage>,
    content_block: Option<Box<RawValue>>,
    delta: Option<Delta>,
    usage: Option<WireUsage>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StartMessage {
    usage: Option<WireUsage>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Delta {
    #[serde(rename = "type")]
    kind: Option<String>,
    text: Option<String>,
    thinking: Option<String>,
    signature: Option<String>,
    partial_json: Option<String>,
    stop_reason: Option<String>,
}

/// A block being streamed.
struct Partial {
    block: AnswerBlock,
    /// A tool input's JSON fragments, joined.
    json: String,
}

#[derive(Default)]
struct Assembly {
    blocks: BTreeMap<u64, Partial>,
    usage: WireUsage,
    stop_reason: Option<String>,
    events: usize,
}

impl Assembly {
    /// Applies one event; true at `message_stop`.
    fn apply(
        &mut self,
        sse: &SseEvent,
        deltas: TextDeltas<'_>,
        config: &AnthropicConfig,
    ) -> Result<bool, ModelError> {
        self.events += 1;
        let data = sse.data.as_str();
        let malformed = |e: serde_json::Error, n: usize, what: &str| {
            ModelError::fatal(format!(
                "malformed {STREAM}: event {n} is not valid: {}",
                decode_error(&e, what)
            ))
        };
        if sse.name == "error" {
            let event: Value = serde_json::from_str(data)
                .map_err(|e| malformed(e, self.events, "an error event"))?;
            return Err(stream_error(config, &event));
        }
        let event: Event =
            serde_json::from_str(data).map_err(|e| malformed(e, self.events, "an event object"))?;
        match event.kind.as_str() {
            "message_start" => {
                if let Some(usage) = event.message.and_then(|m| m.usage) {
                    self.usage = usage.over(self.usage);
                }
            }
            "content_block_start" => {
                let raw = event.content_block.ok_or_else(|| {
                    ModelError::fatal(format!(
                        "malformed {STREAM}: event {} starts no block",
                        self.events
                    ))
                })?;
                let block = AnswerBlock::read(raw)?;
                // A tool's input comes whole in its fragments; the start's
                // input is an empty placeholder.
                self.blocks.insert(
                    event.index.unwrap_or(self.blocks.len() as u64),
                    Partial {
                        block,
                        json: String::new(),
                    },
                );
            }
            "content_block_delta" => {
                let delta = event.delta.unwrap_or_default();
                let index = event.index.unwrap_or(0);
                let partial = self.blocks.get_mut(&index).ok_or_else(|| {
                    ModelError::fatal(format!(
                        "malformed {STREAM}: event {} continues block {index}, which did not start",
                        self.events
                    ))
                })?;
                match (&mut partial.block, delta.kind.as_deref()) {
                    (AnswerBlock::Text(text), Some("text_delta")) => {
                        let piece = delta.text.unwrap_or_default();
                        if !piece.is_empty() {
                            deltas(&piece);
                            text.push_str(&piece);
                        }
                    }
                    (AnswerBlock::Thinking { thinking, .. }, Some("thinking_delta")) => {
                        thinking.push_str(&delta.thinking.unwrap_or_default());
                    }
                    (AnswerBlock::Thinking { signature, .. }, Some("signature_delta")) => {
                        signature.push_str(&delta.signature.unwrap_or_default());
                    }
                    (
                        AnswerBlock::ToolUse { .. } | AnswerBlock::Other(_),
                        Some("input_json_delta"),
                    ) => {
                        partial
                            .json
                            .push_str(&delta.partial_json.unwrap_or_default());
                    }
                    // Citations and deltas of blocks this client does not
                    // read.
                    _ => {}
                }
            }
            "content_block_stop" => {
                let index = event.index.unwrap_or(0);
                if let Some(partial) = self.blocks.get_mut(&index) {
                    finish_input(partial, self.events)?;
                }
            }
            "message_delta" => {
                if let Some(reason) = event.delta.and_then(|d| d.stop_reason) {
                    self.stop_reason = Some(reason);
                }
                if let Some(usage) = event.usage {
                    self.usage = usage.over(self.usage);
                }
            }
            "message_stop" => return Ok(true),
            "error" => {
                let event: Value = serde_json::from_str(data)
                    .map_err(|e| malformed(e, self.events, "an error event"))?;
                return Err(stream_error(config, &event));
            }
            // `ping`, and events added to the protocol later.
            _ => {}
        }
        Ok(false)
    }

    fn finish(self) -> Result<Streamed, ModelError> {
        Ok(Streamed {
            blocks: self.blocks.into_values().map(|p| p.block).collect(),
            stop_reason: self.stop_reason,
            usage: self.usage,
        })
    }
}

/// A tool input from its fragments, checked to be JSON; none is `{}`.
fn finish_input(partial: &mut Partial, event: usize) -> Result<(), ModelError> {
    if partial.json.is_empty() {
        return Ok(());
    }
    let json = std::mem::take(&mut partial.json);
    if let Err(e) = serde_json::from_str::<&RawValue>(&json) {
        return Err(ModelError::fatal(format!(
            "malformed {STREAM}: the tool input ending at event {event} is not valid: {}",
            decode_error(&e, "a JSON object")
        )));
    }
    match &mut partial.block {
        AnswerBlock::ToolUse { input, .. } => *input = json,
        AnswerBlock::Other(raw) => {
            // A server tool's input, set into the block it started.
            if let Ok(Value::Object(mut block)) = serde_json::from_str::<Value>(raw.get()) {
                if let Ok(value) = serde_json::from_str::<Value>(&json) {
                    block.insert("input".into(), value);
                }
                if let Ok(text) = serde_json::value::to_raw_value(&block) {
                    *raw = text;
                }
            }
        }
        _ => {}
    }
    Ok(())
}
