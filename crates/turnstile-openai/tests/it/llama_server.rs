//! The OpenAI-compatible model against a server not written here:
//! llama.cpp's `llama-server` on loopback ([`LlamaServer`], which the test
//! kit starts on a tiny generated model).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use turnstile::agent::{ModelRequest, ModelResponse};
use turnstile::{Message, Model, ModelError, RequestId, RunContext, ToolSpec};
use turnstile_openai::{OpenAiConfig, OpenAiModel, ReasoningReplay, RetryPolicy};
use turnstile_testkit::llama::{LlamaServer, BYTE_FF, END_OF_SEQUENCE, REASONING, TOOL_CALL};

use crate::support::*;

/// A model on `server` sending `extra` with every request, answers at
/// most `max_tokens` long. It sends nothing again, so each failure is seen
/// as the server caused it (retries are `openai_errors`' subject).
fn model(server: &LlamaServer, extra: Value, max_tokens: u32) -> OpenAiModel {
    let config = OpenAiConfig::new(format!("{}/v1", server.root), "tiny-llama")
        .with_retry(RetryPolicy::NEVER)
        .with_timeout(Duration::from_secs(60))
        .with_max_output_tokens(max_tokens)
        .with_extra_body(extra.as_object().unwrap().clone());
    OpenAiModel::new(config).unwrap()
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
    let server = LlamaServer::start(&[]).await;
    let up = started.elapsed();
    let hello = [Message::user("hello")];
    let add = [add_spec()];

    // A plain answer: the end-of-sequence token slightly favoured ends it
    // after a few characters.
    let text = model(
        &server,
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
    let one_call = model(
        &server,
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
    let cut_calls = model(
        &server,
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
    let cut_text = model(&server, sampling(&[(TOOL_CALL, -100)], json!({})), 8);
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
    let invalid = model(&server, sampling(&[(BYTE_FF, 100)], json!({})), 8);
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
        .post(format!("{}/v1/chat/completions", server.root))
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

/// Thinking asked for with a budget of 0: the server's reasoning is then
/// its budget message, [`REASONING`], and the answer follows.
fn thinking(members: Value) -> Value {
    let mut body = json!({
        "thinking_budget_tokens": 0,
        "chat_template_kwargs": { "enable_thinking": true },
    });
    body.as_object_mut()
        .unwrap()
        .extend(members.as_object().unwrap().clone());
    body
}

#[track_caller]
fn assert_reasoning(response: &ModelResponse) {
    let reasoning: Vec<_> = response.content.reasoning().collect();
    assert_eq!(reasoning.len(), 1, "{response:?}");
    assert_eq!(reasoning[0].provider, "openai");
    assert_eq!(reasoning[0].text.as_deref(), Some(REASONING));
    assert!(!response.content.text().contains(REASONING), "{response:?}");
}

#[tokio::test]
async fn openai_reasoning_against_llama_server() {
    let server = LlamaServer::start(&[]).await;
    let hello = [Message::user("hello")];
    let add = [add_spec()];

    // `reasoning_content` before a text answer, streamed or not; the
    // reasoning is no text delta.
    let text = model(
        &server,
        sampling(
            &[(TOOL_CALL, -100), (END_OF_SEQUENCE, 6)],
            thinking(json!({})),
        ),
        64,
    );
    let (answer, _) = call(&text, &hello, &[], false).await;
    let answer = answer.unwrap();
    assert_reasoning(&answer);
    assert!(!answer.content.text().is_empty(), "{answer:?}");
    let (streamed, deltas) = call(&text, &hello, &[], true).await;
    let streamed = streamed.unwrap();
    assert_eq!(streamed.content, answer.content);
    assert_eq!(deltas, answer.content.text());

    // Reasoning, then a tool call.
    let one_call = model(
        &server,
        sampling(
            &[(TOOL_CALL, 20), (END_OF_SEQUENCE, 30)],
            thinking(json!({ "tool_choice": "required", "parallel_tool_calls": false })),
        ),
        200,
    );
    let (called, _) = call(&one_call, &hello, &add, false).await;
    let called = called.unwrap();
    assert_reasoning(&called);
    assert_add_call(&called);
    let (streamed, _) = call(&one_call, &hello, &add, true).await;
    let streamed = streamed.unwrap();
    assert_reasoning(&streamed);
    assert_eq!(
        streamed.tool_calls[0].arguments,
        called.tool_calls[0].arguments
    );

    // The tool loop goes on: with `CurrentToolCycle` the call's reasoning
    // goes back and the server renders it into the prompt (more tokens);
    // with the default `Never` it does not.
    let loop_messages = [
        Message::user("hello"),
        Message::Assistant {
            content: called.content.clone(),
            tool_calls: called.tool_calls.clone(),
            provider_metadata: None,
        },
        Message::tool(called.tool_calls[0].id.clone(), "3", false),
    ];
    let follow_up = |replay: ReasoningReplay| {
        let config = OpenAiConfig::new(format!("{}/v1", server.root), "tiny-llama")
            .with_max_output_tokens(64)
            .with_extra_body(
                sampling(&[(TOOL_CALL, -100), (END_OF_SEQUENCE, 6)], json!({}))
                    .as_object()
                    .unwrap()
                    .clone(),
            )
            .with_reasoning_replay(replay);
        OpenAiModel::new(config).unwrap()
    };
    let (without, _) = call(
        &follow_up(ReasoningReplay::Never),
        &loop_messages,
        &add,
        false,
    )
    .await;
    let (with, _) = call(
        &follow_up(ReasoningReplay::CurrentToolCycle),
        &loop_messages,
        &add,
        false,
    )
    .await;
    let (without, with) = (without.unwrap(), with.unwrap());
    assert!(
        with.usage.input_tokens > without.usage.input_tokens,
        "the reasoning was not rendered back: {} vs {} prompt tokens",
        with.usage.input_tokens,
        without.usage.input_tokens
    );
}
