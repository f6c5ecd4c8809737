//! Ownership changes are fenced: a replaced owner cannot write, and among
//! competing recoverers exactly one wins.

use std::sync::Arc;

use tokio::sync::{mpsc, Barrier};
use turnstile::store::{RequestStatus, RunStatus};
use turnstile::{
    Budget, ConversationId, Error, Message, RequestId, ResumePolicy, RunContext, Store,
};
use turnstile_testkit::session::*;
use turnstile_testkit::tools::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zombie_owner_is_fenced_after_recovery_and_the_transcript_holds_only_the_recovery() {
    let store = memory_store().await;
    let model = scripted(vec![
        tools_reply(vec![call("b1", "block")], usage(2, 2)),
        text_reply("recovered answer", usage(3, 3)),
    ]);
    // Only the zombie's execution blocks; the recovery's answers at once.
    let block = BlockingTool::new("block", 1);
    let agent = agent(model.clone(), vec![block.clone()]);
    let conversation_id = ConversationId::new();
    let owner_a = session(agent.clone(), &store, conversation_id);
    let host_b = session(agent, &store, conversation_id);
    let request_id = RequestId::new();

    let zombie = {
        let owner_a = owner_a.clone();
        tokio::spawn(async move {
            owner_a
                .run(request_id, "do it", RunContext::default())
                .await
        })
    };
    block.entered().await;
    let admission = store.admission(conversation_id).await.unwrap();
    let revision_a = admission.revision;
    let run_a = admission.active.expect("held by A").run_id;

    let outcome = host_b
        .recover_after_owner_exit(
            request_id,
            "do it",
            RunContext::default(),
            revision_a,
            ResumePolicy::RetryInterruptedTurn,
        )
        .await
        .expect("recovery by B");
    assert_ne!(outcome.run_id, run_a);
    let after_b = store.admission(conversation_id).await.unwrap();
    assert!(after_b.active.is_none());

    // A wakes up and tries to journal its tool result.
    block.release();
    let err = expect_err(
        tokio::time::timeout(PATIENCE, zombie)
            .await
            .expect("zombie finished")
            .unwrap(),
    );
    assert!(
        matches!(err, Error::Fenced { run_id, revision } if run_id == run_a && revision == revision_a),
        "{err:?}"
    );

    // The database holds B's work only, once.
    assert_eq!(store.admission(conversation_id).await.unwrap(), after_b);
    let transcript: Vec<Message> = store
        .transcript_window(conversation_id, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.message)
        .collect();
    assert_eq!(transcript, outcome.messages);
    assert_eq!(transcript.len(), 4);
    assert_one_result_per_call(&transcript);
    assert_eq!(
        tool_results(&transcript),
        vec![("b1".into(), "block call 2".into(), false)]
    );
    assert_eq!(
        store
            .conversation(&ns(), conversation_id)
            .await
            .unwrap()
            .version,
        1
    );
    assert_eq!(
        store.run(run_a).await.unwrap().unwrap().status,
        RunStatus::Superseded
    );
    // The zombie's external effect happened (it cannot be fenced), under the
    // same idempotency key as the recovery's.
    let keys = block.keys();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_concurrent_recoverers_exactly_one_wins_the_rest_get_busy_or_conflict() {
    const RECOVERERS: usize = 16;
    let (_dir, path) = temp_db();
    let model = scripted(vec![
        tools_reply(vec![call("c1", "count")], usage(1, 1)),
        tools_reply(vec![call("b1", "block")], usage(1, 1)),
        text_reply("won", usage(1, 1)),
    ]);
    let count = CountingTool::new("count");
    let block = BlockingTool::new("block", 1);
    let agent = agent(model.clone(), vec![count.clone(), block.clone()]);
    let conversation_id = ConversationId::new();
    let request_id = RequestId::new();

    // The starting point: a run stopped by its turn budget after turn 1.
    let store: Arc<dyn Store> = file_store(&path).await;
    let first = session(agent.clone(), &store, conversation_id);
    let ctx = RunContext::default().with_budget(Budget {
        max_turns: Some(1),
        ..Budget::default()
    });
    let err = expect_err(first.run(request_id, "contended", ctx).await);
    let (_, revision) = err.stopped_run().expect("stopped run");

    // Every recoverer has its own store on the file, like its own process.
    let barrier = Arc::new(Barrier::new(RECOVERERS));
    let (tx, mut rx) = mpsc::unbounded_channel();
    for _ in 0..RECOVERERS {
        let own_store = file_store(&path).await;
        let recoverer = session(agent.clone(), &own_store, conversation_id);
        let (barrier, tx) = (barrier.clone(), tx.clone());
        tokio::spawn(async move {
            barrier.wait().await;
            let result = recoverer
                .recover_after_owner_exit(
                    request_id,
                    "contended",
                    more_turns(),
                    revision,
                    ResumePolicy::RetryInterruptedTurn,
                )
                .await;
            let _ = tx.send(result);
        });
    }
    drop(tx);

    // The winner blocks in its tool, so every loser answers first.
    for _ in 1..RECOVERERS {
        let result = tokio::time::timeout(PATIENCE, rx.recv())
            .await
            .expect("a loser answered")
            .expect("result");
        match result {
            Err(Error::Busy { .. } | Error::Conflict { .. }) => {}
            other => panic!("a loser got {other:?}"),
        }
    }
    block.entered().await;
    block.release();
    let winner = tokio::time::timeout(PATIENCE, rx.recv())
        .await
        .expect("the winner answered")
        .expect("result")
        .expect("the winner committed");
    assert!(!winner.replayed);
    assert_eq!(winner.final_text, "won");
    assert_eq!(winner.turns, 3);
    assert_eq!((count.calls(), block.calls()), (1, 1));
    assert_eq!(model.calls(), 3);
    assert!(rx.recv().await.is_none());

    let record = store.request(request_id).await.unwrap().unwrap();
    assert_eq!(record.status, RequestStatus::Completed);
    let admission = store.admission(conversation_id).await.unwrap();
    assert!(admission.active.is_none());
    // One recovery claim and the commit: two revisions past the stopped run.
    assert_eq!(admission.revision.0, revision.0 + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zombie_paused_in_its_final_model_call_cannot_commit_after_recovery() {
    let store = memory_store().await;
    // The zombie's model call blocks; the recovery's answers at once.
    let model = ProbeModel::new(vec![text_reply("final", usage(5, 5))], 1);
    let agent = agent(model.clone(), vec![]);
    let conversation_id = ConversationId::new();
    let owner_a = session(agent.clone(), &store, conversation_id);
    let host_b = session(agent, &store, conversation_id);
    let request_id = RequestId::new();

    let zombie = {
        let owner_a = owner_a.clone();
        tokio::spawn(async move { owner_a.run(request_id, "ask", RunContext::default()).await })
    };
    model.entered().await;
    let admission = store.admission(conversation_id).await.unwrap();
    let run_a = admission.active.as_ref().unwrap().run_id;

    let outcome = host_b
        .recover_after_owner_exit(
            request_id,
            "ask",
            RunContext::default(),
            admission.revision,
            ResumePolicy::RetryInterruptedTurn,
        )
        .await
        .expect("recovery");
    let committed = store.admission(conversation_id).await.unwrap();

    model.release();
    let err = expect_err(
        tokio::time::timeout(PATIENCE, zombie)
            .await
            .expect("zombie finished")
            .unwrap(),
    );
    assert!(
        matches!(err, Error::Fenced { run_id, .. } if run_id == run_a),
        "{err:?}"
    );
    assert_eq!(store.admission(conversation_id).await.unwrap(), committed);
    let transcript = store.transcript_window(conversation_id, 100).await.unwrap();
    assert_eq!(transcript.len(), 2, "{transcript:?}");
    assert_eq!(
        store
            .conversation(&ns(), conversation_id)
            .await
            .unwrap()
            .version,
        1
    );
    let replay = host_b
        .run(request_id, "ask", RunContext::default())
        .await
        .unwrap();
    assert!(replay.replayed);
    assert_eq!(replay.run_id, outcome.run_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_new_requests_on_one_conversation_admit_exactly_one() {
    const CALLERS: usize = 8;
    let (_dir, path) = temp_db();
    let model = scripted(vec![
        tools_reply(vec![call("b1", "block")], usage(1, 1)),
        text_reply("mine", usage(1, 1)),
    ]);
    let block = BlockingTool::new("block", 1);
    let agent = agent(model.clone(), vec![block.clone()]);
    let conversation_id = ConversationId::new();
    let store = file_store(&path).await;
    store
        .ensure_conversation(&ns(), conversation_id)
        .await
        .unwrap();

    let barrier = Arc::new(Barrier::new(CALLERS));
    let (tx, mut rx) = mpsc::unbounded_channel();
    for i in 0..CALLERS {
        let own_store = file_store(&path).await;
        let caller = session(agent.clone(), &own_store, conversation_id);
        let (barrier, tx) = (barrier.clone(), tx.clone());
        tokio::spawn(async move {
            let request_id = RequestId::new();
            barrier.wait().await;
            let input = format!("request {i}");
            let result = caller.run(request_id, &input, RunContext::default()).await;
            let _ = tx.send((request_id, result));
        });
    }
    drop(tx);

    let mut refused = Vec::new();
    for _ in 1..CALLERS {
        let (request_id, result) = tokio::time::timeout(PATIENCE, rx.recv())
            .await
            .expect("a refused caller answered")
            .expect("result");
        match result {
            Err(Error::Busy { .. }) => refused.push(request_id),
            other => panic!("a loser got {other:?}"),
        }
    }
    block.entered().await;
    block.release();
    let (_, winner) = tokio::time::timeout(PATIENCE, rx.recv())
        .await
        .expect("the winner answered")
        .expect("result");
    let winner = winner.expect("the winner committed");
    assert_eq!(winner.conversation_version, 1);
    assert_eq!((model.calls(), block.calls()), (2, 1));
    for request_id in refused {
        assert!(store.request(request_id).await.unwrap().is_none());
    }
    assert_eq!(
        store.admission(conversation_id).await.unwrap().revision.0,
        2
    );
}
