//! Admission through `AgentSession::run`: replay of completed requests and
//! the typed refusals that write nothing.

use std::sync::Arc;

use turnstile::{
    AgentSession, Budget, BudgetKind, ContextPolicy, ConversationId, Error, Namespace, RequestId,
    Revision, RunContext, ScriptedModel, Store,
};
use turnstile_testkit::session::*;
use turnstile_testkit::tools::*;

/// A conversation with a request whose run stopped on its turn budget after
/// one tool turn, so it holds the admission.
struct Held {
    store: Arc<dyn Store>,
    session: Arc<AgentSession>,
    model: Arc<ScriptedModel>,
    conversation_id: ConversationId,
    request_id: RequestId,
    revision: Revision,
}

async fn held_conversation() -> Held {
    let store = memory_store().await;
    let model = scripted(vec![
        tools_reply(vec![call("c1", "count")], usage(10, 2)),
        text_reply("done", usage(12, 3)),
    ]);
    let conversation_id = ConversationId::new();
    let session = session(
        agent(model.clone(), vec![CountingTool::new("count")]),
        &store,
        conversation_id,
    );
    let request_id = RequestId::new();
    let ctx = RunContext::default().with_budget(Budget {
        max_turns: Some(1),
        ..Budget::default()
    });
    let err = expect_err(session.run(request_id, "hold it", ctx).await);
    assert!(
        matches!(
            err,
            Error::BudgetExceeded {
                kind: BudgetKind::Turns,
                ..
            }
        ),
        "{err:?}"
    );
    let (_, revision) = err.stopped_run().expect("a stopped run");
    Held {
        store,
        session,
        model,
        conversation_id,
        request_id,
        revision,
    }
}

#[tokio::test]
async fn completed_request_replays_stored_outcome_without_model_or_tool_work() {
    let store = memory_store().await;
    let model = scripted(vec![
        tools_reply(vec![call("c1", "count")], usage(10, 2)),
        text_reply("the answer", usage(20, 5)),
    ]);
    let tool = CountingTool::new("count");
    let conversation_id = ConversationId::new();
    let session = session(
        agent(model.clone(), vec![tool.clone()]),
        &store,
        conversation_id,
    );
    let request_id = RequestId::new();

    let fresh = session
        .run(request_id, "question", RunContext::default())
        .await
        .expect("first run");
    assert!(!fresh.replayed);
    assert_eq!(fresh.final_text, "the answer");
    assert_eq!(fresh.usage, usage(30, 7));
    assert_eq!(fresh.messages.len(), 4);
    assert_eq!((model.calls(), tool.calls()), (2, 1));
    let admission = store.admission(conversation_id).await.unwrap();

    let replayed = session
        .run(request_id, "question", RunContext::default())
        .await
        .expect("replay");
    assert!(replayed.replayed);
    assert_eq!(
        replayed,
        turnstile::Outcome {
            replayed: true,
            ..fresh.clone()
        }
    );
    assert_eq!((model.calls(), tool.calls()), (2, 1), "no work on replay");
    assert_eq!(store.admission(conversation_id).await.unwrap(), admission);
    assert_eq!(
        store
            .conversation(&ns(), conversation_id)
            .await
            .unwrap()
            .version,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_request_replays_while_another_request_holds_the_conversation() {
    let store = memory_store().await;
    let model = scripted(vec![
        tools_reply(vec![call("b1", "block")], usage(4, 1)),
        text_reply("finished", usage(5, 2)),
    ]);
    let block = BlockingTool::new("block", usize::MAX);
    let conversation_id = ConversationId::new();
    let session = session(
        agent(model.clone(), vec![block.clone()]),
        &store,
        conversation_id,
    );

    let a = RequestId::new();
    let task = {
        let session = session.clone();
        tokio::spawn(async move { session.run(a, "request a", RunContext::default()).await })
    };
    block.entered().await;
    block.release();
    let first = task.await.unwrap().expect("request a");

    let b = RequestId::new();
    let task = {
        let session = session.clone();
        tokio::spawn(async move { session.run(b, "request b", RunContext::default()).await })
    };
    block.entered().await;
    let held = state(&store, conversation_id, a).await;
    assert_eq!(held.0.active.as_ref().map(|x| x.request_id), Some(b));
    let calls = model.calls();

    let replayed = session
        .run(a, "request a", RunContext::default())
        .await
        .expect("replay while busy");
    assert_eq!(
        replayed,
        turnstile::Outcome {
            replayed: true,
            ..first
        }
    );
    assert_eq!(model.calls(), calls, "replay called the model");
    assert_eq!(state(&store, conversation_id, a).await, held);

    block.release();
    let second = task.await.unwrap().expect("request b");
    assert_eq!(second.conversation_version, 2);
    assert_eq!(block.calls(), 2);
}

#[tokio::test]
async fn run_while_another_request_is_active_is_busy_and_writes_nothing() {
    let held = held_conversation().await;
    let other = RequestId::new();
    let before = state(&held.store, held.conversation_id, other).await;
    let calls = held.model.calls();

    let err = expect_err(
        held.session
            .run(other, "another", RunContext::default())
            .await,
    );
    match err {
        Error::Busy {
            conversation_id,
            request_id,
            revision,
        } => {
            assert_eq!(conversation_id, held.conversation_id);
            assert_eq!(request_id, held.request_id);
            assert_eq!(revision, held.revision);
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    assert_eq!(
        state(&held.store, held.conversation_id, other).await,
        before
    );
    assert!(before.1.is_none());
    assert_eq!(held.model.calls(), calls);
}

#[tokio::test]
async fn run_of_the_active_request_itself_is_busy_and_writes_nothing() {
    let held = held_conversation().await;
    let before = state(&held.store, held.conversation_id, held.request_id).await;
    let calls = held.model.calls();

    let err = expect_err(
        held.session
            .run(held.request_id, "hold it", RunContext::default())
            .await,
    );
    assert!(
        matches!(err, Error::Busy { request_id, revision, .. }
            if request_id == held.request_id && revision == held.revision),
        "{err:?}"
    );
    assert_eq!(
        state(&held.store, held.conversation_id, held.request_id).await,
        before
    );
    assert_eq!(held.model.calls(), calls);
}

#[tokio::test]
async fn same_request_id_with_another_input_is_a_mismatch_active_or_completed() {
    let held = held_conversation().await;
    let before = state(&held.store, held.conversation_id, held.request_id).await;
    let err = expect_err(
        held.session
            .run(held.request_id, "a different input", RunContext::default())
            .await,
    );
    assert!(
        matches!(err, Error::RequestMismatch { request_id, .. } if request_id == held.request_id),
        "{err:?}"
    );
    assert_eq!(
        state(&held.store, held.conversation_id, held.request_id).await,
        before
    );

    // Completed: release the held request by abandoning it, then complete one.
    held.session
        .abandon(held.request_id, held.revision)
        .await
        .expect("abandon");
    let done = RequestId::new();
    let model = scripted(vec![text_reply("ok", usage(1, 1))]);
    let fresh = session(
        agent(model.clone(), vec![]),
        &held.store,
        held.conversation_id,
    );
    fresh
        .run(done, "first input", RunContext::default())
        .await
        .expect("run");
    let before = state(&held.store, held.conversation_id, done).await;
    let err = expect_err(fresh.run(done, "second input", RunContext::default()).await);
    assert!(
        matches!(err, Error::RequestMismatch { request_id, .. } if request_id == done),
        "{err:?}"
    );
    assert_eq!(state(&held.store, held.conversation_id, done).await, before);
    assert_eq!(model.calls(), 1);
}

#[tokio::test]
async fn request_id_of_another_conversation_is_a_mismatch_and_writes_nothing() {
    let store = memory_store().await;
    let model = scripted(vec![text_reply("ok", usage(1, 1))]);
    let first = session(agent(model.clone(), vec![]), &store, ConversationId::new());
    let request_id = RequestId::new();
    first
        .run(request_id, "input", RunContext::default())
        .await
        .expect("run");

    let other_id = ConversationId::new();
    store.ensure_conversation(&ns(), other_id).await.unwrap();
    let other = session(agent(model.clone(), vec![]), &store, other_id);
    let before = state(&store, other_id, request_id).await;
    let err = expect_err(other.run(request_id, "input", RunContext::default()).await);
    assert!(
        matches!(err, Error::RequestMismatch { request_id: r, .. } if r == request_id),
        "{err:?}"
    );
    assert_eq!(state(&store, other_id, request_id).await, before);
    assert_eq!(
        before.1.unwrap().conversation_id,
        first.conversation_id(),
        "the request stays bound to its own conversation"
    );
    assert_eq!(model.calls(), 1);
}

#[tokio::test]
async fn refused_request_of_another_conversation_does_not_create_the_conversation() {
    let store = memory_store().await;
    let model = scripted(vec![text_reply("ok", usage(1, 1))]);
    let first = session(agent(model.clone(), vec![]), &store, ConversationId::new());
    let request_id = RequestId::new();
    first
        .run(request_id, "input", RunContext::default())
        .await
        .expect("run");

    let other_id = ConversationId::new();
    let other = session(agent(model, vec![]), &store, other_id);
    let err = expect_err(other.run(request_id, "input", RunContext::default()).await);
    assert!(matches!(err, Error::RequestMismatch { .. }), "{err:?}");
    let found = store.conversation(&ns(), other_id).await;
    assert!(
        matches!(found, Err(Error::NotFound { .. })),
        "a refused request created its conversation: {found:?}"
    );
}

#[tokio::test]
async fn abandoned_request_id_is_refused_and_writes_nothing() {
    let held = held_conversation().await;
    let released = held
        .session
        .abandon(held.request_id, held.revision)
        .await
        .expect("abandon");
    let before = state(&held.store, held.conversation_id, held.request_id).await;
    assert_eq!(before.0.revision, released);
    let calls = held.model.calls();

    let err = expect_err(
        held.session
            .run(held.request_id, "hold it", RunContext::default())
            .await,
    );
    assert!(
        matches!(err, Error::RequestAbandoned { request_id } if request_id == held.request_id),
        "{err:?}"
    );
    assert_eq!(
        state(&held.store, held.conversation_id, held.request_id).await,
        before
    );
    assert_eq!(held.model.calls(), calls);
}

#[tokio::test]
async fn session_in_another_namespace_is_refused_and_writes_nothing() {
    let store = memory_store().await;
    let model = scripted(vec![text_reply("ok", usage(1, 1))]);
    let conversation_id = ConversationId::new();
    let owner = session(agent(model.clone(), vec![]), &store, conversation_id);
    let committed = RequestId::new();
    owner
        .run(committed, "mine", RunContext::default())
        .await
        .expect("run");

    let intruder = AgentSession::new(
        agent(model.clone(), vec![]),
        store.clone(),
        conversation_id,
        Namespace::new("someone-else").unwrap(),
        ContextPolicy::default(),
    );
    let request_id = RequestId::new();
    let before = state(&store, conversation_id, request_id).await;
    let err = expect_err(
        intruder
            .run(request_id, "theirs", RunContext::default())
            .await,
    );
    assert!(
        matches!(&err, Error::NamespaceMismatch { conversation_id: c, .. } if *c == conversation_id),
        "{err:?}"
    );
    assert_eq!(state(&store, conversation_id, request_id).await, before);
    assert!(before.1.is_none());

    // The committed request is not replayed across namespaces either.
    let err = expect_err(intruder.run(committed, "mine", RunContext::default()).await);
    assert!(matches!(err, Error::NamespaceMismatch { .. }), "{err:?}");
    assert_eq!(model.calls(), 1);
}

#[tokio::test]
async fn request_id_equal_to_the_conversation_id_is_invalid_input() {
    let store = memory_store().await;
    let model = scripted(vec![text_reply("ok", usage(1, 1))]);
    let conversation_id = ConversationId::new();
    let session = session(agent(model.clone(), vec![]), &store, conversation_id);
    let request_id = RequestId::from_uuid(conversation_id.as_uuid()).unwrap();

    let err = expect_err(
        session
            .run(request_id, "input", RunContext::default())
            .await,
    );
    assert!(matches!(err, Error::InvalidInput(_)), "{err:?}");
    assert!(store.request(request_id).await.unwrap().is_none());
    assert!(matches!(
        store.conversation(&ns(), conversation_id).await,
        Err(Error::NotFound { .. })
    ));
    assert_eq!(model.calls(), 0);
}

#[tokio::test]
async fn empty_or_blank_input_is_invalid_input() {
    let store = memory_store().await;
    let model = scripted(vec![text_reply("ok", usage(1, 1))]);
    let conversation_id = ConversationId::new();
    let session = session(agent(model.clone(), vec![]), &store, conversation_id);

    for input in ["", "   \n\t"] {
        let request_id = RequestId::new();
        let err = expect_err(session.run(request_id, input, RunContext::default()).await);
        assert!(matches!(err, Error::InvalidInput(_)), "{input:?}: {err:?}");
        assert!(store.request(request_id).await.unwrap().is_none());
    }
    assert!(matches!(
        store.conversation(&ns(), conversation_id).await,
        Err(Error::NotFound { .. })
    ));
    assert_eq!(model.calls(), 0);
}
