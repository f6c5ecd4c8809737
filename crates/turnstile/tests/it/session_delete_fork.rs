//! Deleting and forking conversations under `AgentSession`: an owner still
//! running after its conversation is deleted is fenced and resurrects
//! nothing, a retry of a deleted request id is `Deleted` (never a fresh
//! run, never a replay), a delete racing a new request leaves one of them
//! whole, and a fork and its source go on independently.

use std::sync::Arc;

use turnstile::store::RequestStatus;
use turnstile::{ConversationId, Error, RequestId, ResumePolicy, Revision, RunContext, Store};
use turnstile_testkit::session::*;
use turnstile_testkit::tools::*;

fn assert_deleted(err: Error, conversation: ConversationId, what: &str) {
    assert!(
        matches!(err, Error::Deleted { conversation_id } if conversation_id == conversation),
        "{what}: expected Deleted, got {err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zombie_owner_writing_after_a_delete_is_fenced_and_nothing_is_resurrected() {
    let store = memory_store().await;
    let model = scripted(vec![
        tools_reply(vec![call("b1", "block")], usage(2, 2)),
        text_reply("never committed", usage(3, 3)),
    ]);
    let block = BlockingTool::new("block", 1);
    let agent = agent(model.clone(), vec![block.clone()]);
    let conversation_id = ConversationId::new();
    let owner = session(agent.clone(), &store, conversation_id);
    let request_id = RequestId::new();
    let zombie = {
        let owner = owner.clone();
        tokio::spawn(async move { owner.run(request_id, "do it", RunContext::default()).await })
    };
    block.entered().await;
    let admission = store.admission(conversation_id).await.unwrap();
    let held = admission.active.expect("held by the owner");
    let report = store
        .delete_conversation(&ns(), conversation_id, 0, Some(admission.revision))
        .await
        .expect("delete with the admission's revision");
    assert_eq!(report.deleted.requests, 1);

    // The owner wakes up and journals its tool result: fenced.
    block.release();
    let err = expect_err(
        tokio::time::timeout(PATIENCE, zombie)
            .await
            .expect("zombie finished")
            .unwrap(),
    );
    assert!(
        matches!(err, Error::Fenced { run_id, revision } if run_id == held.run_id && revision == admission.revision),
        "{err:?}"
    );
    // Nothing came back.
    assert_deleted(
        store
            .conversation(&ns(), conversation_id)
            .await
            .unwrap_err(),
        conversation_id,
        "conversation",
    );
    assert!(store
        .transcript_window(conversation_id, 100)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(store.request(request_id).await.unwrap(), None);
    assert_deleted(
        store.run(held.run_id).await.unwrap_err(),
        conversation_id,
        "the owner's run",
    );
    assert_eq!(model.calls(), 1, "the model was called once, by the owner");
    // A new request on the deleted id is refused too.
    let err = expect_err(
        owner
            .run(RequestId::new(), "again", RunContext::default())
            .await,
    );
    assert_deleted(err, conversation_id, "a new request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_of_a_deleted_request_id_is_deleted_never_a_fresh_run_or_a_replay() {
    let store = memory_store().await;
    let model = scripted(vec![
        text_reply("the answer", usage(1, 1)),
        text_reply("a fresh run would say this", usage(1, 1)),
    ]);
    let agent = agent(model.clone(), vec![]);
    let conversation_id = ConversationId::new();
    let chat = session(agent.clone(), &store, conversation_id);
    let request_id = RequestId::new();
    let outcome = chat
        .run(request_id, "question", RunContext::default())
        .await
        .expect("first run");
    store
        .delete_conversation(&ns(), conversation_id, 1, None)
        .await
        .expect("delete");

    let err = expect_err(
        chat.run(request_id, "question", RunContext::default())
            .await,
    );
    assert_deleted(err, conversation_id, "run with the deleted request id");
    let err = expect_err(
        chat.recover_after_owner_exit(
            request_id,
            "question",
            RunContext::default(),
            Revision(2),
            ResumePolicy::RejectAmbiguous,
        )
        .await,
    );
    assert_deleted(err, conversation_id, "recover_after_owner_exit");
    let err = expect_err(
        chat.continue_after_approval(request_id, RunContext::default(), Revision(2))
            .await,
    );
    assert_deleted(err, conversation_id, "continue_after_approval");
    let err = expect_err(
        chat.resume_run(
            outcome.run_id,
            RunContext::default(),
            Revision(2),
            ResumePolicy::RejectAmbiguous,
        )
        .await,
    );
    assert_deleted(err, conversation_id, "resume_run of a deleted run id");
    // The same request id in another conversation: still the deleted one's.
    let elsewhere = session(agent, &store, ConversationId::new());
    let err = expect_err(
        elsewhere
            .run(request_id, "question", RunContext::default())
            .await,
    );
    assert_deleted(
        err,
        conversation_id,
        "the request id in another conversation",
    );
    assert_eq!(model.calls(), 1, "no fresh run called the model");
    assert_eq!(store.request(request_id).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_racing_a_new_request_leaves_one_of_them_whole() {
    let (_dir, path) = temp_db();
    let store = file_store(&path).await;
    let other = file_store(&path).await;
    for round in 0..6 {
        let model = scripted(vec![text_reply("answer", usage(1, 1))]);
        let agent = agent(model.clone(), vec![]);
        let conversation_id = ConversationId::new();
        store
            .ensure_conversation(&ns(), conversation_id)
            .await
            .unwrap();
        let chat = session(agent, &store, conversation_id);
        let request_id = RequestId::new();
        let deleter = Arc::clone(&other);
        let (ran, deleted) = tokio::join!(
            chat.run(request_id, "race", RunContext::default()),
            async move {
                deleter
                    .delete_conversation(&ns(), conversation_id, 0, None)
                    .await
            }
        );
        match (ran, deleted) {
            // The request won: it committed, the delete saw it held or
            // committed.
            (Ok(outcome), Err(Error::Busy { .. } | Error::VersionConflict { .. })) => {
                let record = store.request(request_id).await.unwrap().expect("request");
                assert_eq!(record.status, RequestStatus::Completed);
                let transcript = store.transcript_window(conversation_id, 10).await.unwrap();
                assert_eq!(transcript.len(), 2);
                assert_eq!(outcome.run_id, record.outcome.expect("outcome").run_id);
            }
            // The delete won before the claim, or during the run (fenced).
            (Err(Error::Deleted { conversation_id: c }), Ok(_)) => {
                assert_eq!(c, conversation_id);
                assert_eq!(store.request(request_id).await.unwrap(), None);
            }
            other => panic!("round {round}: neither won whole: {other:?}"),
        }
        assert!(
            store.request(request_id).await.unwrap().is_none()
                || store.conversation(&ns(), conversation_id).await.is_ok(),
            "round {round}: a request row without its conversation"
        );
    }
}

/// A session on `conversation_id` whose model answers as `replies` say
/// (a scripted model answers each request from the start of its script).
fn answering(
    store: &Arc<dyn Store>,
    conversation_id: ConversationId,
    replies: Vec<turnstile::ScriptedReply>,
) -> Arc<turnstile::AgentSession> {
    let agent = agent(scripted(replies), vec![CountingTool::new("count")]);
    session(agent, store, conversation_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_and_its_source_each_take_requests_through_a_session() {
    let store = memory_store().await;
    let source_id = ConversationId::new();
    let first = vec![
        tools_reply(vec![call("c1", "count")], usage(1, 1)),
        text_reply("first answer", usage(1, 1)),
    ];
    answering(&store, source_id, first)
        .run(RequestId::new(), "first", RunContext::default())
        .await
        .unwrap();
    answering(
        &store,
        source_id,
        vec![text_reply("second answer", usage(1, 1))],
    )
    .run(RequestId::new(), "second", RunContext::default())
    .await
    .unwrap();
    // 0 user, 1 assistant calling, 2 tool result, 3 answer, 4 user, 5 answer.
    let history = store.transcript_window(source_id, 100).await.unwrap();
    assert_eq!(history.len(), 6);
    let refused = store
        .fork_conversation(&ns(), source_id, 2, ConversationId::new())
        .await;
    assert!(
        matches!(refused, Err(Error::InvalidInput(_))),
        "{refused:?}"
    );

    let fork_id = ConversationId::new();
    let forked = store
        .fork_conversation(&ns(), source_id, 4, fork_id)
        .await
        .unwrap();
    assert_eq!(forked.entries, 4);
    let on_source = answering(
        &store,
        source_id,
        vec![text_reply("on the source", usage(1, 1))],
    )
    .run(RequestId::new(), "third", RunContext::default())
    .await
    .unwrap();
    let fork_reply = vec![text_reply("on the fork", usage(1, 1))];
    let on_fork = answering(&store, fork_id, fork_reply)
        .run(RequestId::new(), "other third", RunContext::default())
        .await
        .unwrap();
    assert_eq!(on_source.messages.last().unwrap().text(), "on the source");
    assert_eq!(on_fork.messages.last().unwrap().text(), "on the fork");
    let source_after = store.transcript_window(source_id, 100).await.unwrap();
    let fork_after = store.transcript_window(fork_id, 100).await.unwrap();
    assert_eq!(source_after[..6], history[..]);
    assert_eq!(source_after.len(), 8);
    assert_eq!(fork_after[..4], history[..4]);
    assert_eq!(fork_after.len(), 6);
    assert_eq!(store.conversation(&ns(), fork_id).await.unwrap().version, 2);
    assert_eq!(
        store.conversation(&ns(), source_id).await.unwrap().version,
        3
    );
}
