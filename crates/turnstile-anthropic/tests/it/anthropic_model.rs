//! Answers, streamed or not; the request's shape (system blocks, tools,
//! cache breakpoints, headers); usage with the cache counted; images and
//! documents; thinking and tool calls sent back exactly through an agent
//! session.

use std::sync::Arc;

use serde_json::{json, Value};
use turnstile::{
    Agent, AgentSession, Attachment, ContextPolicy, ConversationId, Message, Namespace, Part,
    PromptCache, RequestId, RunContext, SqliteStore,
};
use turnstile_testkit::tools::CountingTool;

use crate::support::*;

fn cached_usage() -> Value {
    json!({
        "input_tokens": 10,
        "cache_creation_input_tokens": 100,
        "cache_read_input_tokens": 50,
        "output_tokens": 5,
    })
}

#[tokio::test]
async fn answers_stream_or_not_and_usage_counts_the_cache() {
    // Every call asks for a stream; a server may answer with one body.
    let whole = Reply::Whole {
        blocks: vec![text("Hello there.")],
        usage: cached_usage(),
    };
    let streamed = Reply::Answer {
        blocks: vec![text("Hello there.")],
        stop_reason: "end_turn",
        usage: cached_usage(),
    };
    let server = Server::start(vec![whole, streamed.clone(), streamed]).await;
    let model = server.model();
    let messages = [
        Message::system("You are terse."),
        Message::user("hi"),
        Message::assistant("hello"),
        Message::user("again"),
    ];
    for callback in [false, true] {
        let (answer, deltas) = respond(&model, &messages, &[add_spec()], callback).await;
        let answer = answer.unwrap();
        assert_eq!(answer.content.text(), "Hello there.");
        assert_eq!(deltas, if callback { "Hello there." } else { "" });
        let usage = answer.usage;
        assert_eq!(
            (
                usage.input_tokens,
                usage.cache_write_tokens,
                usage.cache_read_tokens
            ),
            (160, 100, 50),
            "input counts every prompt token"
        );
        assert_eq!(usage.output_tokens, 5);
    }

    // Streaming off: one JSON exchange.
    let unstreamed = turnstile::AnthropicModel::new(server.config().with_streaming(false)).unwrap();
    let (answer, deltas) = respond(&unstreamed, &messages, &[], true).await;
    assert_eq!(answer.unwrap().content.text(), "Hello there.");
    assert_eq!(deltas, "Hello there.");
    assert_eq!(server.requests()[2].body["stream"], false);

    let sent = &server.requests()[1];
    assert_eq!(sent.headers["x-api-key"], KEY);
    assert_eq!(sent.headers["anthropic-version"], "2023-06-01");
    let body = &sent.body;
    assert_eq!(body["model"], "claude-test");
    assert_eq!(body["max_tokens"], 8192);
    assert_eq!(body["stream"], true);
    assert!(body.get("thinking").is_none());
    let ephemeral = json!({ "type": "ephemeral" });
    assert_eq!(
        body["system"],
        json!([{ "type": "text", "text": "You are terse.", "cache_control": ephemeral }])
    );
    assert_eq!(body["tools"][0]["input_schema"], add_spec().parameters);
    assert_eq!(body["tools"][0]["cache_control"], ephemeral);
    let roles: Vec<&str> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "assistant", "user"]);
    assert_eq!(body["messages"][0]["content"][0].get("cache_control"), None);
    assert_eq!(
        body["messages"][2]["content"][0]["cache_control"],
        ephemeral
    );

    // Without breakpoints none is sent.
    let server = Server::start(vec![Reply::answer(vec![text("ok")], "end_turn")]).await;
    let model = turnstile::AnthropicModel::new(server.config().with_prompt_cache(PromptCache::OFF))
        .unwrap();
    respond(&model, &messages, &[add_spec()], false)
        .await
        .0
        .unwrap();
    assert!(!server.requests()[0].raw.contains("cache_control"));
}

#[tokio::test]
async fn blank_text_images_of_other_types_and_empty_failures_are_sent_as_the_api_takes_them() {
    let server = Server::start(vec![Reply::answer(vec![text("ok")], "end_turn")]).await;
    let bmp = Attachment::new("image/bmp", vec![1, 2]).unwrap();
    let png = Attachment::new("image/PNG; q=1", vec![1, 2, 3]).unwrap();
    let messages = [
        Message::user_parts(vec![Part::text("look"), Part::Image(bmp), Part::Image(png)]),
        Message::assistant_with_calls(
            "\n\n",
            vec![turnstile::ToolCall::new("t1", "add", json!({}))],
        ),
        Message::tool("t1", "", true),
    ];
    // The fake refuses blank text blocks, unknown image types and a
    // failed result without content.
    respond(&server.model(), &messages, &[add_spec()], false)
        .await
        .0
        .unwrap();
    assert_eq!(server.refused(), Vec::<String>::new());
    let body = &server.requests()[0].body;
    let user = &body["messages"][0]["content"];
    assert_eq!(user[1]["type"], "text", "a BMP goes as its placeholder");
    assert!(user[1]["text"]
        .as_str()
        .unwrap()
        .starts_with("[image: image/bmp"));
    assert_eq!(user[2]["source"]["media_type"], "image/png");
    assert_eq!(
        body["messages"][1]["content"].as_array().unwrap().len(),
        1,
        "no blank text"
    );
    let result = &body["messages"][2]["content"][0];
    assert_eq!(result["is_error"], true);
    assert_eq!(result["content"][0]["type"], "text");
}

#[tokio::test]
async fn images_and_documents_go_as_blocks() {
    let server = Server::start(vec![Reply::answer(vec![text("seen")], "end_turn")]).await;
    let png = Attachment::new("image/png", vec![1, 2, 3]).unwrap();
    let pdf = Attachment::new("application/pdf", b"%PDF-1.4".to_vec()).unwrap();
    let notes = Attachment::new("text/plain", b"a note".to_vec())
        .unwrap()
        .with_name("notes.txt");
    let messages = [
        Message::user_parts(vec![
            Part::text("look"),
            Part::Image(png.clone()),
            Part::File(pdf),
            Part::File(notes),
            Part::ImageUrl {
                url: "https://example.com/cat.png".into(),
            },
        ]),
        Message::assistant_with_calls("", vec![turnstile::ToolCall::new("t1", "add", json!({}))]),
        Message::tool(
            "t1",
            turnstile::Content::new(vec![Part::text("shot"), Part::Image(png)]),
            false,
        ),
    ];
    respond(&server.model(), &messages, &[add_spec()], false)
        .await
        .0
        .unwrap();
    let body = &server.requests()[0].body;
    let user = &body["messages"][0]["content"];
    assert_eq!(user[0], json!({ "type": "text", "text": "look" }));
    assert_eq!(
        user[1],
        json!({ "type": "image", "source": { "type": "base64", "media_type": "image/png", "data": "AQID" } })
    );
    assert_eq!(user[2]["type"], "document");
    assert_eq!(user[2]["source"]["media_type"], "application/pdf");
    assert_eq!(
        (
            user[3]["source"]["data"].as_str(),
            user[3]["title"].as_str()
        ),
        (Some("a note"), Some("notes.txt"))
    );
    assert_eq!(
        user[4]["source"],
        json!({ "type": "url", "url": "https://example.com/cat.png" })
    );
    let result = &body["messages"][2]["content"][0];
    assert_eq!(result["type"], "tool_result");
    assert_eq!(result["tool_use_id"], "t1");
    assert_eq!(
        result["content"][0],
        json!({ "type": "text", "text": "shot" })
    );
    assert_eq!(result["content"][1]["type"], "image");
}

/// The first answer of the tool loop below: thinking, redacted thinking,
/// text and a call whose input keeps the model's spacing and key order.
fn thinking_answer() -> Reply {
    Reply::answer(
        vec![
            thinking("I should add 1 and 2 ✓."),
            json!({ "type": "redacted_thinking", "data": "EncryptedBlob==" }),
            text("Adding."),
            tool_use("toolu_1", "add", r#"{"b": 2,  "a": 1}"#),
        ],
        "tool_use",
    )
}

/// The second round: more thinking, another call.
fn second_round() -> Reply {
    Reply::answer(
        vec![
            thinking("Check it: 3 - 2 = 1."),
            tool_use("toolu_2", "add", r#"{"a":3,"b":-2}"#),
        ],
        "tool_use",
    )
}

#[tokio::test]
async fn thinking_and_tool_calls_go_back_exactly_in_two_tool_rounds() {
    for stream in [false, true] {
        let server = Server::start(vec![
            thinking_answer(),
            second_round(),
            Reply::answer(vec![thinking("Now answer."), text("3")], "end_turn"),
        ])
        .await;
        let config = server.config().with_thinking_budget(2048);
        let model = Arc::new(turnstile::AnthropicModel::new(config).unwrap());
        let add = CountingTool::new("add");
        let session = AgentSession::new(
            Agent::new(model).with_tool(add.clone()),
            Arc::new(SqliteStore::in_memory().await.unwrap()),
            ConversationId::new(),
            Namespace::new("anthropic-test").unwrap(),
            ContextPolicy::default(),
        );
        let request = RequestId::new();
        let outcome = if stream {
            use futures_util::StreamExt;
            let mut events = session.stream(request, "add 1 and 2", RunContext::default());
            let mut last = None;
            while let Some(event) = events.next().await {
                last = Some(event.unwrap());
            }
            match last {
                Some(turnstile::Event::ConversationCommitted { outcome, .. }) => *outcome,
                other => panic!("the stream ended with {other:?}"),
            }
        } else {
            session
                .run(request, "add 1 and 2", RunContext::default())
                .await
                .unwrap()
        };
        assert_eq!(outcome.final_text, "3");
        assert_eq!(add.calls(), 2);
        assert_eq!(server.refused(), Vec::<String>::new());

        let requests = server.requests();
        assert_eq!(
            requests[0].body["thinking"],
            json!({ "type": "enabled", "budget_tokens": 2048 })
        );
        let answer = &requests[1].body["messages"][1];
        assert_eq!(answer["role"], "assistant");
        assert_eq!(answer["content"][0], thinking("I should add 1 and 2 ✓."));
        assert_eq!(
            answer["content"][1],
            json!({ "type": "redacted_thinking", "data": "EncryptedBlob==" })
        );
        assert_eq!(
            answer["content"][2],
            json!({ "type": "text", "text": "Adding." })
        );
        assert!(
            requests[1]
                .raw
                .contains(r#""name":"add","input":{"b": 2,  "a": 1}"#),
            "the input goes back as written: {}",
            requests[1].raw
        );
        assert_eq!(
            requests[1].body["messages"][2]["content"][0]["type"],
            "tool_result"
        );
    }
}

#[tokio::test]
async fn the_fake_refuses_thinking_off_by_one_byte() {
    let server = Server::start(vec![]).await;
    let model = server.model();
    let signed = thinking("abc");
    let tampered = [
        json!({ "type": "thinking", "thinking": "abd", "signature": signed["signature"] }),
        json!({ "type": "thinking", "thinking": "abc", "signature": format!("{}0", signed["signature"].as_str().unwrap()) }),
        json!({ "type": "redacted_thinking", "data": "never-issued" }),
    ];
    for block in tampered {
        let reasoning = match block["type"].as_str().unwrap() {
            "thinking" => turnstile::Reasoning {
                provider: "anthropic".into(),
                text: block["thinking"].as_str().map(str::to_owned),
                signature: block["signature"].as_str().map(str::to_owned),
                redacted: None,
            },
            _ => turnstile::Reasoning {
                provider: "anthropic".into(),
                text: None,
                signature: None,
                redacted: block["data"].as_str().map(str::to_owned),
            },
        };
        let messages = [
            Message::user("hi"),
            Message::Assistant {
                content: turnstile::Content::new(vec![Part::Reasoning(reasoning), Part::text("x")]),
                tool_calls: Vec::new(),
                provider_metadata: None,
            },
            Message::user("again"),
        ];
        let error = respond(&model, &messages, &[], false).await.0.unwrap_err();
        assert_eq!(error.status, Some(400), "{error}");
        assert!(!error.retryable);
        assert!(error.message.contains("invalid_request_error"), "{error}");
        assert!(error.message.contains("Invalid `"), "{error}");
        assert_keyless(&error);
    }
}
