//! The Anthropic client against a server not written here: llama.cpp's
//! `llama-server`, which speaks the Messages API too (`/v1/messages`), on
//! the test kit's tiny generated model. The pinned build's `/v1/messages`
//! drops a request's `logit_bias` (and `grammar`) when it converts the
//! request, so each answer shape is a server started with its own biases.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use turnstile::agent::ModelResponse;
use turnstile::{
    Agent, AgentSession, AnthropicConfig, AnthropicModel, CheckpointPhase, ContextPolicy,
    ConversationId, Error, Message, Namespace, RequestId, RunContext, SqliteStore,
};
use turnstile_testkit::llama::{LlamaServer, END_OF_SEQUENCE, REASONING, TOOL_CALL, TOOL_CALL_END};
use turnstile_testkit::tools::CountingTool;

use crate::support::{add_spec, respond};

/// `--logit-bias` arguments for these tokens and biases.
fn biases(biases: &[(u32, i32)]) -> Vec<String> {
    biases
        .iter()
        .flat_map(|(token, bias)| ["--logit-bias".to_owned(), format!("{token}{bias:+}")])
        .collect()
}

/// Starts a server with these biases.
async fn server_biased(token_biases: &[(u32, i32)]) -> LlamaServer {
    let args = biases(token_biases);
    LlamaServer::start(&args.iter().map(String::as_str).collect::<Vec<_>>()).await
}

/// A model on `server`; with thinking, a budget of 0 makes the reasoning
/// the server's budget message.
fn model(server: &LlamaServer, thinking: bool, max_tokens: u32, extra: Value) -> AnthropicModel {
    let mut body = json!({ "temperature": 0 });
    if thinking {
        body["chat_template_kwargs"] = json!({ "enable_thinking": true });
    }
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let mut config = AnthropicConfig::new("tiny-llama")
        .with_base_url(&server.root)
        .with_max_tokens(max_tokens)
        .with_timeout(Duration::from_secs(60))
        .with_extra_body(body.as_object().unwrap().clone());
    if thinking {
        config = config.with_thinking_budget(0);
    }
    AnthropicModel::new(config).unwrap()
}

/// The same model, asking for whole answers instead of streams.
fn unstreamed(model: &AnthropicModel) -> AnthropicModel {
    AnthropicModel::new(model.config().clone().with_streaming(false)).unwrap()
}

#[track_caller]
fn assert_thinking(response: &ModelResponse) {
    let reasoning: Vec<_> = response.content.reasoning().collect();
    assert_eq!(reasoning.len(), 1, "{response:?}");
    assert_eq!(reasoning[0].provider, "anthropic");
    assert_eq!(reasoning[0].text.as_deref(), Some(REASONING));
    // The server signs nothing; the empty signature is kept, to go back.
    assert_eq!(reasoning[0].signature.as_deref(), Some(""));
}

#[tokio::test]
async fn anthropic_model_against_llama_server() {
    // Text answers of a few characters: no tool call, the end favoured.
    let text_server = server_biased(&[(TOOL_CALL, -100), (END_OF_SEQUENCE, 6)]).await;
    // One tool call: the call token favoured, its end after one object,
    // then the end of the answer.
    let call_server =
        server_biased(&[(TOOL_CALL, 20), (TOOL_CALL_END, 10), (END_OF_SEQUENCE, 30)]).await;
    let hello = [Message::system("You are terse."), Message::user("hello")];
    let add = [add_spec()];

    // A text answer, streamed or not.
    let text = model(&text_server, false, 64, json!({}));
    let answer = respond(&unstreamed(&text), &hello, &[], false)
        .await
        .0
        .unwrap();
    assert!(!answer.content.text().is_empty(), "{answer:?}");
    assert!(answer.usage.input_tokens > 0 && answer.usage.output_tokens > 0);
    let (streamed, deltas) = respond(&text, &hello, &[], true).await;
    let streamed = streamed.unwrap();
    assert_eq!(streamed.content, answer.content);
    assert_eq!(deltas, answer.content.text());
    assert_eq!(streamed.usage.input_tokens, answer.usage.input_tokens);

    // Thinking, then text: streamed, the text block starts before the
    // thinking block ends (this server's order).
    let thoughtful = model(&text_server, true, 64, json!({}));
    let answer = respond(&unstreamed(&thoughtful), &hello, &[], false)
        .await
        .0
        .unwrap();
    assert_thinking(&answer);
    let (streamed, deltas) = respond(&thoughtful, &hello, &[], true).await;
    let streamed = streamed.unwrap();
    assert_eq!(streamed.content, answer.content);
    assert_eq!(deltas, answer.content.text());

    // Thinking, then a tool call whose input is the model's JSON text.
    let caller = model(
        &call_server,
        true,
        200,
        json!({ "tool_choice": { "type": "any" } }),
    );
    let called = respond(&unstreamed(&caller), &hello, &add, false)
        .await
        .0
        .unwrap();
    assert_thinking(&called);
    assert_eq!(called.tool_calls.len(), 1, "{called:?}");
    let call = &called.tool_calls[0];
    assert_eq!(call.name, "add");
    let input: Value = serde_json::from_str(&call.arguments).unwrap();
    assert!(input["a"].is_i64() && input["b"].is_i64(), "{input}");
    let (streamed, _) = respond(&caller, &hello, &add, true).await;
    let streamed = streamed.unwrap();
    assert_thinking(&streamed);
    // Streamed, the input is the model's text; whole, the server's
    // serialization of what it parsed: the same value.
    let streamed_input: Value = serde_json::from_str(&streamed.tool_calls[0].arguments).unwrap();
    assert_eq!(streamed_input, input);

    // The loop goes on: the answer goes back with its thinking (which the
    // server renders into the prompt: more tokens than without it), and
    // the tool's result as a tool_result block.
    let loop_with = |content: turnstile::Content| {
        vec![
            Message::user("hello"),
            Message::Assistant {
                content,
                tool_calls: called.tool_calls.clone(),
                provider_metadata: None,
            },
            Message::tool(call.id.clone(), "3", false),
        ]
    };
    let with = respond(&text, &loop_with(called.content.clone()), &add, false)
        .await
        .0
        .unwrap();
    let without = respond(
        &text,
        &loop_with(turnstile::Content::default()),
        &add,
        false,
    )
    .await
    .0
    .unwrap();
    assert!(
        with.usage.input_tokens > without.usage.input_tokens,
        "the thinking was not rendered back: {} vs {} prompt tokens",
        with.usage.input_tokens,
        without.usage.input_tokens
    );

    // A prompt over the context is refused, typed, not retried.
    let long = [Message::user("x".repeat(5000))];
    for stream in [false, true] {
        let error = respond(&text, &long, &[], stream).await.0.unwrap_err();
        assert_eq!(error.status, Some(400), "{error}");
        assert!(!error.retryable);
        assert!(error.message.contains("context size"), "{error}");
    }

    // An agent run end to end: the tool offered, the answer (with its
    // thinking) committed.
    let store = Arc::new(SqliteStore::in_memory().await.unwrap());
    let session = |model: AnthropicModel| {
        AgentSession::new(
            Agent::new(Arc::new(model)).with_tool(CountingTool::new("add")),
            store.clone(),
            ConversationId::new(),
            Namespace::new("anthropic-llama").unwrap(),
            ContextPolicy::default(),
        )
    };
    let run = session(model(&text_server, true, 64, json!({})));
    let outcome = run
        .run(RequestId::new(), "hello", RunContext::default())
        .await
        .unwrap();
    assert!(!outcome.final_text.is_empty(), "{outcome:?}");
    let transcript = run
        .store()
        .transcript_window(run.conversation_id(), 10)
        .await
        .unwrap();
    assert_eq!(transcript[1].message.content().reasoning().count(), 1);

    // An answer cut at max_tokens stops the run, the admission held and
    // the checkpoint waiting for the model again.
    let cut = session(model(&text_server, false, 3, json!({})));
    let error = cut
        .run(RequestId::new(), "hello", RunContext::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Error::Model { source, .. } if source.message.contains("max_tokens (3")),
        "{error:?}"
    );
    let (run_id, _) = error.stopped_run().unwrap();
    let admission = cut.store().admission(cut.conversation_id()).await.unwrap();
    assert_eq!(admission.active.expect("held").run_id, run_id);
    let checkpoint = cut
        .store()
        .latest_checkpoint(run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(checkpoint.phase, CheckpointPhase::ModelPending);
}
