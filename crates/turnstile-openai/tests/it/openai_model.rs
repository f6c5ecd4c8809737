//! The OpenAI-compatible model against the scripted server (a real HTTP
//! server on loopback, see `support`): round trips, alone and in an agent
//! session, streaming, and what the configuration sends.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};
use turnstile::agent::ModelRequest;
use turnstile::{
    Agent, AgentSession, Content, ContextPolicy, ConversationId, Event, Message, Model, Namespace,
    Part, RequestId, RunContext, SqliteStore, ToolCall, Usage,
};
use turnstile_openai::{OpenAiConfig, OpenAiModel};

use crate::support::*;

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
            deadline: None,
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
            provider_metadata: None
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

    messages.push(Message::assistant_with_calls("", first.tool_calls.clone()));
    messages.push(Message::tool("call_1", "5", false));
    let second = model
        .respond(ModelRequest {
            messages: &messages,
            tools: &tools,
            deltas: None,
            deadline: None,
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
async fn text_parts_are_sent_a_line_each_so_placeholders_stay_apart() {
    let server = Server::start(vec![text_completion("ok", 10, 1)]).await;
    let model = OpenAiModel::new(server.config()).unwrap();
    // What a context with a committed answer's reasoning placeholder (sent
    // as nothing), a JSON part, and an image past the context's count,
    // holds.
    let messages = vec![
        Message::user_parts(vec![
            Part::text("[image: image/png, 34 KiB]"),
            Part::text("what is this?"),
        ]),
        Message::Assistant {
            content: Content::new(vec![
                Part::Reasoning(turnstile::Reasoning {
                    provider: "anthropic".into(),
                    ..Default::default()
                }),
                Part::text("a square"),
                Part::json(r#"{"side": 2}"#).unwrap(),
            ]),
            tool_calls: Vec::new(),
            provider_metadata: None,
        },
        Message::user("and now?"),
    ];
    model
        .respond(ModelRequest {
            messages: &messages,
            tools: &[],
            deltas: None,
            deadline: None,
        })
        .await
        .unwrap();
    assert_eq!(
        server.bodies()[0]["messages"],
        json!([
            { "role": "user", "content": "[image: image/png, 34 KiB]\nwhat is this?" },
            { "role": "assistant", "content": "a square\n{\"side\": 2}" },
            { "role": "user", "content": "and now?" },
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
        .with_tool(Arc::new(Add::default()));
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
    assert!(outcome
        .messages
        .contains(&Message::tool("call_1", "5", false)));

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
    let body = sse(&[
        delta_chunk(json!({ "role": "assistant", "content": "Let me add. " })),
        call_fragment(0, Some(("call_a", "add")), ""),
        call_fragment(0, None, "{\"a\":"),
        call_fragment(1, Some(("call_b", "add")), "{\"a\":10,"),
        call_fragment(0, None, " 2, \"b\""),
        call_fragment(1, None, "\"b\":20}"),
        call_fragment(0, None, ": 3}"),
        finish_chunk("tool_calls"),
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
                provider_metadata: None
            },
            ToolCall {
                id: "call_b".into(),
                name: "add".into(),
                arguments: "{\"a\":10,\"b\":20}".into(),
                provider_metadata: None
            },
        ]
    );
    assert_eq!(response.usage.total(), 70);
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

#[tokio::test]
async fn extra_body_members_are_sent_and_reserved_ones_refused() {
    let server = Server::start(vec![
        text_completion("with tools", 1, 1),
        text_completion("without tools", 1, 1),
    ])
    .await;
    let extra = json!({
        "temperature": 0,
        "tool_choice": "required",
        "parallel_tool_calls": false,
        "logit_bias": { "261": 20 },
        "user": "extra-body-mark",
    });
    let config = server
        .config()
        .with_extra_body(extra.as_object().unwrap().clone())
        .with_extra_body(json!({ "temperature": 0.5 }).as_object().unwrap().clone());
    let debug = format!("{config:?}");
    // Debug output names the members but shows no value.
    assert!(debug.contains("\"user\""), "{debug}");
    assert!(!debug.contains("extra-body-mark"), "{debug}");
    let model = OpenAiModel::new(config).unwrap();

    let tools = [add_spec()];
    model
        .respond(ModelRequest {
            messages: &hello(),
            tools: &tools,
            deltas: None,
            deadline: None,
        })
        .await
        .unwrap();
    ask(&model, &hello()).await.unwrap();
    let bodies = server.bodies();
    assert_eq!(bodies[0]["temperature"], 0.5);
    assert_eq!(bodies[0]["tool_choice"], "required");
    assert_eq!(bodies[0]["parallel_tool_calls"], false);
    assert_eq!(bodies[0]["logit_bias"], json!({ "261": 20 }));
    assert_eq!(bodies[0]["user"], "extra-body-mark");
    assert_eq!(bodies[0]["model"], "test-model");
    // Without tools, the members about tools are left out.
    assert_eq!(bodies[1]["temperature"], 0.5);
    assert!(bodies[1].get("tool_choice").is_none(), "{}", bodies[1]);
    assert!(
        bodies[1].get("parallel_tool_calls").is_none(),
        "{}",
        bodies[1]
    );

    for name in OpenAiConfig::RESERVED_BODY_MEMBERS {
        let mut member = serde_json::Map::new();
        member.insert(name.to_owned(), Value::Bool(true));
        let error = OpenAiModel::new(server.config().with_extra_body(member)).unwrap_err();
        assert!(!error.retryable);
        assert!(error.message.contains(name), "{}", error.message);
    }
}
