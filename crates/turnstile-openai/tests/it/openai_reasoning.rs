//! Reasoning from OpenAI-compatible servers (`reasoning_content`, or
//! `reasoning`): read from answers and streams into a reasoning part,
//! stored with its answer, and sent back with it as the configuration's
//! `ReasoningReplay` says (never, by default).

use std::sync::Arc;

use serde_json::{json, Value};
use turnstile::agent::ModelRequest;
use turnstile::{
    Agent, AgentSession, ContextPolicy, ConversationId, Message, Model, Namespace, Part, Reasoning,
    ReasoningReplay, RequestId, RunContext, SqliteStore, Store,
};
use turnstile_openai::OpenAiModel;

use crate::support::*;

fn openai_reasoning(text: &str) -> Part {
    Part::Reasoning(Reasoning {
        provider: "openai".into(),
        text: Some(text.into()),
        signature: None,
        redacted: None,
    })
}

/// A tool call to `add` with reasoning, as a server sends it.
fn reasoned_call(field: &str, reasoning: &str) -> Reply {
    let mut message = json!({
        "role": "assistant",
        "content": null,
        "tool_calls": [{
            "id": "call_1",
            "type": "function",
            "function": { "name": "add", "arguments": "{\"a\":2,\"b\":3}" },
        }],
    });
    message[field] = json!(reasoning);
    completion(
        message,
        json!({"prompt_tokens": 5, "completion_tokens": 5}),
        "tool_calls",
    )
}

#[tokio::test]
async fn reasoning_is_read_into_a_part_and_goes_back_within_the_tool_loop() {
    let server = Server::start(vec![
        reasoned_call("reasoning_content", "first add, then answer"),
        text_completion("5", 5, 1),
        reasoned_call("reasoning", "again: add"),
        text_completion("5 again", 5, 1),
    ])
    .await;
    let config = server
        .config()
        .with_reasoning_replay(ReasoningReplay::CurrentToolCycle);
    let model = OpenAiModel::new(config).unwrap();
    let agent = Agent::new(Arc::new(model)).with_tool(Arc::new(Add::default()));
    let store = Arc::new(SqliteStore::in_memory().await.unwrap());
    let conversation = ConversationId::new();
    let session = AgentSession::new(
        agent,
        store.clone(),
        conversation,
        Namespace::new("openai-test").unwrap(),
        ContextPolicy::default(),
    );
    for input in ["2 + 3?", "and again?"] {
        session
            .run(RequestId::new(), input, RunContext::default())
            .await
            .unwrap();
    }

    // Stored with the answer that carried it, whichever way it was spelled.
    let transcript = store.transcript_window(conversation, 100).await.unwrap();
    let reasoning: Vec<Vec<Part>> = transcript
        .iter()
        .filter(|e| !e.message.tool_calls().is_empty())
        .map(|e| e.message.content().parts().to_vec())
        .collect();
    assert_eq!(
        reasoning,
        [
            vec![openai_reasoning("first add, then answer")],
            vec![openai_reasoning("again: add")]
        ]
    );

    let bodies = server.bodies();
    assert_eq!(bodies.len(), 4);
    // The call after the tool result sends the loop's reasoning back.
    let answer = assistant_messages(&bodies[1]);
    assert_eq!(answer[0]["reasoning_content"], "first add, then answer");
    assert_eq!(answer[0]["content"], Value::Null);
    // The next request's calls: the committed answer without its reasoning
    // (its placeholder is sent as nothing), the new loop's with it.
    let later = assistant_messages(&bodies[3]);
    assert!(later[0].get("reasoning_content").is_none(), "{later:?}");
    assert_eq!(later[0]["content"], Value::Null);
    assert_eq!(later[2]["reasoning_content"], "again: add");
}

fn assistant_messages(body: &Value) -> Vec<Value> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "assistant")
        .cloned()
        .collect()
}

/// A context of two tool loops, each answer with this client's reasoning,
/// and one answer with another provider's.
fn two_loops() -> Vec<Message> {
    let answer = |text: &str| Message::Assistant {
        content: turnstile::Content::new(vec![openai_reasoning(text)]),
        tool_calls: vec![turnstile::ToolCall::new(
            "c",
            "add",
            json!({"a": 1, "b": 1}),
        )],
        provider_metadata: None,
    };
    vec![
        Message::user("one"),
        answer("loop one"),
        Message::tool("c", "2", false),
        Message::user("two"),
        Message::Assistant {
            content: turnstile::Content::new(vec![
                Part::Reasoning(Reasoning {
                    provider: "anthropic".into(),
                    text: Some("not yours".into()),
                    signature: Some("sig".into()),
                    redacted: None,
                }),
                Part::text("thinking elsewhere"),
            ]),
            tool_calls: Vec::new(),
            provider_metadata: None,
        },
        answer("loop two"),
        Message::tool("c", "2", false),
    ]
}

#[tokio::test]
async fn reasoning_replay_never_by_default_current_tool_cycle_or_always() {
    let cases = [
        (ReasoningReplay::default(), vec![None, None, None]),
        (
            ReasoningReplay::CurrentToolCycle,
            vec![None, None, Some("loop two")],
        ),
        (
            ReasoningReplay::Always,
            vec![Some("loop one"), None, Some("loop two")],
        ),
        (ReasoningReplay::Never, vec![None, None, None]),
    ];
    for (replay, expected) in cases {
        let server = Server::start(vec![text_completion("ok", 1, 1)]).await;
        let model = OpenAiModel::new(server.config().with_reasoning_replay(replay)).unwrap();
        model
            .respond(ModelRequest {
                messages: &two_loops(),
                tools: &[add_spec()],
                deltas: None,
                deadline: None,
            })
            .await
            .unwrap();
        let sent: Vec<Option<String>> = assistant_messages(&server.bodies()[0])
            .iter()
            .map(|m| {
                m.get("reasoning_content")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .collect();
        let expected: Vec<Option<String>> =
            expected.into_iter().map(|e| e.map(str::to_owned)).collect();
        assert_eq!(sent, expected, "{replay:?}");
    }
}

#[tokio::test]
async fn streamed_reasoning_is_assembled_and_kept_out_of_the_text_deltas() {
    let body = sse(&[
        delta_chunk(json!({ "role": "assistant", "reasoning_content": "let me " })),
        delta_chunk(json!({ "reasoning_content": "think" })),
        delta_chunk(json!({ "content": "hel" })),
        delta_chunk(json!({ "content": "lo" })),
        finish_chunk("stop"),
        usage_chunk(3, 4),
    ]);
    let server = Server::start(vec![Reply::sse(&body, 7)]).await;
    let model = server.model();
    let seen = std::sync::Mutex::new(String::new());
    let deltas = |text: &str| seen.lock().unwrap().push_str(text);
    let answer = model
        .respond(ModelRequest {
            messages: &hello(),
            tools: &[],
            deltas: Some(&deltas),
            deadline: None,
        })
        .await
        .unwrap();
    assert_eq!(
        answer.content.parts(),
        [openai_reasoning("let me think"), Part::text("hello")]
    );
    assert_eq!(*seen.lock().unwrap(), "hello");
}
