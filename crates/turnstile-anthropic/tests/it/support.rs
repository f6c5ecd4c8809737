//! A fake Anthropic Messages API on loopback: it answers from a script and
//! records what it was sent, and it refuses (400) what the API refuses
//! where a durable client can get it wrong: a `thinking` block whose text or
//! signature is not what this server issued, a `redacted_thinking` block
//! whose data it did not issue, an answer whose tool calls are being
//! answered that no longer starts with its thinking, roles that do not
//! alternate, a tool result that answers no call of the answer before it
//! or comes after text, an empty or blank text block, more than four cache
//! breakpoints or one on thinking, and a body that is not such a request.

use std::collections::{HashSet, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use turnstile::agent::{ModelRequest, ModelResponse};
use turnstile::{
    AnthropicConfig, AnthropicModel, Message, Model, ModelError, RetryPolicy, ToolSpec,
};

pub const KEY: &str = "sk-ant-test-0123456789abcdef";
const SECRET: &str = "fixture-signing-secret";

/// The signature this server issues for thinking `text`.
pub fn sign(text: &str) -> String {
    let digest = Sha256::digest(format!("{SECRET}:{text}").as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A signed thinking block.
pub fn thinking(text: &str) -> Value {
    json!({ "type": "thinking", "thinking": text, "signature": sign(text) })
}

pub fn text(text: &str) -> Value {
    json!({ "type": "text", "text": text })
}

pub fn tool_use(id: &str, name: &str, input: &str) -> Value {
    // Kept as text: the input goes out as the model "wrote" it.
    json!({ "type": "tool_use", "id": id, "name": name, "input_text": input })
}

/// One scripted answer.
#[derive(Clone)]
pub enum Reply {
    /// An answer: JSON or a stream, as the request asks.
    Answer {
        blocks: Vec<Value>,
        stop_reason: &'static str,
        usage: Value,
    },
    /// An answer as one JSON body, whatever the request asks (a server
    /// that ignores `stream`).
    Whole { blocks: Vec<Value>, usage: Value },
    /// An error status with these headers and an error of this type.
    Status {
        status: u16,
        headers: Vec<(&'static str, String)>,
        error_type: &'static str,
    },
    /// A stream that stops after `events` events, without `message_stop`;
    /// `mid_event` sends half of the next one too.
    CutStream {
        blocks: Vec<Value>,
        events: usize,
        mid_event: bool,
    },
    /// This text as the event stream.
    RawSse(&'static str),
    /// A stream that reports an error of this type after its start.
    StreamError { error_type: &'static str },
    /// No answer, ever (the caller is to be killed meanwhile).
    Hang,
}

impl Reply {
    pub fn answer(blocks: Vec<Value>, stop_reason: &'static str) -> Self {
        Reply::Answer {
            blocks,
            stop_reason,
            usage: json!({ "input_tokens": 10, "output_tokens": 5 }),
        }
    }

    pub fn status(status: u16, error_type: &'static str) -> Self {
        Reply::Status {
            status,
            headers: Vec::new(),
            error_type,
        }
    }

    pub fn retry_after(status: u16, error_type: &'static str, seconds: &str) -> Self {
        Reply::Status {
            status,
            headers: vec![("retry-after", seconds.to_owned())],
            error_type,
        }
    }
}

/// What the server was sent.
#[derive(Clone)]
pub struct Recorded {
    pub headers: HeaderMap,
    pub body: Value,
    pub raw: String,
}

#[derive(Default)]
struct FakeState {
    replies: VecDeque<Reply>,
    requests: Vec<Recorded>,
    issued_redactions: HashSet<String>,
    refused: Vec<String>,
}

#[derive(Clone, Default)]
pub struct Fake {
    state: Arc<Mutex<FakeState>>,
    arrived: Arc<tokio::sync::Notify>,
}

pub struct Server {
    pub base_url: String,
    pub fake: Fake,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    pub async fn start(replies: Vec<Reply>) -> Server {
        let fake = Fake::default();
        fake.state.lock().unwrap().replies = replies.into();
        let app = Router::new()
            .route("/v1/messages", post(answer))
            .with_state(fake.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Server {
            base_url,
            fake,
            task,
        }
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.fake.state.lock().unwrap().requests.clone()
    }

    /// Why the server refused requests, in order.
    pub fn refused(&self) -> Vec<String> {
        self.fake.state.lock().unwrap().refused.clone()
    }

    /// Waits until `n` requests have arrived.
    pub async fn until_requests(&self, n: usize) {
        tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                let notified = self.fake.arrived.notified();
                if self.requests().len() >= n {
                    return;
                }
                notified.await;
            }
        })
        .await
        .expect("the requests did not arrive");
    }

    pub fn config(&self) -> AnthropicConfig {
        AnthropicConfig::new("claude-test")
            .with_base_url(&self.base_url)
            .with_api_key(KEY)
            .with_retry(RetryPolicy {
                backoff: Duration::from_millis(20),
                ..RetryPolicy::default()
            })
    }

    pub fn model(&self) -> AnthropicModel {
        AnthropicModel::new(self.config()).unwrap()
    }
}

fn error_body(error_type: &str, message: &str) -> String {
    json!({ "type": "error", "error": { "type": error_type, "message": message } }).to_string()
}

async fn answer(State(fake): State<Fake>, headers: HeaderMap, body: Bytes) -> Response {
    let raw = String::from_utf8_lossy(&body).into_owned();
    let parsed: Value = serde_json::from_str(&raw).unwrap_or(Value::Null);
    let (reply, refusal) = {
        let mut state = fake.state.lock().unwrap();
        state.requests.push(Recorded {
            headers: headers.clone(),
            body: parsed.clone(),
            raw,
        });
        let refusal = check(&state, &headers, &parsed);
        if let Some(why) = &refusal {
            state.refused.push(why.clone());
        }
        let reply = match refusal {
            Some(_) => None,
            None => state.replies.pop_front(),
        };
        if let Some(
            Reply::Answer { blocks, .. }
            | Reply::Whole { blocks, .. }
            | Reply::CutStream { blocks, .. },
        ) = &reply
        {
            for block in blocks {
                if let Some(data) = block.get("data").and_then(Value::as_str) {
                    state.issued_redactions.insert(data.to_owned());
                }
            }
        }
        (reply, refusal)
    };
    fake.arrived.notify_waiters();
    if let Some(why) = refusal {
        return (
            StatusCode::BAD_REQUEST,
            [("content-type", "application/json")],
            error_body("invalid_request_error", &why),
        )
            .into_response();
    }
    let stream = parsed.get("stream").and_then(Value::as_bool) == Some(true);
    match reply.expect("a scripted reply for every request") {
        Reply::Answer {
            blocks,
            stop_reason,
            usage,
        } if stream => sse(events(&blocks, stop_reason, &usage)),
        Reply::Whole { blocks, usage } => whole(&blocks, "end_turn", &usage),
        Reply::Answer {
            blocks,
            stop_reason,
            usage,
        } => whole(&blocks, stop_reason, &usage),
        Reply::Status {
            status,
            headers,
            error_type,
        } => {
            let mut response = (
                StatusCode::from_u16(status).unwrap(),
                [("content-type", "application/json")],
                error_body(error_type, &format!("fixture {error_type}; key {KEY}")),
            )
                .into_response();
            for (name, value) in headers {
                response.headers_mut().insert(name, value.parse().unwrap());
            }
            response
        }
        Reply::CutStream {
            blocks,
            events: n,
            mid_event,
        } => {
            let usage = json!({ "input_tokens": 1, "output_tokens": 1 });
            let events = events(&blocks, "end_turn", &usage);
            let mut text = sse_text(&events[..n]);
            if mid_event {
                let next = sse_text(&events[n..=n]);
                text.push_str(&next[..next.len() / 2]);
            }
            raw_sse(text)
        }
        Reply::RawSse(text) => raw_sse(text.to_owned()),
        Reply::StreamError { error_type } => sse(vec![
            (
                "message_start",
                json!({ "type": "message_start", "message": { "usage": { "input_tokens": 1 } } }),
            ),
            (
                "error",
                json!({ "type": "error", "error": { "type": error_type, "message": "fixture" } }),
            ),
        ]),
        Reply::Hang => {
            std::future::pending::<()>().await;
            unreachable!()
        }
    }
}

/// An answer as one JSON body, a tool input as its text.
fn whole(blocks: &[Value], stop_reason: &str, usage: &Value) -> Response {
    let content: Vec<Value> = blocks.iter().map(wire_block).collect();
    let body = json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
        "content": content, "stop_reason": stop_reason, "stop_sequence": null,
        "usage": usage,
    });
    let mut text = body.to_string();
    for block in blocks {
        if let Some(input) = block.get("input_text").and_then(Value::as_str) {
            text = text.replacen("\"input\":\"__INPUT__\"", &format!("\"input\":{input}"), 1);
        }
    }
    ([("content-type", "application/json")], text).into_response()
}

/// A block as the non-streamed answer holds it (a tool input marked for
/// its text).
fn wire_block(block: &Value) -> Value {
    let mut block = block.clone();
    if let Some(map) = block.as_object_mut() {
        if map.remove("input_text").is_some() {
            map.insert("input".into(), json!("__INPUT__"));
        }
    }
    block
}

/// The events that stream these blocks.
fn events(blocks: &[Value], stop_reason: &str, usage: &Value) -> Vec<(&'static str, Value)> {
    let mut events = vec![(
        "message_start",
        json!({ "type": "message_start", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "content": [],
            "usage": { "input_tokens": usage["input_tokens"],
                       "cache_creation_input_tokens": usage.get("cache_creation_input_tokens"),
                       "cache_read_input_tokens": usage.get("cache_read_input_tokens"),
                       "output_tokens": 1 } } }),
    )];
    let delta = |index: usize, delta: Value| {
        (
            "content_block_delta",
            json!({ "type": "content_block_delta", "index": index, "delta": delta }),
        )
    };
    for (index, block) in blocks.iter().enumerate() {
        let halves = |s: &str| {
            let cut = s
                .char_indices()
                .nth(s.chars().count() / 2)
                .map_or(s.len(), |(i, _)| i);
            [s[..cut].to_owned(), s[cut..].to_owned()]
        };
        let start = match block["type"].as_str().unwrap() {
            "text" => json!({ "type": "text", "text": "" }),
            "thinking" => json!({ "type": "thinking", "thinking": "" }),
            "tool_use" => {
                json!({ "type": "tool_use", "id": block["id"], "name": block["name"], "input": {} })
            }
            _ => block.clone(),
        };
        events.push((
            "content_block_start",
            json!({ "type": "content_block_start", "index": index, "content_block": start }),
        ));
        match block["type"].as_str().unwrap() {
            "text" => {
                for half in halves(block["text"].as_str().unwrap()) {
                    events.push(delta(index, json!({ "type": "text_delta", "text": half })));
                }
            }
            "thinking" => {
                for half in halves(block["thinking"].as_str().unwrap()) {
                    events.push(delta(
                        index,
                        json!({ "type": "thinking_delta", "thinking": half }),
                    ));
                }
                events.push(delta(
                    index,
                    json!({ "type": "signature_delta", "signature": block["signature"] }),
                ));
            }
            "tool_use" => {
                for half in halves(block["input_text"].as_str().unwrap()) {
                    events.push(delta(
                        index,
                        json!({ "type": "input_json_delta", "partial_json": half }),
                    ));
                }
            }
            _ => {}
        }
        events.push((
            "content_block_stop",
            json!({ "type": "content_block_stop", "index": index }),
        ));
    }
    events.push((
        "message_delta",
        json!({ "type": "message_delta", "delta": { "stop_reason": stop_reason },
                "usage": { "output_tokens": usage["output_tokens"] } }),
    ));
    events.push(("message_stop", json!({ "type": "message_stop" })));
    events
}

fn sse_text(events: &[(&'static str, Value)]) -> String {
    events
        .iter()
        .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
        .collect()
}

fn sse(events: Vec<(&'static str, Value)>) -> Response {
    raw_sse(sse_text(&events))
}

/// An event stream of this text, sent an event at a time.
fn raw_sse(text: String) -> Response {
    let chunks: Vec<_> = text
        .split_inclusive("\n\n")
        .map(|chunk| Ok::<_, Infallible>(Bytes::from(chunk.to_owned())))
        .collect();
    let body = Body::from_stream(futures_util::stream::iter(chunks));
    ([("content-type", "text/event-stream")], body).into_response()
}

/// Why the API would refuse this request, if it would.
fn check(state: &FakeState, headers: &HeaderMap, body: &Value) -> Option<String> {
    if headers.get("x-api-key").and_then(|v| v.to_str().ok()) != Some(KEY) {
        return Some("missing or wrong x-api-key".into());
    }
    if headers.get("anthropic-version").is_none() {
        return Some("missing anthropic-version".into());
    }
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return Some("messages: field required".into());
    };
    let thinking_on = body.get("thinking").is_some();
    let mut breakpoints = 0;
    let blocks_of = |value: &Value| value.as_array().cloned().unwrap_or_default();
    for block in blocks_of(&body["system"])
        .iter()
        .chain(&blocks_of(&body["tools"]))
    {
        breakpoints += usize::from(block.get("cache_control").is_some());
    }
    for (m, message) in messages.iter().enumerate() {
        let role = message["role"].as_str().unwrap_or_default();
        let expected = if m % 2 == 0 { "user" } else { "assistant" };
        if role != expected {
            return Some(format!(
                "messages.{m}.role: expected {expected}, roles must alternate"
            ));
        }
        let Some(blocks) = message["content"].as_array() else {
            return Some(format!("messages.{m}.content: expected a list of blocks"));
        };
        let mut text_seen = false;
        for (b, block) in blocks.iter().enumerate() {
            let at = format!("messages.{m}.content.{b}");
            let kind = block["type"].as_str().unwrap_or_default();
            if block.get("cache_control").is_some() {
                breakpoints += 1;
                if kind == "thinking" || kind == "redacted_thinking" {
                    return Some(format!("{at}: cache_control cannot be set on thinking"));
                }
            }
            match kind {
                "text" => {
                    if block["text"].as_str().unwrap_or_default().trim().is_empty() {
                        return Some(format!(
                            "{at}: text content blocks must contain non-whitespace text"
                        ));
                    }
                    text_seen = true;
                }
                "thinking" => {
                    let text = block["thinking"].as_str().unwrap_or_default();
                    if block["signature"].as_str() != Some(sign(text).as_str()) {
                        return Some(format!("{at}: Invalid `signature` in `thinking` block"));
                    }
                }
                "redacted_thinking" => {
                    let data = block["data"].as_str().unwrap_or_default();
                    if !state.issued_redactions.contains(data) {
                        return Some(format!("{at}: Invalid `data` in `redacted_thinking` block"));
                    }
                }
                "tool_use" | "image" | "document" | "server_tool_use" => {}
                "tool_result" => {
                    let id = block["tool_use_id"].as_str().unwrap_or_default();
                    let previous = &messages[m.saturating_sub(1)]["content"];
                    let answers_a_call = m > 0
                        && blocks_of(previous)
                            .iter()
                            .any(|b| b["type"] == "tool_use" && b["id"] == id);
                    if text_seen || !answers_a_call {
                        return Some(format!(
                            "{at}: tool_result blocks must come first and answer a tool_use of the previous message"
                        ));
                    }
                    if block["is_error"] == true && block.get("content").is_none() {
                        return Some(format!("{at}: an error tool_result needs content"));
                    }
                }
                other => return Some(format!("{at}: unknown block type {other:?}")),
            }
        }
    }
    if breakpoints > 4 {
        return Some(format!(
            "{breakpoints} cache_control blocks; at most 4 are allowed"
        ));
    }
    // The answer whose tool calls the last message answers keeps its
    // thinking (the API's rule for tool loops with thinking on).
    if thinking_on && messages.len() >= 2 {
        let last = &messages[messages.len() - 1];
        let answered = blocks_of(&last["content"])
            .iter()
            .any(|b| b["type"] == "tool_result");
        let previous = &messages[messages.len() - 2]["content"][0]["type"];
        if answered && previous != "thinking" && previous != "redacted_thinking" {
            return Some(format!(
                "messages.{}.content.0.type: Expected `thinking` or `redacted_thinking`, but found {previous}",
                messages.len() - 2
            ));
        }
    }
    None
}

/// One call of `model` with these messages, streamed when `stream`.
pub async fn respond(
    model: &AnthropicModel,
    messages: &[Message],
    tools: &[ToolSpec],
    stream: bool,
) -> (Result<ModelResponse, ModelError>, String) {
    let deltas = Mutex::new(String::new());
    let on_delta = |text: &str| deltas.lock().unwrap().push_str(text);
    let result = model
        .respond(ModelRequest {
            messages,
            tools,
            deltas: stream.then_some(&on_delta as _),
            deadline: None,
        })
        .await;
    let deltas = deltas.into_inner().unwrap();
    (result, deltas)
}

#[track_caller]
pub fn assert_keyless(error: &ModelError) {
    assert!(
        !error.message.contains(KEY),
        "key leaked: {}",
        error.message
    );
    assert!(!format!("{error:?}").contains(KEY), "key leaked: {error:?}");
}

pub fn add_spec() -> ToolSpec {
    ToolSpec {
        name: "add".into(),
        description: "Adds two integers".into(),
        parameters: json!({
            "type": "object",
            "properties": { "a": { "type": "integer" }, "b": { "type": "integer" } },
            "required": ["a", "b"],
        }),
    }
}
