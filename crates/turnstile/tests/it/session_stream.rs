//! `AgentSession::stream`: events in protocol order, the commit event only
//! once the commit is durable, and a dropped stream leaves a recoverable
//! request.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use turnstile::store::{JournalStatus, RequestStatus, RunStatus};
use turnstile::{
    Budget, BudgetKind, CheckpointPhase, ConversationId, Error, Event, RequestId, ResumePolicy,
    RunContext, ScriptedModel, ScriptedReply, Store,
};
use turnstile_testkit::session::*;
use turnstile_testkit::tools::*;

#[tokio::test]
async fn stream_yields_events_in_protocol_order_and_commits_last_after_the_database() {
    let store = memory_store().await;
    let model = scripted(vec![
        ScriptedReply {
            text: "checking".into(),
            ..tools_reply(vec![call("c1", "count")], usage(3, 1))
        },
        text_reply("all done here", usage(4, 2)),
    ]);
    let conversation_id = ConversationId::new();
    let session = session(
        agent(model.clone(), vec![CountingTool::new("count")]),
        &store,
        conversation_id,
    );
    let request_id = RequestId::new();

    let mut stream = pin!(session.stream(request_id, "hello", RunContext::default()));
    let mut events = Vec::new();
    let mut committed = None;
    while let Some(item) = stream.next().await {
        let event = item.expect("no error");
        if let Event::ConversationCommitted {
            outcome,
            conversation_version,
        } = &event
        {
            // The database already shows the commit and the release.
            let admission = store.admission(conversation_id).await.unwrap();
            assert!(admission.active.is_none(), "admission still held");
            assert_eq!(admission.revision.0, 2);
            let record = store.request(request_id).await.unwrap().unwrap();
            assert_eq!(record.status, RequestStatus::Completed);
            let conversation = store.conversation(&ns(), conversation_id).await.unwrap();
            assert_eq!(conversation.version, *conversation_version);
            assert_eq!(outcome.conversation_version, *conversation_version);
            committed = Some(outcome.clone());
        }
        events.push(event);
    }
    let outcome = committed.expect("ConversationCommitted");
    assert!(matches!(
        events.last(),
        Some(Event::ConversationCommitted { .. })
    ));
    assert!(!outcome.replayed);
    assert_eq!(outcome.final_text, "all done here");

    let Some(Event::RunStarted { run_id, .. }) = events.first().cloned() else {
        panic!("first event: {:?}", events.first());
    };
    let delta = |turn, text: &str| Event::TextDelta {
        turn,
        text: text.into(),
    };
    let expected = vec![
        Event::RunStarted {
            run_id,
            request_id,
            resumed_from: None,
            revision: turnstile::Revision(1),
        },
        Event::TurnStarted { turn: 1 },
        delta(1, "checking"),
        Event::ModelResponded {
            turn: 1,
            usage: usage(3, 1),
            tool_calls: 1,
        },
        Event::ToolStarted {
            turn: 1,
            call_id: "c1".into(),
            name: "count".into(),
            arguments: "{}".into(),
        },
        Event::ToolFinished {
            turn: 1,
            call_id: "c1".into(),
            name: "count".into(),
            content: "count call 1".into(),
            is_error: false,
            reused: false,
        },
        Event::CheckpointSaved {
            turn: 1,
            revision: turnstile::Revision(1),
        },
        Event::TurnStarted { turn: 2 },
        delta(2, "all "),
        delta(2, "done "),
        delta(2, "here"),
        Event::ModelResponded {
            turn: 2,
            usage: usage(4, 2),
            tool_calls: 0,
        },
    ];
    assert_eq!(events[..events.len() - 1], expected[..]);
}

#[tokio::test]
async fn dropping_the_stream_inside_a_tool_keeps_the_admission_for_recovery() {
    let store = memory_store().await;
    let model = scripted(vec![
        tools_reply(vec![call("b1", "block")], usage(6, 1)),
        text_reply("finished", usage(2, 2)),
    ]);
    // The first execution blocks until it is aborted; the retry answers.
    let block = BlockingTool::new("block", 1);
    let conversation_id = ConversationId::new();
    let session = session(
        agent(model.clone(), vec![block.clone()]),
        &store,
        conversation_id,
    );
    let request_id = RequestId::new();

    {
        let mut stream = pin!(session.stream(request_id, "start", RunContext::default()));
        loop {
            match stream.next().await {
                Some(Ok(Event::ToolStarted { .. })) => break,
                Some(Ok(_)) => {}
                other => panic!("stream ended before the tool: {other:?}"),
            }
        }
        // The run only goes on while the stream is polled: poll it until the
        // tool is inside its call.
        tokio::select! {
            event = stream.next() => panic!("the blocked tool finished: {event:?}"),
            () = block.entered() => {}
        }
    }

    let admission = store.admission(conversation_id).await.unwrap();
    let active = admission.active.clone().expect("admission kept");
    assert_eq!(active.request_id, request_id);
    let checkpoint = store
        .latest_checkpoint(active.run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (checkpoint.turn, checkpoint.phase),
        (1, CheckpointPhase::ToolsInFlight)
    );
    assert_eq!(
        store.run(active.run_id).await.unwrap().unwrap().status,
        RunStatus::Running
    );
    let journal = store.journal(request_id, 1).await.unwrap();
    assert_eq!(journal[0].status, JournalStatus::Requested);
    assert_eq!(
        session.recovery_usage(request_id).await.unwrap(),
        usage(6, 1)
    );

    let err = expect_err(
        session
            .recover_after_owner_exit(
                request_id,
                "start",
                RunContext::default(),
                admission.revision,
                ResumePolicy::RejectAmbiguous,
            )
            .await,
    );
    assert!(
        matches!(err, Error::AmbiguousCheckpoint { turn: 1, .. }),
        "{err:?}"
    );

    let outcome = session
        .recover_after_owner_exit(
            request_id,
            "start",
            RunContext::default(),
            admission.revision,
            ResumePolicy::RetryInterruptedTurn,
        )
        .await
        .expect("recovered");
    assert_eq!(outcome.final_text, "finished");
    assert_eq!(outcome.usage, usage(8, 3));
    assert_eq!(block.calls(), 2);
    assert_eq!(model.calls(), 2);
    assert_one_result_per_call(&outcome.messages);
    assert_eq!(outcome.messages.len(), 4);
    let run = store.run(outcome.run_id).await.unwrap().unwrap();
    assert_eq!(run.resumed_from, Some(active.run_id));
}

#[tokio::test]
async fn replayed_request_stream_yields_only_the_committed_result() {
    let store = memory_store().await;
    let model = scripted(vec![
        tools_reply(vec![call("c1", "count")], usage(1, 1)),
        text_reply("stored", usage(1, 1)),
    ]);
    let conversation_id = ConversationId::new();
    let session = session(
        agent(model.clone(), vec![CountingTool::new("count")]),
        &store,
        conversation_id,
    );
    let request_id = RequestId::new();
    let fresh = session
        .run(request_id, "again", RunContext::default())
        .await
        .unwrap();

    let items: Vec<_> = session
        .stream(request_id, "again", RunContext::default())
        .collect()
        .await;
    assert_eq!(items.len(), 1, "{items:?}");
    match &items[0] {
        Ok(Event::ConversationCommitted {
            outcome,
            conversation_version,
        }) => {
            assert!(outcome.replayed);
            assert_eq!(
                **outcome,
                turnstile::Outcome {
                    replayed: true,
                    ..fresh
                }
            );
            assert_eq!(*conversation_version, 1);
        }
        other => panic!("expected only the commit, got {other:?}"),
    }
    assert_eq!(model.calls(), 2);
}

#[tokio::test]
async fn stream_of_a_stopped_run_ends_with_its_error() {
    let store = memory_store().await;
    let model = scripted(vec![
        tools_reply(vec![call("c1", "count")], usage(1, 1)),
        text_reply("never", usage(1, 1)),
    ]);
    let conversation_id = ConversationId::new();
    let session = session(
        agent(model.clone(), vec![CountingTool::new("count")]),
        &store,
        conversation_id,
    );
    let ctx = RunContext::default().with_budget(Budget {
        max_turns: Some(1),
        ..Budget::default()
    });

    let items: Vec<_> = session.stream(RequestId::new(), "go", ctx).collect().await;
    let (last, before) = items.split_last().expect("items");
    assert!(
        matches!(
            last,
            Err(Error::BudgetExceeded {
                kind: BudgetKind::Turns,
                ..
            })
        ),
        "{last:?}"
    );
    assert!(before.iter().all(|item| matches!(
        item,
        Ok(event) if !matches!(event, Event::ConversationCommitted { .. })
    )));
    assert!(matches!(
        before.last(),
        Some(Ok(Event::CheckpointSaved { turn: 1, .. }))
    ));

    // A refusal is the only item of its stream.
    let items: Vec<_> = session
        .stream(RequestId::new(), "other", RunContext::default())
        .collect()
        .await;
    assert_eq!(items.len(), 1);
    assert!(matches!(items[0], Err(Error::Busy { .. })), "{items:?}");
}

/// How long a store call from inside the consumer loop may take before the
/// test calls it a stall (the pool's own timeout is 30 s).
const STALL: Duration = Duration::from_secs(5);

fn two_turn_agent(model: &Arc<ScriptedModel>) -> turnstile::Agent {
    agent(model.clone(), vec![CountingTool::new("count")])
}

fn two_turn_script() -> Arc<ScriptedModel> {
    scripted(vec![
        tools_reply(vec![call("c1", "count")], usage(1, 1)),
        text_reply("done now", usage(1, 1)),
    ])
}

/// A consumer that inspects the store while it handles each event (a UI
/// showing progress) must not stall: the paused stream may not hold the
/// store's connection or a write transaction.
#[tokio::test]
async fn consumer_reading_the_store_between_events_does_not_stall() {
    let store = memory_store().await;
    let model = two_turn_script();
    let conversation_id = ConversationId::new();
    let session = session(two_turn_agent(&model), &store, conversation_id);
    let request_id = RequestId::new();

    let mut stream = pin!(session.stream(request_id, "hello", RunContext::default()));
    let mut run_id = None;
    while let Some(item) = stream.next().await {
        let event = item.expect("no error");
        let read = tokio::time::timeout(STALL, store.admission(conversation_id)).await;
        let admission = read
            .unwrap_or_else(|_| panic!("store read stalled while handling {event:?}"))
            .expect("admission");
        match event {
            Event::RunStarted { run_id: id, .. } => run_id = Some(id),
            Event::CheckpointSaved { turn, revision } => {
                assert_eq!(admission.revision, revision);
                // The next turn's write-ahead may share the turn's commit.
                let saved = store.checkpoints(run_id.unwrap()).await.unwrap();
                let phase = saved.iter().find(|c| c.turn == turn).map(|c| c.phase);
                assert_eq!(phase, Some(CheckpointPhase::Ready));
            }
            Event::ConversationCommitted { .. } => assert!(admission.active.is_none()),
            _ => assert!(admission.active.is_some()),
        }
    }
}

/// The same with a file database, where reads have their own pool: a
/// consumer that writes (here: creates another conversation on the same
/// store) while handling an event must not wait for the paused run's
/// transaction.
#[tokio::test]
async fn consumer_writing_to_the_store_between_events_does_not_stall() {
    let (_dir, path) = temp_db();
    let store = file_store(&path).await;
    let model = two_turn_script();
    let session = session(two_turn_agent(&model), &store, ConversationId::new());

    let mut stream = pin!(session.stream(RequestId::new(), "hello", RunContext::default()));
    let namespace = ns();
    while let Some(item) = stream.next().await {
        let event = item.expect("no error");
        let write = store.ensure_conversation(&namespace, ConversationId::new());
        tokio::time::timeout(STALL, write)
            .await
            .unwrap_or_else(|_| panic!("store write stalled while handling {event:?}"))
            .expect("write");
    }
}

/// A second process writing to the same file while a stream consumer
/// handles an event: the paused run must not sit on SQLite's write lock, or
/// the other process gets "database is locked" after its busy timeout.
#[tokio::test]
async fn paused_stream_does_not_hold_the_sqlite_write_lock() {
    let (_dir, path) = temp_db();
    let store = file_store(&path).await;
    let other_process = turnstile::SqliteStore::open_with(
        &path,
        turnstile::SqliteOptions {
            busy_timeout: Duration::from_millis(500),
            ..turnstile::SqliteOptions::default()
        },
    )
    .await
    .unwrap();
    let model = two_turn_script();
    let session = session(two_turn_agent(&model), &store, ConversationId::new());

    let namespace = ns();
    let mut stream = pin!(session.stream(RequestId::new(), "hello", RunContext::default()));
    while let Some(item) = stream.next().await {
        let event = item.expect("no error");
        let write = other_process.ensure_conversation(&namespace, ConversationId::new());
        let written = tokio::time::timeout(STALL, write)
            .await
            .unwrap_or_else(|_| panic!("other process stalled while handling {event:?}"));
        assert!(
            written.is_ok(),
            "other process failed while handling {event:?}: {written:?}"
        );
    }
}
