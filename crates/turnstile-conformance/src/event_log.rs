//! The event log: each durable step's event, numbered per conversation in
//! the step's own transaction; none for a refused step; removed with a
//! pruned request or a deleted conversation, numbers never reused.

use std::time::Duration;

use turnstile_core::admin::PruneOptions;
use turnstile_core::store::{
    ApprovalDecision, ClaimOutcome, Fence, LoggedEvent, LoggedStep, ToolResult, Verdict,
};
use turnstile_core::{CheckpointPhase, ConversationId, Error, Message, RunId, Store};

use crate::activity::SharedAdmin;
use crate::support::{
    admit, checkpoint, commit_answer, complete_request, new_conversation, new_request, ns, recover,
    tool_call, tool_turn, SharedStore, TestResult,
};

async fn all_events(
    store: &dyn Store,
    conversation: ConversationId,
) -> Result<Vec<LoggedEvent>, Error> {
    store.events_after(conversation, 0, u32::MAX).await
}

fn steps(events: &[LoggedEvent]) -> Vec<LoggedStep> {
    events.iter().map(|e| e.step.clone()).collect()
}

fn seqs(events: &[LoggedEvent]) -> Vec<u64> {
    events.iter().map(|e| e.seq).collect()
}

pub async fn a_request_logs_each_step_once_in_order_and_reads_page_by_page(
    store: SharedStore,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    assert!(all_events(&*store, conversation).await?.is_empty());
    let fence = admit(&*store, conversation, "what is 2+2?").await?;
    let count = tool_turn(&*store, &fence, 1, 1, tool_call("call-1", "{}"), "r1").await?;
    // The turn's end written again (a retried write) logs nothing more.
    let ended = checkpoint(fence.run_id, 1, CheckpointPhase::Ready, count);
    store.finish_turn(&fence, &ended, &[], None).await?;
    commit_answer(&*store, &fence, 2, count, "4").await?;

    let events = all_events(&*store, conversation).await?;
    assert_eq!(seqs(&events), [1, 2, 3, 4, 5]);
    assert!(events.iter().all(|e| e.request_id == fence.request_id));
    assert_eq!(
        steps(&events),
        vec![
            LoggedStep::Admitted {
                run_id: fence.run_id,
                entry_seq: 0
            },
            LoggedStep::Answered { entry_seq: 1 },
            LoggedStep::ToolFinished {
                turn: 1,
                call_id: "call-1".into()
            },
            LoggedStep::CheckpointSaved {
                run_id: fence.run_id,
                turn: 1
            },
            LoggedStep::Committed {
                run_id: fence.run_id
            },
        ]
    );
    // The answer event names the entry its step wrote: the model's call.
    let transcript = store.transcript_window(conversation, 100).await?;
    assert!(matches!(
        &transcript[1].message,
        Message::Assistant { tool_calls, .. } if tool_calls[0].id == "call-1"
    ));
    let first = events[0].at;
    assert!(first > 0 && events.iter().all(|e| e.at >= first));

    // Read on from any number: the rest, in pages.
    let page = store.events_after(conversation, 1, 2).await?;
    assert_eq!(page, events[1..3]);
    assert_eq!(store.events_after(conversation, 5, 10).await?, []);
    assert_eq!(store.events_after(conversation, 99, 10).await?, []);

    // The next request numbers on. Its input follows the first request's
    // four entries; its answer is its message 1, before its commit too.
    let second = admit(&*store, conversation, "and 3+3?").await?;
    tool_turn(&*store, &second, 1, 1, tool_call("call-2", "{}"), "r2").await?;
    let more = store.events_after(conversation, 5, 10).await?;
    assert_eq!(seqs(&more), [6, 7, 8, 9]);
    assert!(more.iter().all(|e| e.request_id == second.request_id));
    let (
        LoggedStep::Admitted {
            entry_seq: input, ..
        },
        LoggedStep::Answered { entry_seq: answer },
    ) = (&more[0].step, &more[1].step)
    else {
        panic!("admitted, then answered: {more:?}");
    };
    assert_eq!((*input, *answer), (4, 5));
    let pending = store.request_messages(second.request_id, 2).await?;
    assert!(matches!(
        &pending[usize::try_from(answer - input)?],
        Message::Assistant { tool_calls, .. } if tool_calls[0].id == "call-2"
    ));
    // A conversation that does not exist has no log.
    assert!(matches!(
        store.events_after(ConversationId::new(), 0, 10).await,
        Err(Error::NotFound { .. })
    ));
    // Another conversation's log is its own.
    let other = new_conversation(&*store).await?;
    complete_request(&*store, other, "elsewhere", 0, "done").await?;
    assert_eq!(seqs(&all_events(&*store, other).await?), [1, 2]);
    assert_eq!(all_events(&*store, conversation).await?.len(), 9);
    Ok(())
}

pub async fn refused_steps_log_nothing(store: SharedStore) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let fence = admit(&*store, conversation, "hello").await?;
    let before = all_events(&*store, conversation).await?;
    assert_eq!(before.len(), 1);

    // A busy claim, a replayed id, a stale abandon.
    let busy = new_request(conversation, fence.revision, "other");
    assert!(matches!(
        store.claim(&busy).await,
        Err(Error::Conflict { .. } | Error::Busy { .. })
    ));
    let mut again = new_request(conversation, fence.revision, "hello");
    again.request_id = fence.request_id;
    again.run_id = RunId::first_of(fence.request_id);
    assert!(matches!(
        store.claim(&again).await?,
        ClaimOutcome::Existing(_)
    ));
    assert!(store
        .abandon(conversation, fence.request_id, turnstile_core::Revision(99))
        .await
        .is_err());
    // A replaced owner's writes.
    let successor = recover(&*store, &fence).await?;
    let after_recovery = all_events(&*store, conversation).await?;
    assert_eq!(
        steps(&after_recovery[1..]),
        [LoggedStep::RunStarted {
            run_id: successor.run_id
        }]
    );
    let answer = Message::assistant("late");
    let answered = checkpoint(fence.run_id, 1, CheckpointPhase::ToolsInFlight, 1);
    assert!(matches!(
        store
            .record_model_response(&fence, &answered, &answer)
            .await,
        Err(Error::Fenced { .. })
    ));
    assert!(matches!(
        commit_answer(&*store, &fence, 1, 1, "late").await,
        Err(Error::Fenced { .. })
    ));
    let ended = checkpoint(fence.run_id, 1, CheckpointPhase::Ready, 3);
    assert!(matches!(
        store.finish_turn(&fence, &ended, &[], None).await,
        Err(Error::Fenced { .. })
    ));
    assert!(matches!(
        store.fail_run(&fence, "late", None).await,
        Err(Error::Fenced { .. })
    ));
    assert_eq!(all_events(&*store, conversation).await?, after_recovery);
    Ok(())
}

pub async fn stops_approvals_takeovers_and_abandons_are_logged(store: SharedStore) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let fence = admit(&*store, conversation, "delete it").await?;
    let mut start = checkpoint(fence.run_id, 0, CheckpointPhase::TurnInFlight, 1);
    start.turn = 1;
    store.begin_turn(&fence, &start).await?;
    let call = tool_call("gated", "{}");
    let answer = Message::assistant_with_calls("calling", vec![call]);
    let answered = checkpoint(fence.run_id, 1, CheckpointPhase::ToolsInFlight, 1);
    store
        .record_model_response(&fence, &answered, &answer)
        .await?;
    let settled = turnstile_core::LoopCheckpoint {
        phase: CheckpointPhase::ToolsPending,
        ..answered
    };
    // A stop asking about a call the answer did not make is refused whole.
    let before = all_events(&*store, conversation).await?;
    assert!(matches!(
        store
            .await_approval(
                &fence,
                &settled,
                &["unknown".to_owned()],
                "awaiting approval"
            )
            .await,
        Err(Error::InvalidInput(_))
    ));
    assert_eq!(all_events(&*store, conversation).await?, before);
    store
        .await_approval(&fence, &settled, &["gated".to_owned()], "awaiting approval")
        .await?;
    let decision = |expected_revision| ApprovalDecision {
        conversation_id: conversation,
        request_id: fence.request_id,
        call_id: "gated".into(),
        expected_revision,
        verdict: Verdict::Approve,
    };
    // A decision at a stale revision is refused and logs nothing.
    let before = all_events(&*store, conversation).await?;
    assert!(store
        .decide_approval(&decision(turnstile_core::Revision(fence.revision.0 + 5)))
        .await
        .is_err());
    assert_eq!(all_events(&*store, conversation).await?, before);
    let revision = store.decide_approval(&decision(fence.revision)).await?;
    let approved = Fence { revision, ..fence };
    let resumed = recover(&*store, &approved).await?;
    // The replaced owner's tool result is fenced and logs nothing.
    let before = all_events(&*store, conversation).await?;
    let late = ToolResult {
        content: "late".into(),
        is_error: false,
    };
    assert!(matches!(
        store.record_tool_result(&approved, 1, "gated", &late).await,
        Err(Error::Fenced { .. })
    ));
    assert_eq!(all_events(&*store, conversation).await?, before);
    store
        .record_tool_result(
            &resumed,
            1,
            "gated",
            &ToolResult {
                content: "deleted".into(),
                is_error: false,
            },
        )
        .await?;
    // The resumed run ends the turn: its checkpoint names the run.
    let ended = checkpoint(resumed.run_id, 1, CheckpointPhase::Ready, 3);
    let result = Message::tool("gated", "deleted", false);
    store.finish_turn(&resumed, &ended, &[result], None).await?;
    store.fail_run(&resumed, "model unavailable", None).await?;
    store
        .abandon(conversation, fence.request_id, resumed.revision)
        .await?;

    let events = all_events(&*store, conversation).await?;
    assert_eq!(seqs(&events), (1..=10).collect::<Vec<_>>());
    let gated = || ("gated".to_owned(), 1);
    let (call_id, turn) = gated();
    assert_eq!(
        steps(&events),
        vec![
            LoggedStep::Admitted {
                run_id: fence.run_id,
                entry_seq: 0
            },
            LoggedStep::Answered { entry_seq: 1 },
            LoggedStep::Stopped {
                run_id: fence.run_id
            },
            LoggedStep::ApprovalRequested {
                turn,
                call_id: call_id.clone()
            },
            LoggedStep::ApprovalDecided {
                turn,
                call_id: call_id.clone()
            },
            LoggedStep::RunStarted {
                run_id: resumed.run_id
            },
            LoggedStep::ToolFinished { turn, call_id },
            LoggedStep::CheckpointSaved {
                run_id: resumed.run_id,
                turn
            },
            LoggedStep::Stopped {
                run_id: resumed.run_id
            },
            LoggedStep::Abandoned,
        ]
    );
    Ok(())
}

pub async fn pruned_and_deleted_events_go_with_their_rows_and_no_number_returns(
    store: SharedAdmin,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    complete_request(&*store, conversation, "first", 1, "one").await?;
    complete_request(&*store, conversation, "second", 0, "two").await?;
    assert_eq!(all_events(&*store, conversation).await?.len(), 7);
    // A fork copies the history, not the log.
    let fork = ConversationId::new();
    store
        .fork_conversation(&ns(), conversation, 6, fork)
        .await?;
    assert!(all_events(&*store, fork).await?.is_empty());

    tokio::time::sleep(Duration::from_millis(5)).await;
    let report = store
        .prune(&PruneOptions::older_than(Duration::ZERO))
        .await?;
    assert_eq!(report.deleted.events, 7);
    assert!(all_events(&*store, conversation).await?.is_empty());
    let next = admit(&*store, conversation, "third").await?;
    let events = all_events(&*store, conversation).await?;
    assert_eq!(seqs(&events), [8]);
    assert_eq!(events[0].request_id, next.request_id);
    store
        .abandon(conversation, next.request_id, next.revision)
        .await?;

    let version = store.conversation(&ns(), conversation).await?.version;
    let deleted = store
        .delete_conversation(&ns(), conversation, version, None)
        .await?;
    assert_eq!(deleted.deleted.events, 2);
    // A follower hears that it is gone.
    assert!(matches!(
        all_events(&*store, conversation).await,
        Err(Error::Deleted { .. })
    ));
    Ok(())
}

/// Conversations as a migration of where a request's admission events are
/// kept finds them: in each, one request committed and one held. The
/// backend takes its database back to before the migration, opens it again
/// and calls [`the_logs_read_on_after_their_admission_events_moved`].
pub struct HeldAcross {
    /// The conversations, each with its held request's fence and its log so
    /// far: the first's held request commits after the migration, the
    /// second's is abandoned.
    conversations: [(ConversationId, Fence, Vec<LoggedEvent>); 2],
}

/// Writes the conversations of [`HeldAcross`].
pub async fn conversations_with_requests_held(store: &dyn Store) -> Result<HeldAcross, Error> {
    Ok(HeldAcross {
        conversations: [
            a_conversation_with_a_request_held(store).await?,
            a_conversation_with_a_request_held(store).await?,
        ],
    })
}

/// One request committed, one held; the held one's fence and the log.
async fn a_conversation_with_a_request_held(
    store: &dyn Store,
) -> Result<(ConversationId, Fence, Vec<LoggedEvent>), Error> {
    let conversation = new_conversation(store).await?;
    complete_request(store, conversation, "first", 0, "done").await?;
    let held = admit(store, conversation, "second").await?;
    Ok((conversation, held, all_events(store, conversation).await?))
}

/// After the migration, in each conversation: the log reads as before; the
/// request held across it settles (committed in the first, abandoned in
/// the second), and the next request is admitted and commits, each event
/// numbered after the last with no gap; read from inside the next request,
/// its commit alone; read one event at a time from the start, the same log.
pub async fn the_logs_read_on_after_their_admission_events_moved(
    store: &dyn Store,
    held: HeldAcross,
) -> TestResult {
    let [committing, abandoning] = held.conversations;
    for ((conversation, fence, before), commits) in [(committing, true), (abandoning, false)] {
        assert_eq!(all_events(store, conversation).await?, before);
        let last = before.last().ok_or("no events before")?.seq;
        let settled = if commits {
            // No report of its turn: the commit a store may send as one
            // statement must still find its admission event outside the row.
            let mut last = checkpoint(fence.run_id, 1, CheckpointPhase::Ready, 2);
            last.verification_reports.clear();
            store
                .commit(&fence, &last, &Message::assistant("held across"))
                .await?;
            "committed"
        } else {
            store
                .abandon(conversation, fence.request_id, fence.revision)
                .await?;
            "abandoned"
        };
        complete_request(store, conversation, "third", 0, "after").await?;
        let after = store.events_after(conversation, last, 100).await?;
        let numbered: Vec<_> = after.iter().map(|e| (e.seq, e.step.kind())).collect();
        assert_eq!(
            numbered,
            [
                (last + 1, settled),
                (last + 2, "admitted"),
                (last + 3, "committed"),
            ]
        );
        assert_eq!(
            store.events_after(conversation, last + 2, 100).await?,
            after[2..]
        );
        let whole = all_events(store, conversation).await?;
        let mut one_at_a_time = Vec::new();
        let mut cursor = 0;
        while let Some(event) = store.events_after(conversation, cursor, 1).await?.pop() {
            cursor = event.seq;
            one_at_a_time.push(event);
        }
        assert_eq!(one_at_a_time, whole);
        assert_eq!(whole.len(), before.len() + 3);
    }
    Ok(())
}
