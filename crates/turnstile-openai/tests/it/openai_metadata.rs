//! Members of an answer and of its tool calls that the client does not read
//! (Gemini's `extra_content.google.thought_signature` on a tool call, a
//! server's own extension on the message): kept as provider metadata byte
//! for byte, streamed or not, and sent back in their place exactly.

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::json;
use turnstile::agent::ModelRequest;
use turnstile::{
    Agent, AgentSession, ContextPolicy, ConversationId, Message, Model, Namespace,
    ProviderMetadata, RequestId, RunContext, SqliteStore, Store, ToolCall,
};

use crate::support::*;

/// What a call's and a message's unknown members look like, as the server
/// writes them: keys out of order, a number past an f64, an escape.
const SIGNATURE: &str = r#""extra_content":{"google":{"thought_signature":"c2ln\u00e9=="}}"#;
const EXTENSION: &str = r#""x_trace":{"z":1,"a":123456789012345678901234567890}"#;

/// A Gemini-shaped tool call answer, as raw JSON text.
fn gemini_call() -> Reply {
    gemini_call_with("call_1", SIGNATURE)
}

/// A Gemini-shaped answer calling `add` as `call_id`, its signature
/// member `signature` as written.
pub fn gemini_call_with(call_id: &str, signature: &str) -> Reply {
    let body = format!(
        r#"{{"id":"c","object":"chat.completion","choices":[{{"index":0,"finish_reason":"tool_calls",
        "message":{{"role":"assistant","content":null,"refusal":null,{EXTENSION},
        "tool_calls":[{{"id":"{call_id}","type":"function",{signature},
        "function":{{"name":"add","arguments":"{{\"a\":2,\"b\":3}}"}}}}]}}}}],
        "usage":{{"prompt_tokens":5,"completion_tokens":5}}}}"#
    );
    Reply::raw(StatusCode::OK, "application/json", vec![body.into_bytes()])
}

/// The second round's signature member.
pub const SECOND_SIGNATURE: &str = r#""extra_content":{"google":{"thought_signature":"c2lnMg=="}}"#;

#[tokio::test]
async fn unknown_members_are_kept_exactly_and_go_back_in_their_place() {
    let server = Server::start(vec![gemini_call(), text_completion("5", 5, 1)]).await;
    server.require_signature("call_1", "c2lné==");
    let agent = Agent::new(Arc::new(server.model())).with_tool(Arc::new(Add::default()));
    let store = Arc::new(SqliteStore::in_memory().await.unwrap());
    let conversation = ConversationId::new();
    let session = AgentSession::new(
        agent,
        store.clone(),
        conversation,
        Namespace::new("openai-test").unwrap(),
        ContextPolicy::default(),
    );
    session
        .run(RequestId::new(), "2 + 3?", RunContext::default())
        .await
        .unwrap();

    let transcript = store.transcript_window(conversation, 10).await.unwrap();
    let Message::Assistant {
        tool_calls,
        provider_metadata,
        ..
    } = &transcript[1].message
    else {
        panic!("{transcript:?}");
    };
    assert_eq!(
        provider_metadata.as_ref().map(ProviderMetadata::as_str),
        Some(format!("{{{EXTENSION}}}").as_str()),
        "refusal (null) is not kept"
    );
    assert_eq!(
        tool_calls[0]
            .provider_metadata
            .as_ref()
            .map(ProviderMetadata::as_str),
        Some(format!("{{{SIGNATURE}}}").as_str())
    );

    // The next call carries both back where they came from, as written.
    let sent = &server.raw_bodies()[1];
    assert!(sent.contains(EXTENSION), "{sent}");
    assert!(sent.contains(SIGNATURE), "{sent}");
    let body = &server.bodies()[1];
    assert_eq!(
        body["messages"][1]["tool_calls"][0]["extra_content"]["google"]["thought_signature"],
        "c2lné=="
    );
    assert_eq!(body["messages"][1]["x_trace"]["z"], 1);
}

#[tokio::test]
async fn gemini_signatures_pass_two_tool_rounds_and_one_a_byte_off_is_refused() {
    let server = Server::start(vec![
        gemini_call(),
        gemini_call_with("call_2", SECOND_SIGNATURE),
        text_completion("10", 5, 1),
    ])
    .await;
    server.require_signature("call_1", "c2lné==");
    server.require_signature("call_2", "c2lnMg==");
    let add = Arc::new(Add::default());
    let agent = Agent::new(Arc::new(server.model())).with_tool(add.clone());
    let store = Arc::new(SqliteStore::in_memory().await.unwrap());
    let conversation = ConversationId::new();
    let session = AgentSession::new(
        agent,
        store.clone(),
        conversation,
        Namespace::new("openai-test").unwrap(),
        ContextPolicy::default(),
    );
    let outcome = session
        .run(RequestId::new(), "2 + 3, twice?", RunContext::default())
        .await
        .unwrap();
    assert_eq!(outcome.final_text, "10");
    assert_eq!(add.calls(), 2);
    let last = &server.raw_bodies()[2];
    assert!(
        last.contains(SIGNATURE) && last.contains(SECOND_SIGNATURE),
        "{last}"
    );

    // The same transcript with the first signature one byte off.
    let mut transcript: Vec<Message> = store
        .transcript_window(conversation, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|entry| entry.message)
        .collect();
    transcript.truncate(transcript.len() - 1);
    let Message::Assistant { tool_calls, .. } = &mut transcript[1] else {
        panic!("{transcript:?}");
    };
    let tampered = SIGNATURE.replace("c2ln", "c2lm");
    tool_calls[0].provider_metadata =
        Some(ProviderMetadata::new(format!("{{{tampered}}}")).unwrap());
    let error = ask(&server.model(), &transcript).await.unwrap_err();
    assert_eq!(error.status, Some(400), "{error}");
    assert!(!error.retryable);
    assert!(error.message.contains("thought_signature"), "{error}");
}

#[tokio::test]
async fn streamed_members_are_kept_from_their_fragments() {
    let first = json!({
        "index": 0, "id": "call_1", "type": "function",
        "extra_content": { "google": { "thought_signature": "sig" } },
        "function": { "name": "add", "arguments": "{\"a\":" },
    });
    let body = sse(&[
        delta_chunk(json!({ "role": "assistant", "x_stream": true })),
        delta_chunk(json!({ "tool_calls": [first] })),
        call_fragment(0, None, "2,\"b\":3}"),
        finish_chunk("tool_calls"),
        usage_chunk(3, 4),
    ]);
    let server = Server::start(vec![Reply::sse(&body, 11)]).await;
    let deltas = |_: &str| {};
    let answer = server
        .model()
        .respond(ModelRequest {
            messages: &hello(),
            tools: &[add_spec()],
            deltas: Some(&deltas),
            deadline: None,
        })
        .await
        .unwrap();
    assert_eq!(
        answer
            .provider_metadata
            .as_ref()
            .map(ProviderMetadata::as_str),
        Some(r#"{"x_stream":true}"#)
    );
    assert_eq!(
        answer.tool_calls[0]
            .provider_metadata
            .as_ref()
            .map(ProviderMetadata::as_str),
        Some(r#"{"extra_content":{"google":{"thought_signature":"sig"}}}"#)
    );
    assert_eq!(answer.tool_calls[0].arguments, "{\"a\":2,\"b\":3}");
}

#[tokio::test]
async fn metadata_cannot_replace_what_the_client_sends() {
    let server = Server::start(vec![text_completion("ok", 1, 1)]).await;
    let metadata = |text: &str| Some(ProviderMetadata::new(text).unwrap());
    let messages = vec![
        Message::user("hi"),
        Message::Assistant {
            content: "the real text".into(),
            tool_calls: vec![ToolCall {
                provider_metadata: metadata(r#"{"id": "forged", "kept": 1}"#),
                ..ToolCall::new("call_1", "add", json!({"a": 1, "b": 1}))
            }],
            provider_metadata: metadata(
                r#"{"role": "system", "content": "forged", "tool_calls": []}"#,
            ),
        },
        Message::tool("call_1", "2", false),
        Message::Assistant {
            content: "no calls".into(),
            tool_calls: Vec::new(),
            provider_metadata: metadata(
                r#"{"tool_calls": [{"id": "forged"}], "reasoning_content": "forged", "dup": 1, "dup": 2}"#,
            ),
        },
        Message::user("again"),
    ];
    server
        .model()
        .respond(ModelRequest {
            messages: &messages,
            tools: &[add_spec()],
            deltas: None,
            deadline: None,
        })
        .await
        .unwrap();
    let sent = &server.bodies()[0]["messages"][1];
    assert_eq!(sent["role"], "assistant");
    assert_eq!(sent["content"], "the real text");
    assert_eq!(sent["tool_calls"][0]["id"], "call_1");
    assert_eq!(sent["tool_calls"][0]["kept"], 1);
    let plain = &server.bodies()[0]["messages"][3];
    assert!(plain.get("tool_calls").is_none(), "{plain}");
    assert!(plain.get("reasoning_content").is_none(), "{plain}");
    assert_eq!(plain["dup"], 2);
    // Each member once: a duplicate key would leave the choice to the server.
    let raw = &server.raw_bodies()[0];
    assert_eq!(raw.matches("\"dup\"").count(), 1, "{raw}");
    assert_eq!(raw.matches("\"role\":\"assistant\"").count(), 2, "{raw}");
    assert_eq!(raw.matches("forged").count(), 0, "{raw}");
}
