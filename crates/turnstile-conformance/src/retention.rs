//! Retention through [`StoreAdmin::prune`]: what no replay needs goes, a
//! completed request still replays, active work and recent requests stay.

use std::time::Duration;

use turnstile_core::admin::{PruneOptions, PruneReport, TableCounts};
use turnstile_core::store::{ClaimOutcome, Fence, NewRequest, RequestStatus};
use turnstile_core::{ConversationId, Error, RequestId, Revision, RunId, StoreAdmin};

use crate::activity::SharedAdmin;
use crate::admin::{conversation_ids, filter, tick};
use crate::support::{
    admit, commit_answer, complete_request, new_conversation, new_request, ns, recover, tool_call,
    tool_turn, Snapshot, TestResult,
};

/// One conversation, time passing after its last write:
/// - `completed`: claimed by run `a1`, one tool turn, recovered by run `a2`,
///   a second tool turn, committed by `a2` at turn 3;
/// - `abandoned`: run `b`, one tool turn, abandoned;
/// - `active`: run `c1`, one tool turn, recovered by run `c2`; still held.
struct Retention {
    conversation: ConversationId,
    a1: Fence,
    a2: Fence,
    b: Fence,
    c1: Fence,
    c2: Fence,
}

impl Retention {
    fn requests(&self) -> [RequestId; 3] {
        [self.a1.request_id, self.b.request_id, self.c1.request_id]
    }

    fn runs(&self) -> [RunId; 5] {
        [
            self.a1.run_id,
            self.a2.run_id,
            self.b.run_id,
            self.c1.run_id,
            self.c2.run_id,
        ]
    }

    async fn snapshot(&self, store: &dyn StoreAdmin) -> Result<Snapshot, Error> {
        Snapshot::take(store, self.conversation, &self.requests(), &self.runs(), 3).await
    }

    /// What the active request shows: prune must leave it as it is.
    async fn active(&self, store: &dyn StoreAdmin) -> Result<Snapshot, Error> {
        let runs = [self.c1.run_id, self.c2.run_id];
        Snapshot::take(store, self.conversation, &[self.c1.request_id], &runs, 3).await
    }
}

async fn retention(store: &dyn StoreAdmin) -> Result<Retention, Error> {
    let conversation = new_conversation(store).await?;
    let a1 = admit(store, conversation, "completed").await?;
    let count = tool_turn(store, &a1, 1, 1, tool_call("call-1", "{}"), "r1").await?;
    let a2 = recover(store, &a1).await?;
    let count = tool_turn(store, &a2, 2, count, tool_call("call-2", "{}"), "r2").await?;
    commit_answer(store, &a2, 3, count, "done").await?;

    let b = admit(store, conversation, "abandoned").await?;
    tool_turn(store, &b, 1, 1, tool_call("call-1", "{}"), "r").await?;
    store
        .abandon(conversation, b.request_id, b.revision)
        .await?;

    let c1 = admit(store, conversation, "active").await?;
    tool_turn(store, &c1, 1, 1, tool_call("call-1", "{}"), "r").await?;
    let c2 = recover(store, &c1).await?;
    tick().await;
    Ok(Retention {
        conversation,
        a1,
        a2,
        b,
        c1,
        c2,
    })
}

/// What no replay of the completed request needs: run `a1` and its
/// checkpoint, `a2`'s checkpoints of turns 1 (seeded) and 2, the two
/// journal rows, and its 9 events (admitted; per tool turn the answer, the
/// result journaled and the checkpoint saved; `a2` started; committed).
fn completed_prunable() -> TableCounts {
    TableCounts {
        runs: 1,
        loop_checkpoints: 3,
        tool_calls: 2,
        events: 9,
        ..TableCounts::default()
    }
}

/// Everything of the abandoned request but its row: run `b`, its
/// checkpoint, its journal row, its three pending messages (input, model
/// answer, tool result), its turn's verification report and its 5 events.
fn abandoned_prunable() -> TableCounts {
    TableCounts {
        runs: 1,
        loop_checkpoints: 1,
        tool_calls: 1,
        run_messages: 3,
        verification_reports: 1,
        events: 5,
        ..TableCounts::default()
    }
}

fn sum(a: TableCounts, b: TableCounts) -> TableCounts {
    TableCounts {
        conversations: a.conversations + b.conversations,
        admissions: a.admissions + b.admissions,
        transcript: a.transcript + b.transcript,
        requests: a.requests + b.requests,
        runs: a.runs + b.runs,
        loop_checkpoints: a.loop_checkpoints + b.loop_checkpoints,
        verification_reports: a.verification_reports + b.verification_reports,
        tool_calls: a.tool_calls + b.tool_calls,
        run_messages: a.run_messages + b.run_messages,
        approvals: a.approvals + b.approvals,
        events: a.events + b.events,
    }
}

fn finished_now() -> PruneOptions {
    PruneOptions::older_than(Duration::ZERO)
}

fn assert_counts(report: &PruneReport, deleted: &TableCounts, examined: u64, what: &str) {
    assert_eq!(&report.deleted, deleted, "{what}: rows deleted");
    assert_eq!(
        report.requests_examined, examined,
        "{what}: requests examined"
    );
}

pub async fn prune_deletes_what_no_replay_needs_and_a_completed_request_still_replays(
    store: SharedAdmin,
) -> TestResult {
    let f = retention(&*store).await?;
    let (completed, abandoned) = (f.a1.request_id, f.b.request_id);
    let before = f.snapshot(&*store).await?;
    let active_before = f.active(&*store).await?;
    let a2_checkpoints = store.checkpoints(f.a2.run_id).await?;
    assert_eq!(a2_checkpoints.len(), 3);

    let report = store.prune(&finished_now()).await?;
    assert!(!report.dry_run);
    let expected = sum(completed_prunable(), abandoned_prunable());
    assert_counts(&report, &expected, 2, "prune");

    // The completed request replays: its record and outcome, its
    // committing run with its last checkpoint, its transcript.
    let record = store.request(completed).await?;
    assert_eq!(record, before.requests[0]);
    let outcome = record.and_then(|r| r.outcome).expect("outcome");
    assert_eq!(outcome.run_id, f.a2.run_id);
    assert_eq!((outcome.turns, outcome.verification_reports.len()), (3, 3));
    assert_eq!(
        store.transcript_window(f.conversation, u32::MAX).await?,
        before.transcript
    );
    assert_eq!(store.run(f.a2.run_id).await?, before.runs[1]);
    assert_eq!(
        store.checkpoints(f.a2.run_id).await?,
        a2_checkpoints[2..],
        "the committing run keeps its completed checkpoint"
    );
    // What it no longer needs is gone.
    assert_eq!(store.run(f.a1.run_id).await?, None);
    assert!(store.checkpoints(f.a1.run_id).await?.is_empty());
    for turn in 1..=2 {
        assert!(store.journal(completed, turn).await?.is_empty());
    }

    // The abandoned request keeps its row: its id stays burned.
    assert_eq!(store.request(abandoned).await?, before.requests[1]);
    let retry = NewRequest {
        request_id: abandoned,
        ..new_request(f.conversation, Revision(0), "abandoned")
    };
    match store.claim(&retry).await? {
        ClaimOutcome::Existing(record) => assert_eq!(record.status, RequestStatus::Abandoned),
        ClaimOutcome::Admitted(fence) => panic!("a pruned abandoned id was admitted: {fence:?}"),
    }
    assert_eq!(store.run(f.b.run_id).await?, None);
    assert!(store.checkpoints(f.b.run_id).await?.is_empty());
    assert!(store.journal(abandoned, 1).await?.is_empty());
    assert!(store
        .request_messages(abandoned, u64::MAX)
        .await?
        .is_empty());

    // The active request is untouched.
    assert_eq!(f.active(&*store).await?, active_before);
    // A second prune finds nothing more, though it looks at both again.
    let again = store.prune(&finished_now()).await?;
    assert_counts(&again, &TableCounts::default(), 2, "second prune");
    assert_eq!(f.active(&*store).await?, active_before);
    // And the active request goes on to commit after its messages.
    let outcome = commit_answer(&*store, &f.c2, 2, 3, "late").await?;
    assert_eq!(
        (outcome.first_seq, outcome.end_seq),
        (
            before.transcript.len() as u64,
            before.transcript.len() as u64 + 4
        )
    );
    Ok(())
}

pub async fn prune_dry_run_counts_exactly_and_deletes_nothing(store: SharedAdmin) -> TestResult {
    let f = retention(&*store).await?;
    let before = f.snapshot(&*store).await?;
    let dry = store
        .prune(&PruneOptions {
            dry_run: true,
            ..finished_now()
        })
        .await?;
    assert!(dry.dry_run);
    let expected = sum(completed_prunable(), abandoned_prunable());
    assert_counts(&dry, &expected, 2, "dry run");
    assert_eq!(dry.pages_freed, 0);
    assert_eq!(
        f.snapshot(&*store).await?,
        before,
        "a dry run deletes nothing"
    );

    let real = store.prune(&finished_now()).await?;
    assert!(!real.dry_run);
    assert_eq!(real.deleted, dry.deleted, "the dry run's counts are exact");
    assert_eq!(real.requests_examined, dry.requests_examined);
    assert_ne!(f.snapshot(&*store).await?, before);
    Ok(())
}

pub async fn prune_spares_requests_finished_within_older_than_and_filters_by_status(
    store: SharedAdmin,
) -> TestResult {
    let f = retention(&*store).await?;
    let before = f.snapshot(&*store).await?;
    let recent = store
        .prune(&PruneOptions::older_than(Duration::from_secs(3600)))
        .await?;
    assert_counts(&recent, &TableCounts::default(), 0, "nothing is old enough");
    assert_eq!(f.snapshot(&*store).await?, before);

    let active_only = PruneOptions {
        status: Some(RequestStatus::Active),
        ..finished_now()
    };
    match store.prune(&active_only).await {
        Err(Error::InvalidInput(_)) => {}
        other => panic!("pruning active requests: expected InvalidInput, got {other:?}"),
    }
    assert_eq!(f.snapshot(&*store).await?, before);

    let completed_only = PruneOptions {
        status: Some(RequestStatus::Completed),
        ..finished_now()
    };
    let report = store.prune(&completed_only).await?;
    assert_counts(&report, &completed_prunable(), 1, "completed only");
    assert_eq!(store.run(f.a1.run_id).await?, None);
    // The abandoned request was not looked at.
    assert_eq!(store.run(f.b.run_id).await?, before.runs[2]);
    assert_eq!(
        store
            .request_messages(f.b.request_id, u64::MAX)
            .await?
            .len(),
        3
    );

    let abandoned_only = PruneOptions {
        status: Some(RequestStatus::Abandoned),
        ..finished_now()
    };
    let report = store.prune(&abandoned_only).await?;
    assert_counts(&report, &abandoned_prunable(), 1, "abandoned only");
    assert_eq!(store.run(f.b.run_id).await?, None);
    assert_eq!(store.request(f.a1.request_id).await?, before.requests[0]);
    Ok(())
}

pub async fn prune_with_transcripts_deletes_idle_conversations_whole_and_spares_held_ones(
    store: SharedAdmin,
) -> TestResult {
    // Idle: one request committed after a tool turn, one abandoned.
    let idle = new_conversation(&*store).await?;
    let (done, _) = complete_request(&*store, idle, "idle", 1, "done").await?;
    let dropped = admit(&*store, idle, "dropped").await?;
    tool_turn(&*store, &dropped, 1, 1, tool_call("call-1", "{}"), "r").await?;
    store
        .abandon(idle, dropped.request_id, dropped.revision)
        .await?;
    // Held: one request committed, one active.
    let held = new_conversation(&*store).await?;
    let (kept, _) = complete_request(&*store, held, "kept", 0, "kept answer").await?;
    let active = admit(&*store, held, "active").await?;
    tick().await;
    let requests = [kept.request_id, active.request_id];
    let held_before =
        Snapshot::take(&*store, held, &requests, &[kept.run_id, active.run_id], 1).await?;

    // Everything of the idle conversation: 4 transcript entries; 2 requests
    // and their runs; 3 checkpoints (turns 1 and 2 of the committed run,
    // turn 1 of the abandoned one), as many verification reports; 2
    // journal rows; the abandoned request's 3 pending messages; the log's
    // 10 events (5 of each request). Of the held conversation's committed
    // request only its 2 events go.
    let expected = TableCounts {
        conversations: 1,
        admissions: 1,
        transcript: 4,
        requests: 2,
        runs: 2,
        loop_checkpoints: 3,
        verification_reports: 3,
        tool_calls: 2,
        run_messages: 3,
        approvals: 0,
        events: 12,
    };
    let options = PruneOptions {
        include_transcripts: true,
        ..finished_now()
    };
    let dry = store
        .prune(&PruneOptions {
            dry_run: true,
            ..options.clone()
        })
        .await?;
    assert_eq!(dry.deleted, expected, "dry run");
    assert_eq!(store.conversation(&ns(), idle).await?.version, 1);

    let report = store.prune(&options).await?;
    assert_eq!(report.deleted, expected);
    assert!(matches!(
        store.conversation(&ns(), idle).await,
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        store.admission(idle).await,
        Err(Error::NotFound { .. })
    ));
    assert_eq!(store.request(done.request_id).await?, None);
    assert_eq!(store.request(dropped.request_id).await?, None);
    assert_eq!(store.run(done.run_id).await?, None);
    assert_eq!(conversation_ids(&*store, filter()).await?, [held]);
    // Forgotten ids may be used again.
    let elsewhere = new_conversation(&*store).await?;
    let reuse = NewRequest {
        request_id: dropped.request_id,
        ..new_request(elsewhere, Revision(0), "again")
    };
    assert!(matches!(
        store.claim(&reuse).await?,
        ClaimOutcome::Admitted(_)
    ));

    let held_after =
        Snapshot::take(&*store, held, &requests, &[kept.run_id, active.run_id], 1).await?;
    // Whole but for the committed request's events, which its prune takes.
    let mut held_before = held_before;
    held_before
        .events
        .retain(|e| e.request_id != kept.request_id);
    assert_eq!(held_after, held_before, "a held conversation is kept whole");
    assert!(held_after.requests[0]
        .as_ref()
        .is_some_and(|r| r.outcome.is_some()));
    Ok(())
}
