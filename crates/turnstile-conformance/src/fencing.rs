//! Fencing: an owner whose revision is no longer current writes nothing.

use turnstile_core::store::{Fence, JournalStatus, RequestStatus, ToolResult};
use turnstile_core::{CheckpointPhase, Error, Message, Revision};

use crate::support::{
    admit, checkpoint, commit_answer, new_conversation, recover, tool_call, SharedStore, Snapshot,
    TestResult,
};

fn assert_fenced<T: std::fmt::Debug>(result: Result<T, Error>, fence: &Fence, what: &str) {
    match result {
        Err(Error::Fenced { run_id, revision }) => {
            assert_eq!((run_id, revision), (fence.run_id, fence.revision), "{what}");
        }
        other => panic!("{what}: expected Fenced, got {other:?}"),
    }
}

/// A zombie owner in the middle of turn 1 (model answered, tool call
/// journaled as requested) and the recovered owner that replaced it.
async fn zombie_mid_turn(store: &SharedStore) -> Result<(Fence, Fence), Error> {
    let conversation = new_conversation(&**store).await?;
    let zombie = admit(&**store, conversation, "hello").await?;
    let run = zombie.run_id;
    let mut start = checkpoint(run, 0, CheckpointPhase::TurnInFlight, 1);
    start.turn = 1;
    store.begin_turn(&zombie, &start).await?;
    let assistant =
        Message::assistant_with_calls("calling", vec![tool_call("call-1", r#"{"q":1}"#)]);
    let answered = checkpoint(run, 1, CheckpointPhase::ToolsInFlight, 1);
    store
        .record_model_response(&zombie, &answered, &assistant)
        .await?;
    let owner = recover(&**store, &zombie).await?;
    Ok((zombie, owner))
}

pub async fn turn_writes_of_a_replaced_owner_are_fenced_and_write_nothing(
    store: SharedStore,
) -> TestResult {
    let (zombie, owner) = zombie_mid_turn(&store).await?;
    let conversation = zombie.conversation_id;
    let (requests, runs) = ([zombie.request_id], [zombie.run_id, owner.run_id]);
    let snapshot = || Snapshot::take(&*store, conversation, &requests, &runs, 3);
    let before = snapshot().await?;
    let run = zombie.run_id;

    let result = ToolResult {
        content: "zombie result".into(),
        is_error: false,
    };
    assert_fenced(
        store
            .record_tool_result(&zombie, 1, "call-1", &result)
            .await,
        &zombie,
        "record_tool_result",
    );
    assert_eq!(snapshot().await?, before);

    let tool_message = Message::tool("call-1", "zombie result", false);
    let ready = checkpoint(run, 1, CheckpointPhase::Ready, 3);
    assert_fenced(
        store
            .finish_turn(&zombie, &ready, &[tool_message], None)
            .await,
        &zombie,
        "finish_turn",
    );
    assert_eq!(snapshot().await?, before);

    let mut start = checkpoint(run, 1, CheckpointPhase::TurnInFlight, 3);
    start.turn = 2;
    assert_fenced(
        store.begin_turn(&zombie, &start).await,
        &zombie,
        "begin_turn",
    );
    assert_eq!(snapshot().await?, before);

    let answered = checkpoint(run, 2, CheckpointPhase::ToolsInFlight, 3);
    let assistant = Message::assistant_with_calls("again", vec![tool_call("call-2", "{}")]);
    assert_fenced(
        store
            .record_model_response(&zombie, &answered, &assistant)
            .await,
        &zombie,
        "record_model_response",
    );
    assert_fenced(
        store.fail_run(&zombie, "zombie", None).await,
        &zombie,
        "fail_run",
    );
    assert_eq!(snapshot().await?, before);

    // A fence with the right revision but the old run is refused too.
    let stolen = Fence {
        revision: owner.revision,
        ..zombie
    };
    assert_fenced(
        store
            .record_tool_result(&stolen, 1, "call-1", &result)
            .await,
        &stolen,
        "current revision, replaced run",
    );
    assert_eq!(snapshot().await?, before);

    // The owner that replaced it still writes.
    let owner_result = ToolResult {
        content: "owner result".into(),
        is_error: false,
    };
    store
        .record_tool_result(&owner, 1, "call-1", &owner_result)
        .await?;
    let journal = store.journal(zombie.request_id, 1).await?;
    assert_eq!(journal.len(), 1);
    assert_eq!(journal[0].status, JournalStatus::Completed);
    assert_eq!(journal[0].result.as_ref(), Some(&owner_result));
    Ok(())
}

pub async fn commit_of_a_replaced_owner_is_fenced_and_writes_nothing(
    store: SharedStore,
) -> TestResult {
    let (zombie, owner) = zombie_mid_turn(&store).await?;
    let conversation = zombie.conversation_id;
    let runs = [zombie.run_id, owner.run_id];
    let before = Snapshot::take(&*store, conversation, &[zombie.request_id], &runs, 3).await?;

    assert_fenced(
        commit_answer(&*store, &zombie, 2, 2, "zombie answer").await,
        &zombie,
        "commit",
    );
    let after = Snapshot::take(&*store, conversation, &[zombie.request_id], &runs, 3).await?;
    assert_eq!(after, before);
    assert!(after.transcript.is_empty());
    assert_eq!(after.conversation.version, 0);
    let request = after.requests[0].as_ref().expect("request");
    assert_eq!(
        (request.status, &request.outcome),
        (RequestStatus::Active, &None)
    );

    // The owner commits; the zombie's answer is nowhere.
    let outcome = commit_answer(&*store, &owner, 2, 2, "owner answer").await?;
    assert_eq!(outcome.run_id, owner.run_id);
    let transcript = store.transcript_window(conversation, 10).await?;
    assert_eq!(
        transcript.last().map(|e| e.message.clone()),
        Some(Message::assistant("owner answer"))
    );
    assert!(transcript
        .iter()
        .all(|e| e.message.text() != "zombie answer"));
    Ok(())
}

pub async fn owner_writes_after_commit_or_abandon_are_fenced(store: SharedStore) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let committed = admit(&*store, conversation, "one").await?;
    commit_answer(&*store, &committed, 1, 1, "answer").await?;
    let runs = [committed.run_id];
    let before = Snapshot::take(&*store, conversation, &[committed.request_id], &runs, 1).await?;
    assert_fenced(
        commit_answer(&*store, &committed, 1, 1, "answer twice").await,
        &committed,
        "second commit",
    );
    let mut start = checkpoint(committed.run_id, 1, CheckpointPhase::TurnInFlight, 2);
    start.turn = 2;
    assert_fenced(
        store.begin_turn(&committed, &start).await,
        &committed,
        "begin_turn after commit",
    );
    let after = Snapshot::take(&*store, conversation, &[committed.request_id], &runs, 1).await?;
    assert_eq!(after, before);

    let abandoned = admit(&*store, conversation, "two").await?;
    let released = store
        .abandon(conversation, abandoned.request_id, abandoned.revision)
        .await?;
    assert_eq!(released, Revision(4));
    assert_fenced(
        commit_answer(&*store, &abandoned, 1, 1, "too late").await,
        &abandoned,
        "commit after abandon",
    );
    assert_eq!(store.transcript_window(conversation, 10).await?.len(), 2);
    Ok(())
}
