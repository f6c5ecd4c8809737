//! The streamed answer: server-sent events (parsed by the shared
//! [`SseParser`]) assembled from text deltas and tool-call fragments into a
//! [`ModelResponse`].

use std::collections::BTreeMap;

use futures_util::StreamExt;
use serde_json::Value;

use turnstile_core::agent::{ModelResponse, TextDeltas};
use turnstile_core::message::Usage;
use turnstile_core::ModelError;

use turnstile_model_http::{decode_error, SseParser};

use crate::errors::{error_object, transport_error};
use crate::extra::{Members, ANSWER_MEMBERS};
use crate::wire::{
    answer_content, check_finish, finish_call, push_arguments, reasoning_text, StreamChunk,
    StreamDelta, WireToolCall,
};
use crate::OpenAiConfig;

/// Reads a streamed answer: its text deltas go to `deltas` as they arrive.
pub(crate) async fn read_stream(
    config: &OpenAiConfig,
    response: reqwest::Response,
    deltas: TextDeltas<'_>,
) -> Result<ModelResponse, ModelError> {
    let mut body = std::pin::pin!(response.bytes_stream());
    let mut parser = SseParser::new(STREAM);
    let mut assembly = StreamAssembly::default();
    let mut events = Vec::new();
    loop {
        let ended = match body.next().await {
            Some(Ok(bytes)) => {
                parser.push(&bytes, &mut events)?;
                false
            }
            Some(Err(e)) => {
                return Err(transport_error(config, e, "reading the event stream"));
            }
            None => {
                parser.finish(&mut events, is_done)?;
                true
            }
        };
        for event in events.drain(..) {
            if assembly.apply(&event.data, deltas, config)? {
                tracing::debug!(events = assembly.events, "event stream done");
                return assembly.finish();
            }
        }
        if ended {
            return Err(ModelError::fatal(format!(
                "truncated chat completion stream: it ended after {} events without data: [DONE]",
                assembly.events
            )));
        }
    }
}

/// What errors call the stream.
const STREAM: &str = "chat completion stream";

/// Whether an event is the stream's last, `[DONE]` (which may lack its
/// line ends).
fn is_done(data: &str) -> bool {
    data.trim() == "[DONE]"
}

/// What a stream has said so far.
#[derive(Default)]
struct StreamAssembly {
    content: String,
    reasoning: String,
    calls: BTreeMap<u64, PartialCall>,
    /// The answer's members this client does not read.
    extra: Members,
    usage: Option<Usage>,
    /// The last `finish_reason` of the first choice.
    finish_reason: Option<String>,
    events: usize,
}

#[derive(Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
    extra: Members,
}

impl StreamAssembly {
    /// Applies one event; true at `[DONE]`.
    fn apply(
        &mut self,
        data: &str,
        deltas: TextDeltas<'_>,
        config: &OpenAiConfig,
    ) -> Result<bool, ModelError> {
        let data = data.trim();
        if data == "[DONE]" {
            return Ok(true);
        }
        if data.is_empty() {
            return Ok(false);
        }
        self.events += 1;
        let chunk: StreamChunk = serde_json::from_str(data).map_err(|e| {
            ModelError::fatal(format!(
                "malformed chat completion stream: event {} is not a valid chunk: {}",
                self.events,
                decode_error(&e, "a chat completion chunk object")
            ))
        })?;
        if let Some(error) = &chunk.error {
            if !error.is_null() {
                return Err(error_object(config, error, "the chat completion stream"));
            }
        }
        if let Some(usage) = chunk.usage {
            self.usage = Some(usage.into_usage());
        }
        for choice in chunk.choices.unwrap_or_default() {
            if choice.index.unwrap_or(0) != 0 {
                continue;
            }
            if let Some(reason) = choice.finish_reason.as_ref().and_then(Value::as_str) {
                self.finish_reason = Some(reason.to_owned());
            }
            let Some(raw) = choice.delta.filter(|d| d.get() != "null") else {
                continue;
            };
            let malformed = |e: serde_json::Error, what: &str| {
                ModelError::fatal(format!(
                    "malformed chat completion stream: event {} is not a valid chunk: {}",
                    self.events,
                    decode_error(&e, what)
                ))
            };
            let delta: StreamDelta =
                serde_json::from_str(raw.get()).map_err(|e| malformed(e, "a delta object"))?;
            self.extra.absorb(Members::unknown(&raw, &ANSWER_MEMBERS));
            // Reasoning is not a text delta: it is not the answer. A server
            // that spells it both ways sends the same text twice.
            self.reasoning
                .push_str(&reasoning_text(delta.reasoning_content, delta.reasoning));
            if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                deltas(&text);
                self.content.push_str(&text);
            }
            for (position, raw) in delta.tool_calls.unwrap_or_default().into_iter().enumerate() {
                let (fragment, extra) = WireToolCall::read(&raw).map_err(|e| {
                    ModelError::fatal(format!(
                        "malformed chat completion stream: event {} is not a valid chunk: {e}",
                        self.events
                    ))
                })?;
                let index = fragment.index.unwrap_or(position as u64);
                let call = self.calls.entry(index).or_default();
                call.extra.absorb(extra);
                if let Some(id) = fragment.id.filter(|id| !id.is_empty()) {
                    if call.id.is_empty() {
                        call.id = id;
                    }
                }
                let function = fragment.function.unwrap_or_default();
                if let Some(name) = function.name.filter(|n| !n.is_empty()) {
                    if call.name.is_empty() {
                        call.name = name;
                    }
                }
                push_arguments(&mut call.arguments, function.arguments);
            }
        }
        Ok(false)
    }

    fn finish(self) -> Result<ModelResponse, ModelError> {
        // A cut or filtered answer is discarded; the tokens it spent count.
        check_finish(self.finish_reason.as_deref())
            .map_err(|e| e.with_usage(self.usage.unwrap_or_default()))?;
        let tool_calls = self
            .calls
            .into_values()
            .enumerate()
            .map(|(position, call)| {
                finish_call(position, call.id, call.name, call.arguments, call.extra)
            })
            .collect::<Result<_, _>>()?;
        Ok(ModelResponse {
            content: answer_content(self.reasoning, self.content),
            tool_calls,
            provider_metadata: self.extra.into_metadata(),
            usage: self.usage.unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn malformed_chunks_are_not_quoted_into_errors() {
        const MARK: &str = "MALFORMED-CHUNK-MARK";
        let config = OpenAiConfig::new("http://127.0.0.1:9/v1", "m");
        let chunks = [
            json!({ "choices": [{ "delta": format!("private {MARK}") }] }).to_string(),
            json!({ "choices": [{ "delta": { "content": ["a", MARK] } }] }).to_string(),
            json!({ "choices": [{ "index": MARK }] }).to_string(),
            json!({ "usage": { "prompt_tokens": -1 } }).to_string(),
            format!("{{\"choices\": {MARK}"),
            format!("{{\"choices\": \"{MARK}"),
        ];
        for chunk in chunks {
            let error = StreamAssembly::default()
                .apply(&chunk, &|_| {}, &config)
                .unwrap_err();
            assert!(!error.message.contains(MARK), "{error}");
            assert!(error.message.contains("malformed"), "{error}");
            assert!(error.message.contains(" at line 1 column "), "{error}");
        }
    }
}
