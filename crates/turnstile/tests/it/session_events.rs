//! `AgentSession::events_after` and `follow_events`: a follower sees each
//! durable step of the conversation once, in order, and one that drops
//! and reconnects from the last number it saw misses nothing.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use turnstile::store::{LoggedEvent, LoggedStep};
use turnstile::{
    AgentSession, ContextPolicy, ConversationId, Error, Namespace, RequestId, RunContext,
};
use turnstile_testkit::session::*;
use turnstile_testkit::tools::*;

const POLL: Duration = Duration::from_millis(5);

fn tool_then_answer() -> Vec<turnstile::ScriptedReply> {
    vec![
        tools_reply(vec![call("c1", "count")], usage(3, 1)),
        text_reply("counted", usage(4, 2)),
    ]
}

/// Reads `stream` up to and including the commit of `request`.
async fn until_committed(
    stream: &mut turnstile::session::LoggedEvents,
    request: RequestId,
) -> Vec<LoggedEvent> {
    let mut seen = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("an event within 10 s")
            .expect("the stream goes on")
            .expect("no error");
        let done =
            event.request_id == request && matches!(event.step, LoggedStep::Committed { .. });
        seen.push(event);
        if done {
            return seen;
        }
    }
}

#[tokio::test]
async fn a_follower_sees_each_step_once_and_a_reconnect_from_its_last_number_misses_none() {
    let store = memory_store().await;
    let conversation_id = ConversationId::new();
    let model = scripted([tool_then_answer(), tool_then_answer()].concat());
    let session = session(
        agent(model, vec![CountingTool::new("count")]),
        &store,
        conversation_id,
    );
    let first = RequestId::new();
    session
        .run(first, "count once", RunContext::default())
        .await
        .expect("the first request commits");

    // Follow from the start while the second request runs in another task.
    let mut follower = session.follow_events(0, POLL);
    let mut seen = until_committed(&mut follower, first).await;
    drop(follower);
    let second = RequestId::new();
    let running = {
        let session = Arc::clone(&session);
        tokio::spawn(async move {
            session
                .run(second, "count again", RunContext::default())
                .await
        })
    };
    let last = seen.last().expect("events").seq;
    let mut reconnected = session.follow_events(last, POLL);
    seen.extend(until_committed(&mut reconnected, second).await);
    running.await.unwrap().expect("the second request commits");

    let seqs: Vec<_> = seen.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    assert_eq!(seen, session.events_after(0, 100).await.unwrap());
    let steps = |request: RequestId| -> Vec<&'static str> {
        seen.iter()
            .filter(|e| e.request_id == request)
            .map(|e| match e.step {
                LoggedStep::Admitted { .. } => "admitted",
                LoggedStep::Answered { .. } => "answered",
                LoggedStep::ToolFinished { .. } => "tool finished",
                LoggedStep::CheckpointSaved { turn: 1, .. } => "turn 1 saved",
                LoggedStep::Committed { .. } => "committed",
                _ => "other",
            })
            .collect()
    };
    let one_request = [
        "admitted",
        "answered",
        "tool finished",
        "turn 1 saved",
        "committed",
    ];
    assert_eq!(steps(first), one_request);
    assert_eq!(steps(second), one_request);
    // Nothing more is there to follow.
    assert!(session
        .events_after(seqs.len() as u64, 100)
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn the_log_of_another_namespaces_or_a_missing_conversation_is_refused() {
    let store = memory_store().await;
    let conversation_id = ConversationId::new();
    let owner = session(
        agent(scripted(vec![text_reply("hi", usage(1, 1))]), vec![]),
        &store,
        conversation_id,
    );
    assert!(matches!(
        owner.events_after(0, 10).await,
        Err(Error::NotFound { .. })
    ));
    owner
        .run(RequestId::new(), "hello", RunContext::default())
        .await
        .expect("commits");
    let stranger = AgentSession::new(
        agent(scripted(vec![]), vec![]),
        store.clone(),
        conversation_id,
        Namespace::new("someone-else").unwrap(),
        ContextPolicy::default(),
    );
    assert!(matches!(
        stranger.events_after(0, 10).await,
        Err(Error::NamespaceMismatch { .. })
    ));
    let mut followed = stranger.follow_events(0, POLL);
    assert!(matches!(
        followed.next().await,
        Some(Err(Error::NamespaceMismatch { .. }))
    ));
    assert!(
        followed.next().await.is_none(),
        "the stream ends at its error"
    );
    assert_eq!(owner.events_after(0, 10).await.unwrap().len(), 2);
}
