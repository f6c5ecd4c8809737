//! Deleting a conversation: every row goes in one transaction, the id, its
//! request ids and its run ids stay as tombstones, a refusal writes
//! nothing, and an owner still running afterwards is fenced and re-creates
//! nothing.

use std::sync::Arc;
use std::time::Duration;

use turnstile_core::admin::PruneOptions;
use turnstile_core::agent::{ScriptedModel, ScriptedReply};
use turnstile_core::store::{ClaimOutcome, Fence, SummaryCommit, SummaryPass, ToolResult};
use turnstile_core::{
    Agent, AgentSession, CheckpointPhase, ContextPolicy, ConversationId, Error, Message, Namespace,
    RequestId, Revision, RunContext, RunId, Usage,
};

use crate::activity::SharedAdmin;
use crate::admin::tick;
use crate::support::{
    admit, checkpoint, commit_answer, complete_request, new_conversation, new_request, ns, recover,
    tool_call, tool_turn, SharedStore, Snapshot, TestResult,
};

fn assert_deleted<T: std::fmt::Debug>(
    result: Result<T, Error>,
    conversation: ConversationId,
    what: &str,
) {
    match result {
        Err(Error::Deleted { conversation_id }) => {
            assert_eq!(conversation_id, conversation, "{what}")
        }
        other => panic!("{what}: expected Deleted, got {other:?}"),
    }
}

fn assert_fenced<T: std::fmt::Debug>(result: Result<T, Error>, fence: &Fence, what: &str) {
    match result {
        Err(Error::Fenced { run_id, revision }) => {
            assert_eq!((run_id, revision), (fence.run_id, fence.revision), "{what}");
        }
        other => panic!("{what}: expected Fenced, got {other:?}"),
    }
}

/// Nothing of `conversation`, its request and its runs is readable any
/// more, and its id answers `Deleted`.
async fn assert_gone(
    store: &SharedStore,
    conversation: ConversationId,
    request: RequestId,
    runs: &[turnstile_core::RunId],
) -> TestResult {
    assert_deleted(
        store.conversation(&ns(), conversation).await,
        conversation,
        "conversation",
    );
    assert_deleted(
        store.admission(conversation).await,
        conversation,
        "admission",
    );
    assert_deleted(
        store.ensure_conversation(&ns(), conversation).await,
        conversation,
        "ensure_conversation",
    );
    assert_eq!(store.request(request).await?, None);
    assert!(store.request_messages(request, u64::MAX).await?.is_empty());
    assert!(store.journal(request, 1).await?.is_empty());
    assert!(store
        .transcript_window(conversation, u32::MAX)
        .await?
        .is_empty());
    assert_eq!(store.latest_summary(conversation).await?, None);
    for &run in runs {
        assert_deleted(store.run(run).await, conversation, "run");
        assert!(store.checkpoints(run).await?.is_empty());
    }
    Ok(())
}

pub async fn delete_removes_every_row_and_leaves_tombstones_of_the_id_and_its_requests(
    store: SharedStore,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let (fence, _) = complete_request(&*store, conversation, "question", 1, "answer").await?;
    let other = new_conversation(&*store).await?;
    complete_request(&*store, other, "other question", 0, "other answer").await?;
    let kept = store.transcript_window(other, u32::MAX).await?;

    let report = store
        .delete_conversation(&ns(), conversation, 1, None)
        .await?;
    assert_eq!(report.conversation_id, conversation);
    let d = &report.deleted;
    // user, assistant with its call, tool result, answer.
    assert_eq!(
        (
            d.conversations,
            d.admissions,
            d.transcript,
            d.requests,
            d.runs
        ),
        (1, 1, 4, 1, 1)
    );
    assert_eq!(d.tool_calls, 1);
    assert!(d.loop_checkpoints >= 1);
    assert_eq!(report.tombstoned_requests, 1);
    assert_gone(&store, conversation, fence.request_id, &[fence.run_id]).await?;

    // A delete again is told it was deleted; so is a claim of one of its
    // request ids, in any conversation: never a fresh request.
    assert_deleted(
        store
            .delete_conversation(&ns(), conversation, 1, None)
            .await,
        conversation,
        "a second delete",
    );
    let revision = store.admission(other).await?.revision;
    let mut retry = new_request(other, revision, "question");
    retry.request_id = fence.request_id;
    assert_deleted(
        store.claim(&retry).await,
        conversation,
        "a claim of a deleted request id",
    );
    assert_eq!(store.admission(other).await?.revision, revision);
    assert_eq!(store.request(fence.request_id).await?, None);
    // Another conversation is untouched.
    assert_eq!(store.transcript_window(other, u32::MAX).await?, kept);
    Ok(())
}

/// Run ids are tombstones too: every run of a deleted conversation (a
/// superseded one, a committing one, an abandoned one, one held at the
/// delete) answers `Deleted` to a lookup by id. Pruning is not deletion: a
/// run it removed is unknown (`None`), and the committing run it keeps
/// stays readable.
pub async fn run_ids_of_a_deleted_conversation_answer_deleted_and_pruned_ones_are_unknown(
    store: SharedAdmin,
) -> TestResult {
    // A completed request whose first run was recovered, in each conversation.
    let superseded_and_committed = |conversation| {
        let store = store.clone();
        async move {
            let first = admit(&*store, conversation, "completed").await?;
            let count = tool_turn(&*store, &first, 1, 1, tool_call("call-1", "{}"), "r").await?;
            let second = recover(&*store, &first).await?;
            commit_answer(&*store, &second, 2, count, "done").await?;
            Ok::<_, Error>((first.run_id, second.run_id))
        }
    };
    let pruned = new_conversation(&*store).await?;
    let (earlier, committing) = superseded_and_committed(pruned).await?;
    tick().await;
    store
        .prune(&PruneOptions::older_than(Duration::ZERO))
        .await?;
    assert_eq!(store.run(earlier).await?, None, "a pruned run is unknown");
    assert!(
        store.run(committing).await?.is_some(),
        "kept for the replay"
    );

    let conversation = new_conversation(&*store).await?;
    let (superseded, committed) = superseded_and_committed(conversation).await?;
    let abandoned = admit(&*store, conversation, "abandoned").await?;
    store
        .abandon(conversation, abandoned.request_id, abandoned.revision)
        .await?;
    let held = admit(&*store, conversation, "held").await?;
    store
        .delete_conversation(&ns(), conversation, 1, Some(held.revision))
        .await?;
    for run in [superseded, committed, abandoned.run_id, held.run_id] {
        assert_deleted(store.run(run).await, conversation, "a deleted run id");
    }
    assert_eq!(store.run(RunId::new()).await?, None, "an unknown run id");
    assert!(
        store.run(committing).await?.is_some(),
        "another conversation's"
    );
    Ok(())
}

/// A request id of a deleted conversation, sent to a conversation that does
/// not exist yet, is refused before anything is written: the read a claim
/// starts from answers `Deleted`, and a session's request is refused with
/// it, creating no conversation.
pub async fn a_deleted_request_id_in_a_new_conversation_is_refused_and_creates_nothing(
    store: SharedStore,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let (fence, _) = complete_request(&*store, conversation, "question", 0, "answer").await?;
    store
        .delete_conversation(&ns(), conversation, 1, None)
        .await?;

    let fresh = ConversationId::new();
    assert_deleted(
        store
            .claim_context(&ns(), fresh, fence.request_id, Some(10))
            .await,
        conversation,
        "the claim context of a deleted request id",
    );
    let model = Arc::new(ScriptedModel::new(vec![ScriptedReply::text("never")]));
    let session = AgentSession::new(
        Agent::new(model.clone()),
        store.clone(),
        fresh,
        ns(),
        ContextPolicy::default(),
    );
    assert_deleted(
        session
            .run(fence.request_id, "question", RunContext::default())
            .await,
        conversation,
        "a session's request with a deleted request id",
    );
    assert_eq!(model.calls(), 0, "no model work");
    match store.conversation(&ns(), fresh).await {
        Err(Error::NotFound { .. }) => {}
        other => panic!("the new conversation was created: {other:?}"),
    }
    Ok(())
}

pub async fn a_refused_delete_changes_nothing(store: SharedStore) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    complete_request(&*store, conversation, "question", 0, "answer").await?;
    let held = admit(&*store, conversation, "second").await?;
    let (requests, runs) = ([held.request_id], [held.run_id]);
    let snapshot = || Snapshot::take(&*store, conversation, &requests, &runs, 1);
    let before = snapshot().await?;

    match store
        .delete_conversation(&ns(), conversation, 0, None)
        .await
    {
        Err(Error::VersionConflict {
            conversation_id,
            expected,
            actual,
        }) => assert_eq!((conversation_id, expected, actual), (conversation, 0, 1)),
        other => panic!("stale version: expected VersionConflict, got {other:?}"),
    }
    for active in [None, Some(Revision(held.revision.0 + 1))] {
        match store
            .delete_conversation(&ns(), conversation, 1, active)
            .await
        {
            Err(Error::Busy {
                request_id,
                revision,
                ..
            }) => assert_eq!((request_id, revision), (held.request_id, held.revision)),
            other => panic!("held with {active:?}: expected Busy, got {other:?}"),
        }
    }
    let elsewhere = Namespace::new("elsewhere")?;
    assert!(matches!(
        store
            .delete_conversation(&elsewhere, conversation, 1, None)
            .await,
        Err(Error::NamespaceMismatch { .. })
    ));
    assert!(matches!(
        store
            .delete_conversation(&ns(), ConversationId::new(), 0, None)
            .await,
        Err(Error::NotFound { .. })
    ));
    assert_eq!(snapshot().await?, before);

    // With the admission's revision, the held conversation goes.
    store
        .delete_conversation(&ns(), conversation, 1, Some(held.revision))
        .await?;
    assert_gone(&store, conversation, held.request_id, &[held.run_id]).await
}

pub async fn owner_writes_after_a_delete_are_fenced_and_resurrect_nothing(
    store: SharedStore,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let zombie = admit(&*store, conversation, "hello").await?;
    let count = tool_turn(&*store, &zombie, 1, 1, tool_call("call-1", "{}"), "one").await?;
    store
        .delete_conversation(&ns(), conversation, 0, Some(zombie.revision))
        .await?;

    let run = zombie.run_id;
    let mut start = checkpoint(run, 1, CheckpointPhase::TurnInFlight, count);
    start.turn = 2;
    assert_fenced(
        store.begin_turn(&zombie, &start).await,
        &zombie,
        "begin_turn",
    );
    let assistant = Message::assistant_with_calls("calling", vec![tool_call("call-2", "{}")]);
    let answered = checkpoint(run, 2, CheckpointPhase::ToolsInFlight, count);
    assert_fenced(
        store
            .record_model_response(&zombie, &answered, &assistant)
            .await,
        &zombie,
        "record_model_response",
    );
    let result = ToolResult {
        content: "two".into(),
        is_error: false,
    };
    assert_fenced(
        store
            .record_tool_result(&zombie, 2, "call-2", &result)
            .await,
        &zombie,
        "record_tool_result",
    );
    let done = checkpoint(run, 2, CheckpointPhase::Ready, count + 1);
    assert_fenced(
        store
            .finish_turn(&zombie, &done, &[Message::assistant("x")], None)
            .await,
        &zombie,
        "finish_turn",
    );
    assert_fenced(
        store.fail_run(&zombie, "stopped", None).await,
        &zombie,
        "fail_run",
    );
    let pass = SummaryPass {
        from_seq: 0,
        through_seq: 0,
        transcript_version: 0,
        prompt_sha256: [1; 32],
    };
    assert_fenced(
        store.record_summary_pass(&zombie, &pass).await,
        &zombie,
        "record_summary_pass",
    );
    let summary = SummaryCommit {
        pass,
        content: "S".into(),
        usage: Usage::default(),
    };
    assert_fenced(
        store.commit_summary(&zombie, &summary).await,
        &zombie,
        "commit_summary",
    );
    assert_fenced(
        commit_answer(&*store, &zombie, 2, count, "late answer").await,
        &zombie,
        "commit",
    );
    assert_gone(&store, conversation, zombie.request_id, &[run]).await
}

pub async fn a_claim_racing_a_delete_either_wins_whole(store: SharedStore) -> TestResult {
    let namespace = ns();
    for round in 0..8 {
        let conversation = new_conversation(&*store).await?;
        let claim = new_request(conversation, Revision(0), &format!("race {round}"));
        let (claimed, deleted) = tokio::join!(
            {
                let store = Arc::clone(&store);
                let claim = claim.clone();
                async move { store.claim(&claim).await }
            },
            store.delete_conversation(&namespace, conversation, 0, None)
        );
        match (claimed, deleted) {
            (Ok(ClaimOutcome::Admitted(fence)), Err(Error::Busy { request_id, .. })) => {
                assert_eq!(request_id, claim.request_id);
                let admission = store.admission(conversation).await?;
                assert_eq!(admission.revision, fence.revision);
                assert!(store.request(claim.request_id).await?.is_some());
            }
            (Err(Error::Deleted { conversation_id }), Ok(_)) => {
                assert_eq!(conversation_id, conversation);
                assert_gone(&store, conversation, claim.request_id, &[]).await?;
                // The claim's run never started: no tombstone of it.
                assert_eq!(store.run(claim.run_id).await?, None);
            }
            other => panic!("round {round}: neither won whole: {other:?}"),
        }
    }
    Ok(())
}
