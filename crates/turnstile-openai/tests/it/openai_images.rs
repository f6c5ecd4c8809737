//! Images and files through the OpenAI-compatible client: a user message's
//! parts go as `image_url` and `file` content parts with base64 data URLs
//! (or the image's own URL); where the protocol takes text only, each goes
//! as its placeholder.

use std::sync::Arc;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use serde_json::json;
use turnstile::agent::ModelRequest;
use turnstile::{
    Agent, AgentSession, Attachment, Content, ContextPolicy, ConversationId, Message, Model,
    Namespace, Part, RequestId, RunContext, SqliteStore,
};

use crate::support::*;

fn png(bytes: &[u8]) -> Attachment {
    Attachment::new("image/png", bytes.to_vec()).unwrap()
}

#[tokio::test]
async fn user_images_and_files_go_as_data_urls_and_elsewhere_as_placeholders() {
    let server = Server::start(vec![text_completion("ok", 1, 1)]).await;
    let model = server.model();
    let pdf = Attachment::new("application/pdf", b"%PDF-1.7 \0\x01".to_vec())
        .unwrap()
        .with_name("q3.pdf");
    let messages = vec![
        Message::user_parts(vec![
            Part::text("compare"),
            Part::Image(png(&[1, 2, 3])),
            Part::ImageUrl {
                url: "https://example.com/a.png".into(),
            },
            Part::File(pdf),
            Part::File(
                Attachment::new("text/csv", b"a,b\n1,2".to_vec())
                    .unwrap()
                    .with_name("t.csv"),
            ),
        ]),
        Message::Tool {
            call_id: "c1".into(),
            content: Content::new(vec![
                Part::text("the screen:"),
                Part::Image(png(&[9; 2048])),
            ]),
            is_error: false,
        },
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
    let sent = &server.bodies()[0]["messages"];
    assert_eq!(
        sent[0]["content"],
        json!([
            { "type": "text", "text": "compare" },
            { "type": "image_url", "image_url": { "url": "data:image/png;base64,AQID" } },
            { "type": "image_url", "image_url": { "url": "https://example.com/a.png" } },
            { "type": "file", "file": {
                "filename": "q3.pdf",
                "file_data": format!("data:application/pdf;base64,{}", BASE64.encode(b"%PDF-1.7 \0\x01")),
            } },
            { "type": "text", "text": "t.csv:\na,b\n1,2" },
        ])
    );
    assert_eq!(sent[1]["content"], "the screen:\n[image: image/png, 2 KiB]");
}

#[tokio::test]
async fn a_committed_requests_image_is_sent_again_with_its_bytes_from_the_store() {
    let server = Server::start(vec![
        text_completion("a grey square", 1, 1),
        text_completion("still grey", 1, 1),
    ])
    .await;
    let store = Arc::new(SqliteStore::in_memory().await.unwrap());
    let session = AgentSession::new(
        Agent::new(Arc::new(server.model())),
        store,
        ConversationId::new(),
        Namespace::new("openai-test").unwrap(),
        ContextPolicy::default(),
    );
    let photo = vec![7u8; 3000];
    let input = Content::new(vec![Part::text("what is this?"), Part::Image(png(&photo))]);
    session
        .run(RequestId::new(), input, RunContext::default())
        .await
        .unwrap();
    session
        .run(RequestId::new(), "and now?", RunContext::default())
        .await
        .unwrap();
    let url = format!("data:image/png;base64,{}", BASE64.encode(&photo));
    let bodies = server.bodies();
    for body in &bodies {
        assert_eq!(
            body["messages"][0]["content"][1]["image_url"]["url"],
            url.as_str()
        );
    }
    assert_eq!(bodies[1]["messages"][2]["content"], "and now?");
}
