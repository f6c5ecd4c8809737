//! What the model is sent of images and files: their bytes, read from the
//! store when a run continues from it (a resumed run in a store opened
//! afresh), the model's own images included, exactly, as a model that
//! requires its answers back checks; the newest images only, as the context
//! policy says, each older one as a placeholder. A request's input with an
//! image is bound to it.

use std::sync::Arc;

use turnstile::{
    AgentSession, Attachment, Content, ContextPolicy, ConversationId, Error, Message, Part,
    RequestId, ResumePolicy, RunContext, ScriptedReply,
};
use turnstile_testkit::session::*;
use turnstile_testkit::tools::*;

fn png(seed: u8, len: usize) -> Attachment {
    let bytes: Vec<u8> = (0..len).map(|i| (i as u8) ^ seed).collect();
    Attachment::new("image/png", bytes).unwrap()
}

fn asking(text: &str, image: &Attachment) -> Content {
    Content::new(vec![Part::text(text), Part::Image(image.clone())])
}

/// The image parts of what one model call was sent, in order: each as its
/// loaded bytes, or as the placeholder text sent instead.
fn images_sent(messages: &[Message]) -> Vec<Result<Vec<u8>, String>> {
    messages
        .iter()
        .flat_map(|m| m.content().parts().iter())
        .filter_map(|part| match part {
            Part::Image(image) => Some(Ok(image
                .bytes()
                .expect("an image sent with its bytes")
                .to_vec())),
            Part::Text { text } if text.starts_with("[image: ") => Some(Err(text.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn the_newest_images_go_with_their_bytes_and_older_ones_as_placeholders() {
    let store = memory_store().await;
    let model = ProbeModel::new(
        vec![
            text_reply("a cat", usage(1, 1)),
            text_reply("a dog", usage(1, 1)),
        ],
        0,
    );
    let conversation_id = ConversationId::new();
    let session = AgentSession::new(
        agent(model.clone(), Vec::new()),
        store.clone(),
        conversation_id,
        ns(),
        ContextPolicy::default().with_images(1),
    );
    let (cat, dog) = (png(1, 3000), png(2, 5000));
    session
        .run(
            RequestId::new(),
            asking("what is this?", &cat),
            RunContext::default(),
        )
        .await
        .unwrap();
    let second = RequestId::new();
    let outcome = session
        .run(second, asking("and this?", &dog), RunContext::default())
        .await
        .unwrap();

    let seen = model.seen();
    assert_eq!(images_sent(&seen[0]), [Ok(cat.bytes().unwrap().to_vec())]);
    assert_eq!(
        images_sent(&seen[1]),
        [
            Err("[image: image/png, 3 KiB]".to_owned()),
            Ok(dog.bytes().unwrap().to_vec())
        ]
    );
    // Storage keeps both, whatever the model was sent.
    let stored = store.transcript_window(conversation_id, 10).await.unwrap();
    let stored_images: Vec<_> = stored
        .iter()
        .flat_map(|e| e.message.content().attachments().cloned())
        .collect();
    assert_eq!(stored_images, [cat.clone(), dog.clone()]);

    // The request is bound to its image: the same input replays, another
    // image under the same id is refused.
    let replay = session
        .run(second, asking("and this?", &dog), RunContext::default())
        .await
        .unwrap();
    assert!(replay.replayed);
    assert_eq!(replay.final_text, outcome.final_text);
    let other = session
        .run(
            second,
            asking("and this?", &png(3, 5000)),
            RunContext::default(),
        )
        .await;
    assert!(
        matches!(other, Err(Error::RequestMismatch { .. })),
        "{other:?}"
    );
    assert_eq!(model.calls(), 2);
}

#[tokio::test]
async fn a_run_resumed_in_a_store_opened_afresh_sends_the_model_the_stored_bytes() {
    let (_dir, path) = temp_db();
    let conversation_id = ConversationId::new();
    let scan = Attachment::new("application/pdf", vec![0u8, 255, 10, 13, 0])
        .unwrap()
        .with_name("scan.pdf");
    let photo = png(9, 70_000);
    let input = Content::new(vec![
        Part::text("read these"),
        Part::File(scan.clone()),
        Part::Image(photo.clone()),
    ]);

    // The model draws a chart with its tool call, and wants it back.
    let chart = png(4, 9000);
    let script = |last: ScriptedReply| {
        vec![
            tools_reply(vec![call("c1", "count")], usage(1, 1)).with_image(chart.clone()),
            last,
        ]
    };

    let stopped = {
        let store = file_store(&path).await;
        let model = ProbeModel::strict(script(
            text_reply("never", usage(1, 1)).failing_first(1, "the provider is down"),
        ));
        let tool = CountingTool::new("count");
        let session = session(agent(model.clone(), vec![tool]), &store, conversation_id);
        let error = session
            .run(RequestId::new(), input.clone(), more_turns())
            .await
            .expect_err("the second model call fails");
        error.stopped_run().expect("a stopped run")
    };

    // Another store on the same file: nothing of the first is in memory.
    let store = file_store(&path).await;
    // The script goes by the answers in its context: the tool turn is
    // answered already, the call after it is this one's. With no image
    // sent, the chart does not come back and the model refuses the call.
    let resumed = |policy: ContextPolicy, model: Arc<ProbeModel>| {
        Arc::new(AgentSession::new(
            agent(model, vec![CountingTool::new("count")]),
            store.clone(),
            conversation_id,
            ns(),
            policy,
        ))
    };
    let refused = resumed(
        ContextPolicy::default().with_images(0),
        ProbeModel::strict(script(text_reply("read", usage(1, 1)))),
    )
    .resume_run(
        stopped.0,
        more_turns(),
        stopped.1,
        ResumePolicy::RetryInterruptedTurn,
    )
    .await
    .expect_err("the chart was left out");
    assert!(
        refused.to_string().contains("not sent back exactly"),
        "{refused}"
    );
    let stopped = refused.stopped_run().expect("a stopped run");

    let model = ProbeModel::strict(script(text_reply("read", usage(1, 1))));
    let session = resumed(ContextPolicy::default(), model.clone());
    let outcome = session
        .resume_run(
            stopped.0,
            more_turns(),
            stopped.1,
            ResumePolicy::RetryInterruptedTurn,
        )
        .await
        .unwrap();
    assert_eq!(outcome.final_text, "read");
    let sent = &model.seen()[0];
    let user = sent
        .iter()
        .find(|m| m.role() == "user")
        .expect("the request's input");
    let attachments: Vec<_> = user.content().attachments().collect();
    assert_eq!(attachments, [&scan, &photo]);
    assert_eq!(
        attachments[0].bytes().map(|b| b.to_vec()),
        Some(vec![0u8, 255, 10, 13, 0])
    );
    assert_eq!(
        attachments[1].bytes().map(|b| b.to_vec()),
        photo.bytes().map(|b| b.to_vec())
    );
}

/// A tool that returns a screenshot.
struct Screenshot(Attachment);

#[turnstile::async_trait]
impl turnstile::Tool for Screenshot {
    fn spec(&self) -> turnstile::ToolSpec {
        turnstile::ToolSpec {
            name: "snap".into(),
            description: "takes a screenshot".into(),
            parameters: serde_json::json!({"type": "object"}),
        }
    }

    async fn call(
        &self,
        _: serde_json::Value,
        _: turnstile::ToolContext,
    ) -> Result<Content, turnstile::ToolError> {
        Ok(Content::new(vec![
            Part::text("the screen:"),
            Part::Image(self.0.clone()),
        ]))
    }
}

#[tokio::test]
async fn a_tool_that_returns_an_image_gives_the_model_its_bytes_and_the_transcript_keeps_it() {
    let store = memory_store().await;
    let shot = png(7, 20_000);
    let model = ProbeModel::new(
        vec![
            tools_reply(vec![call("c1", "snap")], usage(1, 1)),
            text_reply("a terminal", usage(1, 1)),
        ],
        0,
    );
    let conversation_id = ConversationId::new();
    let session = session(
        agent(model.clone(), vec![Arc::new(Screenshot(shot.clone()))]),
        &store,
        conversation_id,
    );
    session
        .run(RequestId::new(), "what is on screen?", more_turns())
        .await
        .unwrap();
    let seen = model.seen();
    assert_eq!(images_sent(&seen[1]), [Ok(shot.bytes().unwrap().to_vec())]);
    let transcript = store.transcript_window(conversation_id, 10).await.unwrap();
    let tool = transcript
        .iter()
        .find(|e| e.message.role() == "tool")
        .expect("the tool's message");
    assert_eq!(
        tool.message.content().attachments().collect::<Vec<_>>(),
        [&shot]
    );
    assert_eq!(tool.message.text(), "the screen:");
}

#[tokio::test]
async fn a_tool_image_over_the_stores_limits_reaches_the_model_as_an_error_and_the_run_goes_on() {
    let limits = turnstile::store::PartLimits {
        max_part_bytes: 10_000,
        max_message_bytes: 10_000,
    };
    let store: Arc<dyn turnstile::Store> = Arc::new(
        turnstile::SqliteStore::in_memory()
            .await
            .unwrap()
            .with_part_limits(limits),
    );
    let model = ProbeModel::new(
        vec![
            tools_reply(vec![call("c1", "snap")], usage(1, 1)),
            text_reply("no screenshot, then", usage(1, 1)),
        ],
        0,
    );
    let session = session(
        agent(model.clone(), vec![Arc::new(Screenshot(png(8, 20_000)))]),
        &store,
        ConversationId::new(),
    );
    let outcome = session
        .run(RequestId::new(), "what is on screen?", more_turns())
        .await
        .unwrap();
    assert_eq!(outcome.final_text, "no screenshot, then");
    let results = tool_results(&outcome.messages);
    assert_eq!(results.len(), 1);
    let (_, text, is_error) = &results[0];
    assert!(*is_error, "{results:?}");
    assert!(
        text.contains("not kept") && text.contains("10000"),
        "{text}"
    );
    assert!(images_sent(&model.seen()[1]).is_empty());
}
