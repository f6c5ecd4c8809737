//! The OpenAI-compatible model against a real HTTP server on loopback that
//! answers from a script and records what it was sent.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use futures_util::StreamExt;
use serde_json::{json, Value};
use turnstile::agent::ModelRequest;
use turnstile::{
    Agent, AgentSession, ContextPolicy, ConversationId, Event, Message, Model, ModelError,
    Namespace, RequestId, RunContext, SqliteStore, Tool, ToolCall, ToolContext, ToolError,
    ToolSpec, Usage,
};
use turnstile_openai::{OpenAiConfig, OpenAiModel};

const KEY: &str = "sk-test-0123456789abcdef";

// ---------------------------------------------------------------------------
// The scripted server

/// One scripted answer.
#[derive(Clone)]
enum Reply {
    /// A JSON body with this status.
    Json(StatusCode, Value),
    /// A body sent in pieces, `gap` apart, after `delay`.
    Raw {
        status: StatusCode,
        content_type: &'static str,
        headers: Vec<(&'static str, &'static str)>,
        chunks: Vec<Vec<u8>>,
        delay: Duration,
        gap: Duration,
    },
}

impl Reply {
    fn raw(status: StatusCode, content_type: &'static str, chunks: Vec<Vec<u8>>) -> Self {
        Reply::Raw {
            status,
            content_type,
            headers: Vec::new(),
            chunks,
            delay: Duration::ZERO,
            gap: Duration::from_millis(2),
        }
    }

    /// An event stream, split every `every` bytes.
    fn sse(body: &str, every: usize) -> Self {
        Reply::raw(StatusCode::OK, "text/event-stream", split(body, every))
    }
}

/// What the server was sent.
struct Recorded {
    headers: HeaderMap,
    body: Value,
}

#[derive(Clone, Default)]
struct Script {
    replies: Arc<Mutex<VecDeque<Reply>>>,
    requests: Arc<Mutex<Vec<Recorded>>>,
}

struct Server {
    base_url: String,
    script: Script,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    async fn start(replies: Vec<Reply>) -> Self {
        let script = Script::default();
        script.replies.lock().unwrap().extend(replies);
        let app = Router::new()
            .route("/v1/chat/completions", post(answer))
            .with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Server {
            base_url: format!("http://{addr}/v1"),
            script,
            task,
        }
    }

    fn config(&self) -> OpenAiConfig {
        OpenAiConfig::new(&self.base_url, "test-model").with_api_key(KEY)
    }

    fn model(&self) -> OpenAiModel {
        OpenAiModel::new(self.config()).unwrap()
    }

    fn bodies(&self) -> Vec<Value> {
        let requests = self.script.requests.lock().unwrap();
        requests.iter().map(|r| r.body.clone()).collect()
    }

    fn authorization(&self, i: usize) -> Option<String> {
        let requests = self.script.requests.lock().unwrap();
        requests[i]
            .headers
            .get("authorization")
            .map(|v| v.to_str().unwrap().to_owned())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(State(script): State<Script>, headers: HeaderMap, body: Bytes) -> Response {
    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    script
        .requests
        .lock()
        .unwrap()
        .push(Recorded { headers, body });
    let reply = script.replies.lock().unwrap().pop_front();
    match reply {
        None => (StatusCode::IM_A_TEAPOT, "script exhausted").into_response(),
        Some(Reply::Json(status, value)) => (status, Json(value)).into_response(),
        Some(Reply::Raw {
            status,
            content_type,
            headers,
            chunks,
            delay,
            gap,
        }) => {
            tokio::time::sleep(delay).await;
            let body = async_stream::stream! {
                for (i, chunk) in chunks.into_iter().enumerate() {
                    if i > 0 {
                        tokio::time::sleep(gap).await;
                    }
                    yield Ok::<_, Infallible>(Bytes::from(chunk));
                }
            };
            let mut response = Response::builder()
                .status(status)
                .header("content-type", content_type);
            for (name, value) in headers {
                response = response.header(name, value);
            }
            response.body(Body::from_stream(body)).unwrap()
        }
    }
}

// ---------------------------------------------------------------------------
// Helpers

fn split(text: &str, every: usize) -> Vec<Vec<u8>> {
    text.as_bytes().chunks(every).map(<[u8]>::to_vec).collect()
}

/// `data: …` events for `chunks`, then `data: [DONE]`.
fn sse(chunks: &[Value]) -> String {
    let mut body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    body.push_str("data: [DONE]\n\n");
    body
}

fn delta_chunk(delta: Value) -> Value {
    json!({
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "choices": [{ "index": 0, "delta": delta, "finish_reason": null }],
        "usage": null,
    })
}

fn usage_chunk(prompt: u64, completion: u64) -> Value {
    json!({
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": { "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion },
    })
}

fn completion(message: Value, usage: Value) -> Reply {
    Reply::Json(
        StatusCode::OK,
        json!({
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "test-model",
            "choices": [{ "index": 0, "message": message, "finish_reason": "stop" }],
            "usage": usage,
        }),
    )
}

fn text_completion(text: &str, prompt: u64, completion_tokens: u64) -> Reply {
    completion(
        json!({ "role": "assistant", "content": text }),
        json!({ "prompt_tokens": prompt, "completion_tokens": completion_tokens }),
    )
}

fn add_call_completion() -> Reply {
    completion(
        json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [{
                "id": "call_1",
                "type": "function",
                "function": { "name": "add", "arguments": "{\"a\":2,\"b\":3}" },
            }],
        }),
        json!({
            "prompt_tokens": 50,
            "completion_tokens": 12,
            "prompt_tokens_details": { "cached_tokens": 32 },
        }),
    )
}

fn error_body(status: StatusCode, message: &str) -> Reply {
    Reply::Json(
        status,
        json!({ "error": { "message": message, "type": "error", "code": null } }),
    )
}

fn add_spec() -> ToolSpec {
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

struct Add;

#[turnstile::async_trait]
impl Tool for Add {
    fn spec(&self) -> ToolSpec {
        add_spec()
    }

    async fn call(&self, args: Value, _: ToolContext) -> Result<String, ToolError> {
        match (args["a"].as_i64(), args["b"].as_i64()) {
            (Some(a), Some(b)) => Ok((a + b).to_string()),
            _ => Err(ToolError::new("a and b must be integers")),
        }
    }
}

async fn ask(
    model: &OpenAiModel,
    messages: &[Message],
) -> Result<turnstile::agent::ModelResponse, ModelError> {
    model
        .respond(ModelRequest {
            messages,
            tools: &[],
            deltas: None,
        })
        .await
}

/// Asks with a delta callback; returns the answer and the deltas seen.
async fn ask_streaming(
    model: &OpenAiModel,
    messages: &[Message],
) -> (
    Result<turnstile::agent::ModelResponse, ModelError>,
    Vec<String>,
) {
    let seen = Mutex::new(Vec::new());
    let on_delta = |text: &str| seen.lock().unwrap().push(text.to_owned());
    let result = model
        .respond(ModelRequest {
            messages,
            tools: &[],
            deltas: Some(&on_delta),
        })
        .await;
    (result, seen.into_inner().unwrap())
}

fn hello() -> Vec<Message> {
    vec![Message::user("hello")]
}

#[track_caller]
fn assert_keyless(error: &ModelError) {
    assert!(
        !error.message.contains(KEY),
        "key leaked: {}",
        error.message
    );
    assert!(!format!("{error:?}").contains(KEY), "key leaked: {error:?}");
}

#[track_caller]
fn expect_error(
    result: Result<turnstile::agent::ModelResponse, ModelError>,
    retryable: bool,
    needle: &str,
) -> ModelError {
    let error = result.expect_err("the call should fail");
    assert_eq!(error.retryable, retryable, "{error:?}");
    assert!(
        error.message.contains(needle),
        "{:?} does not contain {needle:?}",
        error.message
    );
    assert_keyless(&error);
    error
}

// ---------------------------------------------------------------------------
// Round trips

#[tokio::test]
async fn tool_call_round_trip_through_respond() {
    let server = Server::start(vec![
        add_call_completion(),
        text_completion("2 + 3 = 5", 80, 7),
    ])
    .await;
    let model = OpenAiModel::new(server.config().with_max_output_tokens(256)).unwrap();
    assert_eq!(model.name(), "openai:test-model");
    let tools = [add_spec()];

    let mut messages = vec![Message::system("be exact"), Message::user("what is 2 + 3?")];
    let first = model
        .respond(ModelRequest {
            messages: &messages,
            tools: &tools,
            deltas: None,
        })
        .await
        .unwrap();
    assert_eq!(first.content, "");
    assert_eq!(
        first.tool_calls,
        vec![ToolCall {
            id: "call_1".into(),
            name: "add".into(),
            arguments: "{\"a\":2,\"b\":3}".into(),
        }]
    );
    assert_eq!(
        first.usage,
        Usage {
            input_tokens: 50,
            output_tokens: 12,
            cache_read_tokens: 32,
            cache_write_tokens: 0,
        }
    );

    messages.push(Message::Assistant {
        content: String::new(),
        tool_calls: first.tool_calls.clone(),
    });
    messages.push(Message::Tool {
        call_id: "call_1".into(),
        content: "5".into(),
        is_error: false,
    });
    let second = model
        .respond(ModelRequest {
            messages: &messages,
            tools: &tools,
            deltas: None,
        })
        .await
        .unwrap();
    assert_eq!(second.content, "2 + 3 = 5");
    assert!(second.tool_calls.is_empty());
    assert_eq!(second.usage.total(), 87);
    assert_eq!(second.usage.cache_read_tokens, 0);

    let bodies = server.bodies();
    assert_eq!(bodies.len(), 2);
    for (i, body) in bodies.iter().enumerate() {
        assert_eq!(
            server.authorization(i).as_deref(),
            Some(&*format!("Bearer {KEY}"))
        );
        assert_eq!(body["model"], "test-model");
        assert_eq!(body["max_tokens"], 256);
        assert!(body.get("stream").is_none(), "{body}");
        assert_eq!(
            body["tools"],
            json!([{
                "type": "function",
                "function": {
                    "name": "add",
                    "description": "Adds two integers",
                    "parameters": add_spec().parameters,
                },
            }])
        );
    }
    assert_eq!(
        bodies[0]["messages"],
        json!([
            { "role": "system", "content": "be exact" },
            { "role": "user", "content": "what is 2 + 3?" },
        ])
    );
    assert_eq!(
        bodies[1]["messages"],
        json!([
            { "role": "system", "content": "be exact" },
            { "role": "user", "content": "what is 2 + 3?" },
            {
                "role": "assistant",
                "content": null,
                "tool_calls": [{
                    "id": "call_1",
                    "type": "function",
                    "function": { "name": "add", "arguments": "{\"a\":2,\"b\":3}" },
                }],
            },
            { "role": "tool", "tool_call_id": "call_1", "content": "5" },
        ])
    );
}

#[tokio::test]
async fn tool_call_round_trip_through_an_agent_session() {
    let server = Server::start(vec![
        add_call_completion(),
        text_completion("2 + 3 = 5", 80, 7),
    ])
    .await;
    let agent = Agent::new(Arc::new(server.model()))
        .with_system_prompt("be exact")
        .with_tool(Arc::new(Add));
    let store = Arc::new(SqliteStore::in_memory().await.unwrap());
    let session = AgentSession::new(
        agent,
        store,
        ConversationId::new(),
        Namespace::new("openai-test").unwrap(),
        ContextPolicy::default(),
    );

    let request = RequestId::new();
    let outcome = session
        .run(request, "what is 2 + 3?", RunContext::default())
        .await
        .unwrap();
    assert_eq!(outcome.final_text, "2 + 3 = 5");
    assert_eq!((outcome.turns, outcome.tool_calls), (2, 1));
    assert_eq!(outcome.usage.total(), 50 + 12 + 80 + 7);
    assert_eq!(outcome.usage.cache_read_tokens, 32);
    assert!(outcome.messages.contains(&Message::Tool {
        call_id: "call_1".into(),
        content: "5".into(),
        is_error: false,
    }));

    let bodies = server.bodies();
    assert_eq!(bodies.len(), 2);
    assert_eq!(
        server.authorization(1).as_deref(),
        Some(&*format!("Bearer {KEY}"))
    );
    assert_eq!(bodies[1]["tools"][0]["function"]["name"], "add");
    let messages = bodies[1]["messages"].as_array().unwrap();
    assert_eq!(
        messages[0],
        json!({ "role": "system", "content": "be exact" })
    );
    assert_eq!(
        messages[messages.len() - 2]["tool_calls"][0]["function"]["arguments"],
        "{\"a\":2,\"b\":3}"
    );
    assert_eq!(
        messages[messages.len() - 1],
        json!({ "role": "tool", "tool_call_id": "call_1", "content": "5" })
    );

    // The replay of a committed request does not reach the server.
    let again = session
        .run(request, "what is 2 + 3?", RunContext::default())
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(server.bodies().len(), 2);
}

#[tokio::test]
async fn an_agent_session_stream_forwards_streamed_deltas() {
    let body = sse(&[
        delta_chunk(json!({ "role": "assistant", "content": "" })),
        delta_chunk(json!({ "content": "Hello" })),
        delta_chunk(json!({ "content": ", world" })),
        usage_chunk(9, 2),
    ]);
    let server = Server::start(vec![Reply::sse(&body, 11)]).await;
    let session = AgentSession::new(
        Agent::new(Arc::new(server.model())),
        Arc::new(SqliteStore::in_memory().await.unwrap()),
        ConversationId::new(),
        Namespace::new("openai-test").unwrap(),
        ContextPolicy::default(),
    );

    let mut deltas = Vec::new();
    let mut committed = None;
    let mut events = std::pin::pin!(session.stream(RequestId::new(), "hi", RunContext::default()));
    while let Some(event) = events.next().await {
        match event.unwrap() {
            Event::TextDelta { text, .. } => deltas.push(text),
            Event::ConversationCommitted { outcome, .. } => committed = Some(outcome),
            _ => {}
        }
    }
    assert_eq!(deltas, ["Hello", ", world"]);
    let outcome = committed.expect("committed");
    assert_eq!(outcome.final_text, "Hello, world");
    assert_eq!(outcome.usage.total(), 11);
    assert_eq!(server.bodies()[0]["stream"], true);
}

// ---------------------------------------------------------------------------
// Streaming

#[tokio::test]
async fn streamed_text_deltas_arrive_in_order_across_chunk_boundaries() {
    let body = sse(&[
        delta_chunk(json!({ "role": "assistant", "content": "" })),
        delta_chunk(json!({ "content": "Grüß" })),
        delta_chunk(json!({ "content": " dich, " })),
        delta_chunk(json!({ "content": "Wörld ✓" })),
        delta_chunk(json!({})),
        json!({
            "choices": [],
            "usage": {
                "prompt_tokens": 21,
                "completion_tokens": 6,
                "prompt_tokens_details": { "cached_tokens": 16 },
            },
        }),
    ])
    // CRLF line ends and a keep-alive comment are part of the protocol.
    .replace("\n", "\r\n")
    .replacen("data: ", ": keep-alive\r\n\r\ndata: ", 1);
    // 5-byte pieces split lines, `data:` prefixes and multi-byte characters.
    let server = Server::start(vec![Reply::sse(&body, 5)]).await;
    let model = server.model();

    let (result, deltas) = ask_streaming(&model, &hello()).await;
    let response = result.unwrap();
    assert_eq!(deltas, ["Grüß", " dich, ", "Wörld ✓"]);
    assert_eq!(response.content, "Grüß dich, Wörld ✓");
    assert!(response.tool_calls.is_empty());
    assert_eq!(
        response.usage,
        Usage {
            input_tokens: 21,
            output_tokens: 6,
            cache_read_tokens: 16,
            cache_write_tokens: 0,
        }
    );

    let body = &server.bodies()[0];
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"], json!({ "include_usage": true }));
    assert!(body.get("tools").is_none(), "{body}");
    assert_eq!(
        server.authorization(0).as_deref(),
        Some(&*format!("Bearer {KEY}"))
    );
}

#[tokio::test]
async fn a_server_that_ignores_stream_answers_with_one_delta() {
    let server = Server::start(vec![text_completion("whole answer", 3, 2)]).await;
    let (result, deltas) = ask_streaming(&server.model(), &hello()).await;
    let response = result.unwrap();
    assert_eq!(deltas, ["whole answer"]);
    assert_eq!(response.content, "whole answer");
    assert_eq!(response.usage.total(), 5);
    assert_eq!(server.bodies()[0]["stream"], true);
}

#[tokio::test]
async fn streamed_tool_call_fragments_are_assembled() {
    let fragment = |index: u64, id: Option<&str>, name: Option<&str>, arguments: &str| {
        let mut function = json!({ "arguments": arguments });
        if let Some(name) = name {
            function["name"] = json!(name);
        }
        let mut call = json!({ "index": index, "function": function });
        if let Some(id) = id {
            call["id"] = json!(id);
            call["type"] = json!("function");
        }
        delta_chunk(json!({ "tool_calls": [call] }))
    };
    let body = sse(&[
        delta_chunk(json!({ "role": "assistant", "content": "Let me add. " })),
        fragment(0, Some("call_a"), Some("add"), ""),
        fragment(0, None, None, "{\"a\":"),
        fragment(1, Some("call_b"), Some("add"), "{\"a\":10,"),
        fragment(0, None, None, " 2, \"b\""),
        fragment(1, None, None, "\"b\":20}"),
        fragment(0, None, None, ": 3}"),
        json!({ "choices": [{ "index": 0, "delta": {}, "finish_reason": "tool_calls" }] }),
        usage_chunk(40, 30),
    ]);
    let server = Server::start(vec![Reply::sse(&body, 23)]).await;
    let model = server.model();

    let (result, deltas) = ask_streaming(&model, &hello()).await;
    let response = result.unwrap();
    assert_eq!(deltas, ["Let me add. "]);
    assert_eq!(response.content, "Let me add. ");
    assert_eq!(
        response.tool_calls,
        vec![
            ToolCall {
                id: "call_a".into(),
                name: "add".into(),
                arguments: "{\"a\": 2, \"b\": 3}".into(),
            },
            ToolCall {
                id: "call_b".into(),
                name: "add".into(),
                arguments: "{\"a\":10,\"b\":20}".into(),
            },
        ]
    );
    assert_eq!(response.usage.total(), 70);
}

// ---------------------------------------------------------------------------
// Errors

#[tokio::test]
async fn rate_limits_and_server_errors_are_retryable() {
    // The server echoes the key back, as some do.
    let rate_limited = Reply::Raw {
        status: StatusCode::TOO_MANY_REQUESTS,
        content_type: "application/json",
        headers: vec![("retry-after", "7")],
        chunks: vec![json!({ "error": {
            "message": format!("Rate limit reached for key {KEY}, slow down"),
            "type": "requests",
        } })
        .to_string()
        .into_bytes()],
        delay: Duration::ZERO,
        gap: Duration::ZERO,
    };
    let server = Server::start(vec![
        rate_limited,
        Reply::raw(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            vec![b"upstream exploded".to_vec()],
        ),
        error_body(StatusCode::SERVICE_UNAVAILABLE, "overloaded"),
    ])
    .await;
    let model = server.model();

    let error = expect_error(ask(&model, &hello()).await, true, "429");
    assert!(error.message.contains("retry after 7"), "{}", error.message);
    assert!(
        error.message.contains("Rate limit reached"),
        "{}",
        error.message
    );
    assert!(error.message.contains("[redacted]"), "{}", error.message);

    expect_error(ask(&model, &hello()).await, true, "500");
    let error = expect_error(ask(&model, &hello()).await, true, "503");
    assert!(error.message.contains("overloaded"), "{}", error.message);

    // A streamed call is classified the same way.
    server
        .script
        .replies
        .lock()
        .unwrap()
        .push_back(error_body(StatusCode::TOO_MANY_REQUESTS, "again"));
    let (result, deltas) = ask_streaming(&model, &hello()).await;
    expect_error(result, true, "429");
    assert!(deltas.is_empty());
}

#[tokio::test]
async fn client_errors_are_fatal() {
    let server = Server::start(vec![
        error_body(StatusCode::BAD_REQUEST, "Invalid value for 'messages'"),
        error_body(
            StatusCode::UNAUTHORIZED,
            &format!("Incorrect API key provided: {KEY}"),
        ),
        Reply::raw(
            StatusCode::NOT_FOUND,
            "text/html",
            vec![b"<h1>no</h1>".to_vec()],
        ),
    ])
    .await;
    let model = server.model();

    let error = expect_error(ask(&model, &hello()).await, false, "400");
    assert!(
        error.message.contains("Invalid value for 'messages'"),
        "{}",
        error.message
    );
    let error = expect_error(ask(&model, &hello()).await, false, "401");
    assert!(error.message.contains("[redacted]"), "{}", error.message);
    expect_error(ask(&model, &hello()).await, false, "404");
}

#[tokio::test]
async fn a_truncated_json_body_is_a_fatal_error() {
    let full = json!({
        "choices": [{ "index": 0, "message": { "role": "assistant", "content": "the whole answer" } }],
        "usage": { "prompt_tokens": 1, "completion_tokens": 1 },
    })
    .to_string();
    let cut = full[..full.len() / 2].to_owned();
    let server = Server::start(vec![Reply::raw(
        StatusCode::OK,
        "application/json",
        split(&cut, 8),
    )])
    .await;

    expect_error(ask(&server.model(), &hello()).await, false, "truncated");
}

#[tokio::test]
async fn a_stream_without_done_is_a_fatal_error() {
    let body = sse(&[
        delta_chunk(json!({ "content": "partial " })),
        delta_chunk(json!({ "content": "answer" })),
    ]);
    let body = body.trim_end_matches("data: [DONE]\n\n");
    // And a stream cut in the middle of an event.
    let cut = format!("{body}data: {{\"choices\":[{{\"delta\":{{\"cont");
    let server = Server::start(vec![Reply::sse(body, 9), Reply::sse(&cut, 9)]).await;
    let model = server.model();

    let (result, deltas) = ask_streaming(&model, &hello()).await;
    expect_error(result, false, "[DONE]");
    assert_eq!(deltas, ["partial ", "answer"]);

    let (result, _) = ask_streaming(&model, &hello()).await;
    expect_error(result, false, "truncated");
}

#[tokio::test]
async fn malformed_responses_are_fatal_errors() {
    let ok = StatusCode::OK;
    let server = Server::start(vec![
        Reply::Json(ok, json!({})),
        Reply::Json(ok, json!({ "choices": [] })),
        Reply::Json(ok, json!({ "choices": [{ "index": 0 }] })),
        Reply::Json(ok, json!({ "choices": "many" })),
        Reply::Json(
            ok,
            json!({ "choices": [{ "message": { "content": 42 } }] }),
        ),
        Reply::Json(
            ok,
            json!({ "choices": [{ "message": { "tool_calls": [{ "id": "c", "function": { "arguments": "{}" } }] } }] }),
        ),
        Reply::Json(
            ok,
            json!({ "choices": [{ "message": { "content": "x" } }], "usage": { "prompt_tokens": -1 } }),
        ),
        Reply::raw(ok, "text/html", vec![b"<html>a login page</html>".to_vec()]),
        Reply::raw(ok, "application/json", vec![]),
    ])
    .await;
    let model = server.model();

    expect_error(ask(&model, &hello()).await, false, "no choices");
    expect_error(ask(&model, &hello()).await, false, "no choices");
    expect_error(ask(&model, &hello()).await, false, "no message");
    expect_error(ask(&model, &hello()).await, false, "malformed");
    expect_error(ask(&model, &hello()).await, false, "content is a number");
    expect_error(ask(&model, &hello()).await, false, "no function name");
    expect_error(ask(&model, &hello()).await, false, "malformed");
    expect_error(ask(&model, &hello()).await, false, "content-type text/html");
    expect_error(ask(&model, &hello()).await, false, "truncated");

    // Streams: an event that is not JSON, a tool call without a name.
    server.script.replies.lock().unwrap().extend([
        Reply::sse("data: {not json}\n\ndata: [DONE]\n\n", 64),
        Reply::sse(
            &sse(&[delta_chunk(
                json!({ "tool_calls": [{ "index": 0, "id": "c", "function": { "arguments": "{}" } }] }),
            )]),
            64,
        ),
    ]);
    let (result, _) = ask_streaming(&model, &hello()).await;
    expect_error(result, false, "malformed");
    let (result, _) = ask_streaming(&model, &hello()).await;
    expect_error(result, false, "no function name");
}

#[tokio::test]
async fn an_error_event_in_a_stream_is_reported() {
    let server = Server::start(vec![
        Reply::sse(
            &format!(
                "{}data: {}\n\n",
                sse(&[delta_chunk(json!({ "content": "Hi" }))]).trim_end_matches("data: [DONE]\n\n"),
                json!({ "error": { "message": format!("server overloaded ({KEY})"), "type": "server_error" } })
            ),
            16,
        ),
        Reply::sse(
            &format!(
                "data: {}\n\n",
                json!({ "error": { "message": "context too long", "type": "invalid_request_error", "code": 400 } })
            ),
            16,
        ),
    ])
    .await;
    let model = server.model();

    let (result, deltas) = ask_streaming(&model, &hello()).await;
    let error = expect_error(result, true, "server overloaded");
    assert!(error.message.contains("[redacted]"), "{}", error.message);
    assert_eq!(deltas, ["Hi"]);

    let (result, _) = ask_streaming(&model, &hello()).await;
    expect_error(result, false, "context too long");
}

#[tokio::test]
async fn a_slow_server_times_out_as_a_retryable_error() {
    let slow = |chunks: Vec<Vec<u8>>, delay: Duration, gap: Duration| Reply::Raw {
        status: StatusCode::OK,
        content_type: "text/event-stream",
        headers: Vec::new(),
        chunks,
        delay,
        gap,
    };
    let server = Server::start(vec![
        // No answer at all for 3 s.
        slow(vec![b"{}".to_vec()], Duration::from_secs(3), Duration::ZERO),
        // A stream that stalls after its first event.
        slow(
            vec![
                format!("data: {}\n\n", delta_chunk(json!({ "content": "slow" }))).into_bytes(),
                b"data: [DONE]\n\n".to_vec(),
            ],
            Duration::ZERO,
            Duration::from_secs(3),
        ),
    ])
    .await;
    let model = OpenAiModel::new(server.config().with_timeout(Duration::from_millis(200))).unwrap();

    let started = Instant::now();
    let error = expect_error(ask(&model, &hello()).await, true, "timed out");
    assert!(started.elapsed() < Duration::from_secs(2), "{error:?}");

    let started = Instant::now();
    let (result, deltas) = ask_streaming(&model, &hello()).await;
    expect_error(result, true, "timed out");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(deltas, ["slow"]);
}

#[tokio::test]
async fn a_refused_connection_is_retryable() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let config = OpenAiConfig::new(format!("http://{addr}/v1"), "test-model")
        .with_api_key(KEY)
        .with_timeout(Duration::from_secs(2));
    let model = OpenAiModel::new(config).unwrap();

    expect_error(ask(&model, &hello()).await, true, "connect");
}

// ---------------------------------------------------------------------------
// Configuration

#[tokio::test]
async fn the_api_key_stays_out_of_debug_output() {
    let server = Server::start(vec![]).await;
    let config = server.config();
    let debug = format!("{config:?}");
    assert!(!debug.contains(KEY), "{debug}");
    assert!(debug.contains("<redacted>"), "{debug}");
    assert!(debug.contains("test-model"), "{debug}");
    let debug = format!("{:?}", server.model());
    assert!(!debug.contains(KEY), "{debug}");
    let debug = format!("{:#?}", server.model());
    assert!(!debug.contains(KEY), "{debug}");

    // An unexpected answer (the script is empty) carries no key either.
    expect_error(ask(&server.model(), &hello()).await, false, "418");
}

#[tokio::test]
async fn no_authorization_header_without_a_key() {
    let server = Server::start(vec![text_completion("hi", 1, 1)]).await;
    let model = OpenAiModel::new(OpenAiConfig::new(&server.base_url, "local")).unwrap();
    assert_eq!(model.name(), "openai:local");
    assert_eq!(ask(&model, &hello()).await.unwrap().content, "hi");
    assert_eq!(server.authorization(0), None);
    assert_eq!(server.bodies()[0]["model"], "local");
    assert!(server.bodies()[0].get("max_tokens").is_none());
}

#[test]
fn invalid_configurations_are_refused() {
    let refused = |config: OpenAiConfig| OpenAiModel::new(config).expect_err("refused");
    assert!(!refused(OpenAiConfig::new("", "m")).retryable);
    refused(OpenAiConfig::new("ftp://127.0.0.1/v1", "m"));
    refused(OpenAiConfig::new("http://127.0.0.1/v1", " "));
    refused(OpenAiConfig::new("http://127.0.0.1/v1", "m").with_timeout(Duration::ZERO));
    let error = refused(OpenAiConfig::new("http://127.0.0.1/v1", "m").with_api_key("sk-bad\nkey"));
    assert!(!error.message.contains("sk-bad"), "{}", error.message);

    let model = OpenAiModel::new(OpenAiConfig::new("http://127.0.0.1:8080/v1/", "m")).unwrap();
    assert_eq!(
        model.endpoint(),
        "http://127.0.0.1:8080/v1/chat/completions"
    );
    assert_eq!(model.config().timeout, OpenAiConfig::DEFAULT_TIMEOUT);
    assert_eq!(OpenAiConfig::DEFAULT_TIMEOUT, Duration::from_secs(120));
}
