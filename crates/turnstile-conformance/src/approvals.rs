//! Approval of tool calls: the stop that asks, the decisions (each a
//! compare-and-swap on the admission's revision), the listing, and the
//! request's deadline and agent change kept by the claims.

use std::sync::Arc;

use tokio::sync::Barrier;
use turnstile_core::admin::{ListFilter, PruneOptions};
use turnstile_core::store::{
    AgentChange, ApprovalDecision, ApprovalStatus, Fence, PendingApproval, RecoveryClaim,
    RunStatus, ToolResult, Verdict,
};
use turnstile_core::{CheckpointPhase, Error, LoopCheckpoint, Message, Revision, Store, ToolCall};

use crate::activity::SharedAdmin;
use crate::admin::{conversation_ids, filter, request_ids, run_ids, tick, PATIENT};
use crate::support::{
    admit, checkpoint, commit_answer, new_conversation, new_request, recover, recovery_of,
    tool_call, SharedStore, Snapshot, TestResult,
};

const REASON: &str = "awaiting approval of 1 tool call(s)";

/// A run at turn 1 whose answer asked for `gated` (needs approval) and
/// `free` (needs none, answered and journaled): the moment before its stop.
async fn asking(store: &dyn Store) -> Result<(Fence, LoopCheckpoint), Error> {
    let conversation = new_conversation(store).await?;
    let fence = admit(store, conversation, "hello").await?;
    let mut start = checkpoint(fence.run_id, 0, CheckpointPhase::TurnInFlight, 1);
    start.turn = 1;
    store.begin_turn(&fence, &start).await?;
    let assistant =
        Message::assistant_with_calls("calling", vec![gated(), tool_call("free", "{}")]);
    let answered = checkpoint(fence.run_id, 1, CheckpointPhase::ToolsInFlight, 1);
    store
        .record_model_response(&fence, &answered, &assistant)
        .await?;
    let result = ToolResult {
        content: "free result".into(),
        is_error: false,
    };
    store.record_tool_result(&fence, 1, "free", &result).await?;
    let settled = LoopCheckpoint {
        phase: CheckpointPhase::ToolsPending,
        ..answered
    };
    Ok((fence, settled))
}

fn gated() -> ToolCall {
    ToolCall {
        id: "gated".into(),
        name: "delete_files".into(),
        arguments: r#"{"path":"/tmp/x"}"#.into(),
        provider_metadata: None,
    }
}

/// A run stopped for approval of `gated`.
async fn stopped(store: &dyn Store) -> Result<(Fence, Vec<PendingApproval>), Error> {
    let (fence, settled) = asking(store).await?;
    let pending = store
        .await_approval(&fence, &settled, &["gated".to_owned()], REASON)
        .await?;
    Ok((fence, pending))
}

fn decision(fence: &Fence, revision: Revision, verdict: Verdict) -> ApprovalDecision {
    ApprovalDecision {
        conversation_id: fence.conversation_id,
        request_id: fence.request_id,
        call_id: "gated".into(),
        expected_revision: revision,
        verdict,
    }
}

fn rejected(reason: &str) -> Verdict {
    Verdict::Reject {
        reason: reason.into(),
    }
}

async fn snapshot(store: &dyn Store, fence: &Fence) -> Result<Snapshot, Error> {
    Snapshot::take(
        store,
        fence.conversation_id,
        &[fence.request_id],
        &[fence.run_id],
        1,
    )
    .await
}

pub async fn await_approval_settles_the_turn_and_lists_the_awaiting_call(
    store: SharedStore,
) -> TestResult {
    let (fence, settled) = asking(&*store).await?;
    let pending = store
        .await_approval(&fence, &settled, &["gated".to_owned()], REASON)
        .await?;
    assert_eq!(pending.len(), 1);
    let asked = &pending[0];
    assert_eq!(
        (asked.conversation_id, asked.request_id, asked.run_id),
        (fence.conversation_id, fence.request_id, fence.run_id)
    );
    assert_eq!((asked.turn, asked.call_id.as_str()), (1, "gated"));
    assert_eq!(asked.tool, "delete_files");
    assert_eq!(asked.arguments, r#"{"path":"/tmp/x"}"#);
    assert_eq!(
        asked.revision, fence.revision,
        "the stop keeps the revision"
    );
    assert!(asked.requested_at > 0);

    let admission = store.admission(fence.conversation_id).await?;
    assert_eq!(admission.revision, fence.revision);
    assert_eq!(
        admission.active.map(|a| a.request_id),
        Some(fence.request_id),
        "the admission stays held"
    );
    let latest = store
        .latest_checkpoint(fence.run_id)
        .await?
        .expect("latest");
    assert_eq!(latest.phase, CheckpointPhase::ToolsPending);
    assert_eq!(latest.usage, settled.usage);
    let run = store.run(fence.run_id).await?.expect("run");
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(run.error.as_deref(), Some(REASON));

    let approvals = store.approvals(fence.request_id, 1).await?;
    assert_eq!(approvals.len(), 1);
    assert_eq!(approvals[0].status, ApprovalStatus::Awaiting);
    assert_eq!(approvals[0].run_id, fence.run_id);
    assert_eq!(approvals[0].decided_at, None);
    assert_eq!(
        store.pending_approvals(Some(fence.conversation_id)).await?,
        pending
    );
    assert!(store.pending_approvals(None).await?.contains(&pending[0]));
    let other = new_conversation(&*store).await?;
    assert!(store.pending_approvals(Some(other)).await?.is_empty());

    // Asked again (a run resumed before any decision): the row is kept.
    let again = store
        .await_approval(&fence, &settled, &["gated".to_owned()], REASON)
        .await?;
    assert_eq!(again, pending);
    Ok(())
}

pub async fn await_approval_of_a_replaced_owner_or_an_unknown_call_writes_nothing(
    store: SharedStore,
) -> TestResult {
    let (fence, settled) = asking(&*store).await?;
    let before = snapshot(&*store, &fence).await?;
    match store
        .await_approval(&fence, &settled, &["no-such-call".to_owned()], REASON)
        .await
    {
        Err(Error::InvalidInput(_)) => {}
        other => panic!("expected InvalidInput, got {other:?}"),
    }
    assert_eq!(snapshot(&*store, &fence).await?, before);
    assert!(store.approvals(fence.request_id, 1).await?.is_empty());

    let owner = recover(&*store, &fence).await?;
    let (requests, runs) = ([fence.request_id], [fence.run_id, owner.run_id]);
    let snap = || Snapshot::take(&*store, fence.conversation_id, &requests, &runs, 1);
    let before = snap().await?;
    match store
        .await_approval(&fence, &settled, &["gated".to_owned()], REASON)
        .await
    {
        Err(Error::Fenced { run_id, revision }) => {
            assert_eq!((run_id, revision), (fence.run_id, fence.revision));
        }
        other => panic!("expected Fenced, got {other:?}"),
    }
    assert_eq!(snap().await?, before);
    assert!(store.approvals(fence.request_id, 1).await?.is_empty());
    assert!(store
        .pending_approvals(Some(fence.conversation_id))
        .await?
        .is_empty());
    Ok(())
}

pub async fn a_decision_moves_the_revision_on_and_is_journaled_with_its_time(
    store: SharedStore,
) -> TestResult {
    let (fence, _) = stopped(&*store).await?;
    let revision = store
        .decide_approval(&decision(&fence, fence.revision, Verdict::Approve))
        .await?;
    assert_eq!(revision, Revision(fence.revision.0 + 1));
    let admission = store.admission(fence.conversation_id).await?;
    assert_eq!(admission.revision, revision);
    let active = admission.active.expect("still held");
    assert_eq!(
        (active.request_id, active.run_id),
        (fence.request_id, fence.run_id)
    );
    let approvals = store.approvals(fence.request_id, 1).await?;
    assert_eq!(approvals.len(), 1);
    assert_eq!(approvals[0].status, ApprovalStatus::Approved);
    assert_eq!(approvals[0].reason, None);
    assert!(approvals[0]
        .decided_at
        .is_some_and(|t| t >= approvals[0].requested_at));
    assert!(store
        .pending_approvals(Some(fence.conversation_id))
        .await?
        .is_empty());

    // The asking run is fenced by the decision: it cannot act on it.
    let result = ToolResult {
        content: "late".into(),
        is_error: false,
    };
    assert!(matches!(
        store.record_tool_result(&fence, 1, "gated", &result).await,
        Err(Error::Fenced { .. })
    ));

    // A rejection keeps its reason.
    let (other, _) = stopped(&*store).await?;
    let reason = "not on a Friday ✋ \u{202e}";
    store
        .decide_approval(&decision(&other, other.revision, rejected(reason)))
        .await?;
    let approvals = store.approvals(other.request_id, 1).await?;
    assert_eq!(approvals[0].status, ApprovalStatus::Rejected);
    assert_eq!(approvals[0].reason.as_deref(), Some(reason));
    Ok(())
}

pub async fn a_refused_decision_writes_nothing(store: SharedStore) -> TestResult {
    let (fence, _) = stopped(&*store).await?;
    let before = snapshot(&*store, &fence).await?;
    let approvals_before = store.approvals(fence.request_id, 1).await?;
    let stale = Revision(fence.revision.0 - 1);
    match store
        .decide_approval(&decision(&fence, stale, Verdict::Approve))
        .await
    {
        Err(Error::Conflict {
            expected, actual, ..
        }) => assert_eq!((expected, actual), (stale, fence.revision)),
        other => panic!("stale revision: expected Conflict, got {other:?}"),
    }
    let unknown = ApprovalDecision {
        call_id: "free".into(),
        ..decision(&fence, fence.revision, Verdict::Approve)
    };
    match store.decide_approval(&unknown).await {
        Err(Error::NoPendingApproval {
            request_id,
            call_id,
        }) => {
            assert_eq!((request_id, call_id.as_str()), (fence.request_id, "free"));
        }
        other => panic!("a call that awaits nothing: expected NoPendingApproval, got {other:?}"),
    }
    let stranger = ApprovalDecision {
        request_id: new_request(fence.conversation_id, fence.revision, "x").request_id,
        ..decision(&fence, fence.revision, Verdict::Approve)
    };
    assert!(matches!(
        store.decide_approval(&stranger).await,
        Err(Error::NotActive { .. })
    ));
    assert_eq!(snapshot(&*store, &fence).await?, before);
    assert_eq!(
        store.approvals(fence.request_id, 1).await?,
        approvals_before
    );

    // Decided once: a second decision finds nothing awaiting, whatever it
    // says, at the new revision and at the old one.
    let revision = store
        .decide_approval(&decision(&fence, fence.revision, rejected("no")))
        .await?;
    let after_first = snapshot(&*store, &fence).await?;
    assert!(matches!(
        store
            .decide_approval(&decision(&fence, revision, Verdict::Approve))
            .await,
        Err(Error::NoPendingApproval { .. })
    ));
    assert!(matches!(
        store
            .decide_approval(&decision(&fence, fence.revision, Verdict::Approve))
            .await,
        Err(Error::Conflict { .. })
    ));
    assert_eq!(snapshot(&*store, &fence).await?, after_first);
    assert_eq!(
        store.approvals(fence.request_id, 1).await?[0].status,
        ApprovalStatus::Rejected
    );

    // A released request takes no decision.
    let owner = recover(&*store, &Fence { revision, ..fence }).await?;
    commit_answer(&*store, &owner, 2, 4, "done").await?;
    assert!(matches!(
        store
            .decide_approval(&decision(
                &fence,
                Revision(revision.0 + 2),
                Verdict::Approve
            ))
            .await,
        Err(Error::NotActive { .. })
    ));
    Ok(())
}

pub async fn concurrent_decisions_on_one_call_let_exactly_one_win(
    store: SharedStore,
) -> TestResult {
    const TASKS: usize = 16;
    let (fence, _) = stopped(&*store).await?;
    let start = Arc::new(Barrier::new(TASKS));
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let (store, start) = (store.clone(), start.clone());
            let verdict = match i % 2 {
                0 => Verdict::Approve,
                _ => rejected(&format!("racer {i}")),
            };
            let decision = decision(&fence, fence.revision, verdict);
            tokio::spawn(async move {
                start.wait().await;
                let result = store.decide_approval(&decision).await;
                (decision.verdict, result)
            })
        })
        .collect();
    let mut winners = Vec::new();
    for task in tasks {
        let (verdict, result) = task.await?;
        match result {
            Ok(revision) => winners.push((verdict, revision)),
            Err(Error::Conflict { .. } | Error::NoPendingApproval { .. }) => {}
            Err(e) => panic!("a losing decision failed otherwise: {e}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one decision wins");
    let (verdict, revision) = winners.remove(0);
    assert_eq!(revision, Revision(fence.revision.0 + 1));
    assert_eq!(
        store.admission(fence.conversation_id).await?.revision,
        revision
    );
    let record = store.approvals(fence.request_id, 1).await?.remove(0);
    match verdict {
        Verdict::Approve => assert_eq!(record.status, ApprovalStatus::Approved),
        Verdict::Reject { reason } => {
            assert_eq!(record.status, ApprovalStatus::Rejected);
            assert_eq!(record.reason, Some(reason));
        }
    }
    Ok(())
}

pub async fn pending_approvals_leave_out_answered_calls_and_released_requests(
    store: SharedStore,
) -> TestResult {
    // Answered: approved, then run by the next owner.
    let (fence, _) = stopped(&*store).await?;
    let revision = store
        .decide_approval(&decision(&fence, fence.revision, Verdict::Approve))
        .await?;
    let owner = recover(&*store, &Fence { revision, ..fence }).await?;
    let result = ToolResult {
        content: "ran".into(),
        is_error: false,
    };
    store
        .record_tool_result(&owner, 1, "gated", &result)
        .await?;
    assert_eq!(
        store.approvals(fence.request_id, 1).await?[0].status,
        ApprovalStatus::Approved
    );

    // Answered without a decision (the store does not judge the session's
    // rules), then stopped.
    let (second, _) = stopped(&*store).await?;
    let owner = recover(&*store, &second).await?;
    store
        .record_tool_result(&owner, 1, "gated", &result)
        .await?;
    store.fail_run(&owner, "stopped", None).await?;
    assert!(store
        .pending_approvals(Some(second.conversation_id))
        .await?
        .is_empty());
    assert!(matches!(
        store
            .decide_approval(&decision(&second, owner.revision, Verdict::Approve))
            .await,
        Err(Error::NoPendingApproval { .. })
    ));

    // Released: abandoned while awaiting.
    let (third, _) = stopped(&*store).await?;
    store
        .abandon(third.conversation_id, third.request_id, third.revision)
        .await?;
    let everywhere = store.pending_approvals(None).await?;
    for gone in [&fence, &second, &third] {
        assert!(
            everywhere.iter().all(|p| p.request_id != gone.request_id),
            "a request with nothing awaiting is listed"
        );
    }
    assert!(store
        .pending_approvals(Some(fence.conversation_id))
        .await?
        .is_empty());
    Ok(())
}

pub async fn claim_stores_the_deadline_and_every_read_of_the_request_returns_it(
    store: SharedStore,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let mut claim = new_request(conversation, Revision(0), "in time");
    claim.deadline_at = Some(1_900_000_000_123);
    store.claim(&claim).await?;
    let record = store.request(claim.request_id).await?.expect("request");
    assert_eq!(record.deadline_at, Some(1_900_000_000_123));
    let context = store
        .claim_context(&crate::support::ns(), conversation, claim.request_id, None)
        .await?;
    assert_eq!(
        context.request.map(|r| r.deadline_at),
        Some(record.deadline_at)
    );

    let other = new_conversation(&*store).await?;
    let plain = new_request(other, Revision(0), "whenever");
    store.claim(&plain).await?;
    assert_eq!(
        store
            .request(plain.request_id)
            .await?
            .expect("request")
            .deadline_at,
        None
    );
    Ok(())
}

pub async fn recovery_claim_with_another_fingerprint_records_the_agent_change(
    store: SharedStore,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let first = admit(&*store, conversation, "hello").await?;
    let upgraded = store
        .claim_recovery(&RecoveryClaim {
            reject_in_flight: true,
            agent_fingerprint: Some("fp-2".into()),
            ..recovery_of(&first)
        })
        .await?;
    let admission = store.admission(conversation).await?;
    assert_eq!(
        admission.active.map(|a| a.agent_fingerprint).as_deref(),
        Some("fp-2")
    );
    let run = store.run(upgraded.run_id).await?.expect("new run");
    assert_eq!(
        run.agent_change,
        Some(AgentChange {
            from: "fp".into(),
            to: "fp-2".into(),
        })
    );
    assert_eq!(
        store.run(first.run_id).await?.expect("old").agent_change,
        None
    );

    // A plain recovery keeps the fingerprint and records no change.
    let plain = recover(&*store, &upgraded).await?;
    assert_eq!(
        store.run(plain.run_id).await?.expect("run").agent_change,
        None
    );
    let admission = store.admission(conversation).await?;
    assert_eq!(
        admission.active.map(|a| a.agent_fingerprint).as_deref(),
        Some("fp-2")
    );
    Ok(())
}

pub async fn prune_deletes_the_approvals_of_finished_requests(store: SharedAdmin) -> TestResult {
    let (fence, _) = stopped(&*store).await?;
    let revision = store
        .decide_approval(&decision(&fence, fence.revision, rejected("no")))
        .await?;
    let owner = recover(&*store, &Fence { revision, ..fence }).await?;
    commit_answer(&*store, &owner, 2, 4, "done").await?;
    let (held, _) = stopped(&*store).await?;
    tick().await;

    let report = store
        .prune(&PruneOptions::older_than(std::time::Duration::ZERO))
        .await?;
    assert_eq!(report.deleted.approvals, 1, "{report:?}");
    assert!(store.approvals(fence.request_id, 1).await?.is_empty());
    assert_eq!(store.approvals(held.request_id, 1).await?.len(), 1);
    assert_eq!(
        store
            .pending_approvals(Some(held.conversation_id))
            .await?
            .len(),
        1
    );
    assert!(store.request(fence.request_id).await?.is_some());
    Ok(())
}

pub async fn a_decision_waits_while_a_run_of_the_request_goes_on(store: SharedStore) -> TestResult {
    let (fence, _) = stopped(&*store).await?;
    // Another run took the request over and is running: a decision now
    // could fence it in the middle of a call decided before.
    let owner = recover(&*store, &fence).await?;
    let runs = [fence.run_id, owner.run_id];
    let requests = [fence.request_id];
    let before = Snapshot::take(&*store, fence.conversation_id, &requests, &runs, 1).await?;
    match store
        .decide_approval(&decision(&fence, owner.revision, Verdict::Approve))
        .await
    {
        Err(Error::Busy {
            request_id,
            revision,
            ..
        }) => assert_eq!((request_id, revision), (fence.request_id, owner.revision)),
        other => panic!("expected Busy, got {other:?}"),
    }
    assert_eq!(
        Snapshot::take(&*store, fence.conversation_id, &requests, &runs, 1).await?,
        before
    );
    assert_eq!(
        store.approvals(fence.request_id, 1).await?[0].status,
        ApprovalStatus::Awaiting
    );

    // The new run asks again: the call is listed under the run that holds
    // the request now, and a decision goes through.
    let settled = checkpoint(owner.run_id, 1, CheckpointPhase::ToolsPending, 1);
    let pending = store
        .await_approval(&owner, &settled, &["gated".to_owned()], REASON)
        .await?;
    assert_eq!(pending[0].run_id, owner.run_id);
    let listed = store.pending_approvals(Some(fence.conversation_id)).await?;
    assert_eq!(listed, pending);
    assert_eq!(
        store.approvals(fence.request_id, 1).await?[0].run_id,
        fence.run_id,
        "the approval row keeps the run that first asked"
    );
    store
        .decide_approval(&decision(&fence, owner.revision, Verdict::Approve))
        .await?;
    Ok(())
}

pub async fn a_request_awaiting_approval_is_held_but_not_stuck_and_counted_apart(
    store: SharedAdmin,
) -> TestResult {
    let (waiting, _) = stopped(&*store).await?;
    // Beside it, a failed owner: stuck, as before.
    let failed = admit(&*store, new_conversation(&*store).await?, "failed").await?;
    store.fail_run(&failed, "tool crashed", None).await?;

    let report = store.doctor(PATIENT).await?;
    assert_eq!(
        (
            report.held_admissions,
            report.stuck_admissions,
            report.awaiting_approval_admissions
        ),
        (Some(2), Some(1), Some(1))
    );
    let stuck = ListFilter {
        stuck_only: true,
        ..filter()
    };
    assert_eq!(
        conversation_ids(&*store, stuck.clone()).await?,
        [failed.conversation_id]
    );
    assert_eq!(
        request_ids(&*store, stuck.clone()).await?,
        [failed.request_id]
    );
    assert_eq!(run_ids(&*store, stuck.clone()).await?, [failed.run_id]);
    let held = |summary: Option<turnstile_core::admin::ConversationSummary>| {
        let held = summary.expect("conversation").held.expect("held");
        (held.stuck, held.awaiting_approval)
    };
    assert_eq!(
        held(
            store
                .conversation_summary(waiting.conversation_id, PATIENT)
                .await?
        ),
        (false, true)
    );
    assert_eq!(
        held(
            store
                .conversation_summary(failed.conversation_id, PATIENT)
                .await?
        ),
        (true, false)
    );
    let run = store
        .run_summary(waiting.run_id, PATIENT)
        .await?
        .expect("run");
    let run_held = run.held.expect("held");
    assert_eq!((run_held.stuck, run_held.awaiting_approval), (false, true));

    // Decided, it awaits nothing more: its stopped run holds the admission
    // until a run continues it, and that is stuck.
    store
        .decide_approval(&decision(&waiting, waiting.revision, Verdict::Approve))
        .await?;
    assert_eq!(
        held(
            store
                .conversation_summary(waiting.conversation_id, PATIENT)
                .await?
        ),
        (true, false)
    );
    let report = store.doctor(PATIENT).await?;
    assert_eq!(
        (
            report.held_admissions,
            report.stuck_admissions,
            report.awaiting_approval_admissions
        ),
        (Some(2), Some(2), Some(0))
    );
    assert_eq!(conversation_ids(&*store, stuck).await?.len(), 2);
    Ok(())
}
