//! Shared helpers of the turnstile-openai tests: a real HTTP server on
//! loopback that answers chat-completion requests from a script and records
//! what it was sent, the builders of its scripts, an `add` tool that counts
//! its calls, and the checks of a run stopped by a model error.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use turnstile::agent::{ModelRequest, ModelResponse};
use turnstile::{
    Agent, AgentSession, CheckpointPhase, ContextPolicy, ConversationId, Error, Message, Model,
    ModelError, Namespace, Revision, RunId, SqliteStore, Tool, ToolContext, ToolError, ToolSpec,
};
use turnstile_openai::{OpenAiConfig, OpenAiModel, RetryPolicy};

pub const KEY: &str = "sk-test-0123456789abcdef";

/// One scripted answer.
#[derive(Clone)]
pub enum Reply {
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
    pub fn raw(status: StatusCode, content_type: &'static str, chunks: Vec<Vec<u8>>) -> Self {
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
    pub fn sse(body: &str, every: usize) -> Self {
        Reply::raw(StatusCode::OK, "text/event-stream", split(body, every))
    }
}

/// What the server was sent.
pub struct Recorded {
    headers: HeaderMap,
    body: Value,
    /// The body as it was sent, byte for byte.
    raw: String,
}

#[derive(Clone, Default)]
pub struct Script {
    pub replies: Arc<Mutex<VecDeque<Reply>>>,
    requests: Arc<Mutex<Vec<Recorded>>>,
    /// Thought signatures the server issued, by call id: a request whose
    /// answer calls one without it exactly is refused, as Gemini does.
    signatures: Arc<Mutex<Vec<(String, String)>>>,
}

pub struct Server {
    pub base_url: String,
    pub script: Script,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    pub async fn start(replies: Vec<Reply>) -> Self {
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

    /// A configuration that sends nothing again, so a test sees each
    /// scripted failure as the model classified it (`openai_errors`' retry
    /// tests set [`fast_retries`]).
    pub fn config(&self) -> OpenAiConfig {
        OpenAiConfig::new(&self.base_url, "test-model")
            .with_api_key(KEY)
            .with_retry(RetryPolicy::NEVER)
    }

    pub fn model(&self) -> OpenAiModel {
        OpenAiModel::new(self.config()).unwrap()
    }

    /// How many requests the server was sent.
    pub fn requests(&self) -> usize {
        self.script.requests.lock().unwrap().len()
    }

    pub fn bodies(&self) -> Vec<Value> {
        let requests = self.script.requests.lock().unwrap();
        requests.iter().map(|r| r.body.clone()).collect()
    }

    /// The request bodies as they were sent.
    pub fn raw_bodies(&self) -> Vec<String> {
        let requests = self.script.requests.lock().unwrap();
        requests.iter().map(|r| r.raw.clone()).collect()
    }

    /// Refuses, from now on, a request holding the call `call_id` without
    /// exactly this `extra_content.google.thought_signature`.
    pub fn require_signature(&self, call_id: &str, signature: &str) {
        let mut signatures = self.script.signatures.lock().unwrap();
        signatures.push((call_id.to_owned(), signature.to_owned()));
    }

    pub fn authorization(&self, i: usize) -> Option<String> {
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
    let raw = String::from_utf8_lossy(&body).into_owned();
    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    script.requests.lock().unwrap().push(Recorded {
        headers,
        body: body.clone(),
        raw,
    });
    if let Some(refusal) = unsigned_call(&script.signatures.lock().unwrap(), &body) {
        let error =
            json!({ "error": { "code": 400, "message": refusal, "status": "INVALID_ARGUMENT" } });
        return (StatusCode::BAD_REQUEST, Json(error)).into_response();
    }
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

/// Gemini's refusal of a call sent back without its thought signature, or
/// with one a byte off.
fn unsigned_call(signatures: &[(String, String)], body: &Value) -> Option<String> {
    let messages = body["messages"].as_array()?;
    for (m, message) in messages.iter().enumerate() {
        for call in message["tool_calls"].as_array().into_iter().flatten() {
            let expected = signatures
                .iter()
                .find(|(id, _)| call["id"].as_str() == Some(id.as_str()));
            if let Some((_, signature)) = expected {
                let sent = call["extra_content"]["google"]["thought_signature"].as_str();
                if sent != Some(signature.as_str()) {
                    return Some(format!(
                        "Function call in the {} content block is missing a valid `thought_signature`",
                        m + 1
                    ));
                }
            }
        }
    }
    None
}

pub fn split(text: &str, every: usize) -> Vec<Vec<u8>> {
    text.as_bytes().chunks(every).map(<[u8]>::to_vec).collect()
}

/// `data: …` events for `chunks`, then `data: [DONE]`.
pub fn sse(chunks: &[Value]) -> String {
    let mut body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    body.push_str("data: [DONE]\n\n");
    body
}

pub fn delta_chunk(delta: Value) -> Value {
    json!({
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "choices": [{ "index": 0, "delta": delta, "finish_reason": null }],
        "usage": null,
    })
}

/// A fragment of tool call `index`: its id and name come with the first.
pub fn call_fragment(index: u64, first: Option<(&str, &str)>, arguments: &str) -> Value {
    let mut call = json!({ "index": index, "function": { "arguments": arguments } });
    if let Some((id, name)) = first {
        call["id"] = json!(id);
        call["type"] = json!("function");
        call["function"]["name"] = json!(name);
    }
    delta_chunk(json!({ "tool_calls": [call] }))
}

/// The chunk that ends the first choice for `finish_reason`.
pub fn finish_chunk(finish_reason: &str) -> Value {
    json!({
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "choices": [{ "index": 0, "delta": {}, "finish_reason": finish_reason }],
    })
}

pub fn usage_chunk(prompt: u64, completion: u64) -> Value {
    json!({
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": { "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion },
    })
}

/// A non-streamed answer that ended for `finish_reason`.
pub fn completion(message: Value, usage: Value, finish_reason: &str) -> Reply {
    Reply::Json(
        StatusCode::OK,
        json!({
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "test-model",
            "choices": [{ "index": 0, "message": message, "finish_reason": finish_reason }],
            "usage": usage,
        }),
    )
}

pub fn text_completion(text: &str, prompt: u64, completion_tokens: u64) -> Reply {
    completion(
        json!({ "role": "assistant", "content": text }),
        json!({ "prompt_tokens": prompt, "completion_tokens": completion_tokens }),
        "stop",
    )
}

pub fn add_call_completion() -> Reply {
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
        "tool_calls",
    )
}

pub fn error_body(status: StatusCode, message: &str) -> Reply {
    Reply::Json(
        status,
        json!({ "error": { "message": message, "type": "error", "code": null } }),
    )
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

/// Adds two integers and counts its calls.
#[derive(Default)]
pub struct Add {
    calls: AtomicUsize,
}

impl Add {
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

#[turnstile::async_trait]
impl Tool for Add {
    fn spec(&self) -> ToolSpec {
        add_spec()
    }

    async fn call(&self, args: Value, _: ToolContext) -> Result<turnstile::Content, ToolError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        match (args["a"].as_i64(), args["b"].as_i64()) {
            (Some(a), Some(b)) => Ok((a + b).to_string().into()),
            _ => Err(ToolError::new("a and b must be integers")),
        }
    }
}

pub async fn ask(model: &OpenAiModel, messages: &[Message]) -> Result<ModelResponse, ModelError> {
    model
        .respond(ModelRequest {
            messages,
            tools: &[],
            deltas: None,
            deadline: None,
        })
        .await
}

/// Asks with a delta callback; returns the answer and the deltas seen.
pub async fn ask_streaming(
    model: &OpenAiModel,
    messages: &[Message],
) -> (Result<ModelResponse, ModelError>, Vec<String>) {
    let seen = Mutex::new(Vec::new());
    let on_delta = |text: &str| seen.lock().unwrap().push(text.to_owned());
    let result = model
        .respond(ModelRequest {
            messages,
            tools: &[],
            deltas: Some(&on_delta),
            deadline: None,
        })
        .await;
    (result, seen.into_inner().unwrap())
}

/// The default number of retries, with waits short enough for a test
/// (a server's `retry-after` is still waited for, up to a second).
pub fn fast_retries() -> RetryPolicy {
    RetryPolicy {
        backoff: Duration::from_millis(20),
        max_wait: Duration::from_secs(1),
        ..RetryPolicy::default()
    }
}

pub fn hello() -> Vec<Message> {
    vec![Message::user("hello")]
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

#[track_caller]
pub fn expect_error(
    result: Result<ModelResponse, ModelError>,
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

/// A session of an agent on `model` with the `add` tool, on a new in-memory
/// store.
pub async fn add_session(model: Arc<dyn Model>, add: Arc<Add>) -> (AgentSession, Arc<SqliteStore>) {
    let store = Arc::new(SqliteStore::in_memory().await.unwrap());
    let session = AgentSession::new(
        Agent::new(model).with_tool(add),
        store.clone(),
        ConversationId::new(),
        Namespace::new("openai-test").unwrap(),
        ContextPolicy::default(),
    );
    (session, store)
}

/// Checks that `error` is a model error that stopped a run of `session` in
/// `turn`: not retryable and mentioning `needle`, the admission still held
/// by the run, its checkpoint settled to `ModelPending` so the default
/// resume policy retries the model call. Returns the run and revision to
/// resume.
pub async fn assert_model_stop(
    session: &AgentSession,
    error: &Error,
    needle: &str,
    turn: u32,
) -> (RunId, Revision) {
    match error {
        Error::Model { source, .. } => {
            assert!(!source.retryable, "{source:?}");
            assert!(source.message.contains(needle), "{source}");
        }
        other => panic!("expected a model error, got {other:?}"),
    }
    let (run_id, revision) = error.stopped_run().expect("a stopped run");
    let store = session.store();
    let admission = store.admission(session.conversation_id()).await.unwrap();
    assert_eq!(admission.revision, revision);
    assert_eq!(admission.active.expect("admission held").run_id, run_id);
    let checkpoint = store.latest_checkpoint(run_id).await.unwrap().unwrap();
    assert_eq!(
        (checkpoint.turn, checkpoint.phase),
        (turn, CheckpointPhase::ModelPending)
    );
    (run_id, revision)
}
