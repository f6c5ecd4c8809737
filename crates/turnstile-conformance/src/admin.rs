//! The operations on a store ([`StoreAdmin`]): listings newest first,
//! filtered and limited; what stuck admissions hold; retention that keeps
//! every replay; health and storage figures.

use std::time::Duration;

use turnstile_core::admin::{ListFilter, PruneOptions, PruneReport, TableCounts};
use turnstile_core::store::{ClaimOutcome, Fence, NewRequest, RequestStatus, RunStatus};
use turnstile_core::{
    CheckpointPhase, ConversationId, Error, Namespace, RequestId, Revision, RunId, StoreAdmin,
};

use crate::activity::SharedAdmin;
use crate::support::{
    admit, commit_answer, complete_request, new_conversation, new_request, ns, recover, tool_call,
    tool_turn, Snapshot, TestResult,
};

/// Times are milliseconds: lets the clock move past the last write's, so
/// "newest first" and "finished before now" have one answer.
async fn tick() {
    tokio::time::sleep(Duration::from_millis(20)).await;
}

fn other_ns() -> Namespace {
    Namespace::new("conformance-other").expect("valid namespace")
}

/// The usual `stale_after`: nothing in these tests waits that long.
const PATIENT: Duration = Duration::from_secs(300);

/// Three conversations, created in this order with time between every
/// step:
/// - `c1` in [`ns`]: `r1` committed after one tool turn; `r2` active, one
///   tool turn by run `r2a`, then recovered by run `r2b`;
/// - `c2` in [`ns`]: `r3` committed, no tool turn;
/// - `o1` in [`other_ns`]: `r4` active.
struct Listed {
    c1: ConversationId,
    c2: ConversationId,
    o1: ConversationId,
    r1: Fence,
    r2a: Fence,
    r2b: Fence,
    r3: Fence,
    r4: Fence,
}

async fn listed(store: &dyn StoreAdmin) -> Result<Listed, Error> {
    let c1 = new_conversation(store).await?;
    tick().await;
    let (r1, _) = complete_request(store, c1, "one", 1, "answer one").await?;
    tick().await;
    let r2a = admit(store, c1, "two").await?;
    tool_turn(store, &r2a, 1, 1, tool_call("call-1", "{}"), "result").await?;
    tick().await;
    let r2b = recover(store, &r2a).await?;
    tick().await;
    let c2 = new_conversation(store).await?;
    tick().await;
    let (r3, _) = complete_request(store, c2, "three", 0, "answer three").await?;
    tick().await;
    let o1 = ConversationId::new();
    store.ensure_conversation(&other_ns(), o1).await?;
    tick().await;
    let r4 = admit(store, o1, "four").await?;
    Ok(Listed {
        c1,
        c2,
        o1,
        r1,
        r2a,
        r2b,
        r3,
        r4,
    })
}

fn filter() -> ListFilter {
    ListFilter {
        stale_after: PATIENT,
        ..ListFilter::default()
    }
}

async fn conversation_ids(
    store: &dyn StoreAdmin,
    filter: ListFilter,
) -> Result<Vec<ConversationId>, Error> {
    let listed = store.list_conversations(&filter).await?;
    Ok(listed.into_iter().map(|c| c.id).collect())
}

async fn request_ids(store: &dyn StoreAdmin, filter: ListFilter) -> Result<Vec<RequestId>, Error> {
    let listed = store.list_requests(&filter).await?;
    Ok(listed.into_iter().map(|r| r.request_id).collect())
}

async fn run_ids(store: &dyn StoreAdmin, filter: ListFilter) -> Result<Vec<RunId>, Error> {
    let listed = store.list_runs(&filter).await?;
    Ok(listed.into_iter().map(|r| r.run_id).collect())
}

pub async fn conversation_listing_is_newest_first_filtered_and_limited(
    store: SharedAdmin,
) -> TestResult {
    let l = listed(&*store).await?;
    let all = conversation_ids(&*store, filter()).await?;
    assert_eq!(all, [l.o1, l.c2, l.c1]);
    let of_ns = ListFilter {
        namespace: Some(ns()),
        ..filter()
    };
    assert_eq!(
        conversation_ids(&*store, of_ns.clone()).await?,
        [l.c2, l.c1]
    );
    let of_other = ListFilter {
        namespace: Some(other_ns()),
        ..filter()
    };
    assert_eq!(conversation_ids(&*store, of_other.clone()).await?, [l.o1]);
    let of_c1 = ListFilter {
        conversation_id: Some(l.c1),
        ..filter()
    };
    assert_eq!(conversation_ids(&*store, of_c1.clone()).await?, [l.c1]);
    // Both filters hold: c1 is not in the other namespace.
    let c1_elsewhere = ListFilter {
        namespace: Some(other_ns()),
        ..of_c1.clone()
    };
    assert!(conversation_ids(&*store, c1_elsewhere).await?.is_empty());
    for (limit, expected) in [(1, vec![l.o1]), (2, vec![l.o1, l.c2])] {
        let limited = ListFilter { limit, ..filter() };
        assert_eq!(conversation_ids(&*store, limited).await?, expected);
    }
    let limited = ListFilter { limit: 1, ..of_ns };
    assert_eq!(conversation_ids(&*store, limited).await?, [l.c2]);

    // What each shows.
    let listed = store.list_conversations(&filter()).await?;
    let (o1, c2, c1) = (&listed[0], &listed[1], &listed[2]);
    assert_eq!((&c1.namespace, &o1.namespace), (&ns(), &other_ns()));
    // c1: r1 committed 4 entries (claim, commit), r2 claimed and recovered.
    assert_eq!(
        (c1.version, c1.revision, c1.transcript_entries),
        (1, Revision(4), 4)
    );
    let held = c1.held.as_ref().expect("r2 holds c1");
    assert_eq!(held.conversation_id, l.c1);
    assert_eq!(
        (held.request_id, held.run_id, held.revision),
        (l.r2b.request_id, l.r2b.run_id, l.r2b.revision)
    );
    assert_eq!(held.run_status, Some(RunStatus::Running));
    assert!(!held.stuck, "a running owner active just now is not stuck");
    let mark = held.last_checkpoint.as_ref().expect("seeded checkpoint");
    assert_eq!((mark.turn, mark.phase), (1, CheckpointPhase::Ready));
    assert!(c1.last_activity_at >= c1.created_at);
    assert_eq!(
        (c2.version, c2.revision, c2.transcript_entries),
        (1, Revision(2), 2)
    );
    assert_eq!(c2.held, None);
    assert_eq!(
        (o1.version, o1.revision, o1.transcript_entries),
        (0, Revision(1), 0)
    );
    assert_eq!(
        o1.held.as_ref().map(|h| (h.request_id, h.run_id)),
        Some((l.r4.request_id, l.r4.run_id))
    );
    Ok(())
}

pub async fn request_listing_is_newest_first_filtered_and_limited(
    store: SharedAdmin,
) -> TestResult {
    let l = listed(&*store).await?;
    let (r1, r2, r3, r4) = (
        l.r1.request_id,
        l.r2a.request_id,
        l.r3.request_id,
        l.r4.request_id,
    );
    assert_eq!(request_ids(&*store, filter()).await?, [r4, r3, r2, r1]);
    let of_ns = ListFilter {
        namespace: Some(ns()),
        ..filter()
    };
    assert_eq!(request_ids(&*store, of_ns).await?, [r3, r2, r1]);
    let of_other = ListFilter {
        namespace: Some(other_ns()),
        ..filter()
    };
    assert_eq!(request_ids(&*store, of_other).await?, [r4]);
    let of_c1 = ListFilter {
        conversation_id: Some(l.c1),
        ..filter()
    };
    assert_eq!(request_ids(&*store, of_c1.clone()).await?, [r2, r1]);
    let c1_limited = ListFilter { limit: 1, ..of_c1 };
    assert_eq!(request_ids(&*store, c1_limited).await?, [r2]);
    let limited = ListFilter {
        limit: 2,
        ..filter()
    };
    assert_eq!(request_ids(&*store, limited).await?, [r4, r3]);

    let listed = store.list_requests(&filter()).await?;
    let (active, committed) = (&listed[2], &listed[3]);
    assert_eq!(
        (committed.conversation_id, &committed.namespace),
        (l.c1, &ns())
    );
    assert_eq!(committed.status, RequestStatus::Completed);
    assert_eq!(committed.conversation_version, Some(1));
    assert_eq!(committed.runs, 1);
    assert_eq!(
        (committed.latest_run, committed.latest_run_status),
        (Some(l.r1.run_id), Some(RunStatus::Completed))
    );
    let mark = committed.last_checkpoint.as_ref().expect("checkpoint");
    assert_eq!((mark.turn, mark.phase), (2, CheckpointPhase::Completed));
    assert!(committed.completed_at.is_some());
    assert_eq!(committed.held, None);

    assert_eq!(active.status, RequestStatus::Active);
    assert_eq!(active.conversation_version, None);
    assert_eq!(active.runs, 2, "the recovery added a run");
    assert_eq!(
        (active.latest_run, active.latest_run_status),
        (Some(l.r2b.run_id), Some(RunStatus::Running))
    );
    assert_eq!(active.completed_at, None);
    assert_eq!(
        active.held.as_ref().map(|h| (h.run_id, h.revision)),
        Some((l.r2b.run_id, l.r2b.revision))
    );
    Ok(())
}

pub async fn run_listing_is_newest_first_filtered_and_limited(store: SharedAdmin) -> TestResult {
    let l = listed(&*store).await?;
    let (r1, r2a, r2b, r3, r4) = (
        l.r1.run_id,
        l.r2a.run_id,
        l.r2b.run_id,
        l.r3.run_id,
        l.r4.run_id,
    );
    assert_eq!(run_ids(&*store, filter()).await?, [r4, r3, r2b, r2a, r1]);
    let of_c1 = ListFilter {
        conversation_id: Some(l.c1),
        ..filter()
    };
    assert_eq!(run_ids(&*store, of_c1.clone()).await?, [r2b, r2a, r1]);
    let c1_limited = ListFilter { limit: 2, ..of_c1 };
    assert_eq!(run_ids(&*store, c1_limited).await?, [r2b, r2a]);
    let of_ns = ListFilter {
        namespace: Some(ns()),
        ..filter()
    };
    assert_eq!(run_ids(&*store, of_ns).await?, [r3, r2b, r2a, r1]);
    let of_other = ListFilter {
        namespace: Some(other_ns()),
        ..filter()
    };
    assert_eq!(run_ids(&*store, of_other).await?, [r4]);
    let limited = ListFilter {
        limit: 3,
        ..filter()
    };
    assert_eq!(run_ids(&*store, limited).await?, [r4, r3, r2b]);

    let listed = store.list_runs(&filter()).await?;
    let (new, old, committed) = (&listed[2], &listed[3], &listed[4]);
    assert_eq!(
        (new.request_id, new.conversation_id, &new.namespace),
        (l.r2b.request_id, l.c1, &ns())
    );
    assert_eq!(
        (new.status, new.resumed_from, new.checkpoints),
        (RunStatus::Running, Some(r2a), 1)
    );
    assert_eq!(new.held.as_ref().map(|h| h.run_id), Some(r2b));
    assert_eq!(new.ended_at, None);
    assert_eq!(
        (old.status, old.resumed_from, old.checkpoints),
        (RunStatus::Superseded, None, 1)
    );
    assert_eq!(old.held, None, "a replaced run holds nothing");
    assert_eq!(
        (
            committed.status,
            committed.checkpoints,
            committed.error.as_deref()
        ),
        (RunStatus::Completed, 2, None)
    );
    let mark = committed.last_checkpoint.as_ref().expect("checkpoint");
    assert_eq!((mark.turn, mark.phase), (2, CheckpointPhase::Completed));
    assert!(committed.ended_at.is_some());
    Ok(())
}

pub async fn summaries_of_unknown_ids_are_none_and_of_known_ones_match_the_listings(
    store: SharedAdmin,
) -> TestResult {
    let l = listed(&*store).await?;
    assert_eq!(
        store
            .conversation_summary(ConversationId::new(), PATIENT)
            .await?,
        None
    );
    assert_eq!(store.run_summary(RunId::new(), PATIENT).await?, None);

    let listed = store.list_conversations(&filter()).await?;
    for conversation in &listed {
        let one = store.conversation_summary(conversation.id, PATIENT).await?;
        assert_eq!(one.as_ref(), Some(conversation));
    }
    // In any namespace.
    let o1 = store.conversation_summary(l.o1, PATIENT).await?;
    assert_eq!(o1.map(|c| c.namespace), Some(other_ns()));
    let runs = store.list_runs(&filter()).await?;
    assert_eq!(runs.len(), 5);
    for run in &runs {
        let one = store.run_summary(run.run_id, PATIENT).await?;
        assert_eq!(one.as_ref(), Some(run));
    }
    let r2a = store
        .run_summary(l.r2a.run_id, PATIENT)
        .await?
        .expect("run");
    assert_eq!((r2a.status, r2a.held), (RunStatus::Superseded, None));
    Ok(())
}

pub async fn stuck_only_lists_a_failed_owner_and_a_running_one_only_once_stale(
    store: SharedAdmin,
) -> TestResult {
    let running_conv = new_conversation(&*store).await?;
    let running = admit(&*store, running_conv, "running").await?;
    tick().await;
    let failed_conv = new_conversation(&*store).await?;
    let failed = admit(&*store, failed_conv, "failed").await?;
    store.fail_run(&failed, "model unavailable", None).await?;
    tick().await;
    let idle_conv = new_conversation(&*store).await?;
    complete_request(&*store, idle_conv, "done", 0, "answer").await?;

    let stuck = |stale_after| ListFilter {
        stuck_only: true,
        stale_after,
        ..ListFilter::default()
    };
    // A failed owner is stuck at once; a running one is not.
    assert_eq!(
        conversation_ids(&*store, stuck(PATIENT)).await?,
        [failed_conv]
    );
    assert_eq!(
        request_ids(&*store, stuck(PATIENT)).await?,
        [failed.request_id]
    );
    assert_eq!(run_ids(&*store, stuck(PATIENT)).await?, [failed.run_id]);
    let listed = store.list_conversations(&stuck(PATIENT)).await?;
    let held = listed[0].held.as_ref().expect("held");
    assert_eq!(
        (held.run_id, held.run_status, held.stuck),
        (failed.run_id, Some(RunStatus::Failed), true)
    );
    let failed_run = store.run_summary(failed.run_id, PATIENT).await?;
    let failed_run = failed_run.expect("run");
    assert_eq!(
        (failed_run.status, failed_run.error.as_deref()),
        (RunStatus::Failed, Some("model unavailable"))
    );
    let live = store.conversation_summary(running_conv, PATIENT).await?;
    let live = live.expect("conversation").held.expect("held");
    assert_eq!(
        (live.run_status, live.stuck),
        (Some(RunStatus::Running), false)
    );

    // Once the running owner has left its admission alone for longer than
    // `stale_after`, it is stuck too, and the stalest comes first.
    tokio::time::sleep(Duration::from_millis(120)).await;
    let stale = Duration::from_millis(60);
    assert_eq!(
        conversation_ids(&*store, stuck(stale)).await?,
        [running_conv, failed_conv]
    );
    assert_eq!(
        request_ids(&*store, stuck(stale)).await?,
        [running.request_id, failed.request_id]
    );
    assert_eq!(
        run_ids(&*store, stuck(stale)).await?,
        [running.run_id, failed.run_id]
    );
    let now_stuck = store.conversation_summary(running_conv, stale).await?;
    assert!(now_stuck.expect("conversation").held.expect("held").stuck);
    let run = store
        .run_summary(running.run_id, stale)
        .await?
        .expect("run");
    assert!(run.held.expect("held").stuck);
    // Filters and the limit hold for stuck listings too.
    let first = ListFilter {
        limit: 1,
        ..stuck(stale)
    };
    assert_eq!(conversation_ids(&*store, first).await?, [running_conv]);
    let one = ListFilter {
        conversation_id: Some(failed_conv),
        ..stuck(stale)
    };
    assert_eq!(
        request_ids(&*store, one.clone()).await?,
        [failed.request_id]
    );
    assert_eq!(run_ids(&*store, one).await?, [failed.run_id]);
    let elsewhere = ListFilter {
        namespace: Some(other_ns()),
        ..stuck(stale)
    };
    assert!(conversation_ids(&*store, elsewhere).await?.is_empty());
    Ok(())
}

pub async fn doctor_on_a_healthy_store_reports_integrity_and_admission_counts(
    store: SharedAdmin,
) -> TestResult {
    let counts = |report: &turnstile_core::admin::DoctorReport| {
        (report.held_admissions, report.stuck_admissions)
    };
    let report = store.doctor(PATIENT).await?;
    assert_eq!(
        report.integrity_ok,
        Some(true),
        "integrity: {:?}",
        report.integrity
    );
    assert_eq!(report.integrity, ["ok"]);
    assert!(report.errors.is_empty(), "errors: {:?}", report.errors);
    assert!(report.supported_schema_version > 0);
    assert_eq!(report.schema_version, Some(report.supported_schema_version));
    assert_eq!(counts(&report), (Some(0), Some(0)));

    let running = admit(&*store, new_conversation(&*store).await?, "running").await?;
    let failed = admit(&*store, new_conversation(&*store).await?, "failed").await?;
    store.fail_run(&failed, "tool crashed", None).await?;
    complete_request(&*store, new_conversation(&*store).await?, "idle", 0, "done").await?;
    let report = store.doctor(PATIENT).await?;
    assert_eq!(report.integrity_ok, Some(true));
    assert_eq!(report.cannot_open, None);
    assert_eq!(counts(&report), (Some(2), Some(1)));

    commit_answer(&*store, &running, 1, 1, "answer").await?;
    assert_eq!(counts(&store.doctor(PATIENT).await?), (Some(1), Some(1)));
    store
        .abandon(failed.conversation_id, failed.request_id, failed.revision)
        .await?;
    let report = store.doctor(PATIENT).await?;
    assert_eq!(counts(&report), (Some(0), Some(0)));
    assert!(report.integrity_ok == Some(true) && report.errors.is_empty());
    Ok(())
}

/// `len` bytes of text no compression shrinks much.
fn incompressible(len: usize, seed: u64) -> String {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            char::from(b'!' + ((state >> 33) % 90) as u8)
        })
        .collect()
}

pub async fn storage_reports_bytes_in_use_that_grow_with_commits(store: SharedAdmin) -> TestResult {
    let empty = store.storage().await?;
    assert!(empty.bytes_in_use > 0, "a store with its schema uses bytes");
    let conversation = new_conversation(&*store).await?;
    let payload = 256 * 1024;
    complete_request(&*store, conversation, "q1", 0, &incompressible(payload, 1)).await?;
    let one = store.storage().await?;
    assert!(
        one.bytes_in_use >= empty.bytes_in_use + payload as u64 / 2,
        "a {payload}-byte answer: {} -> {} bytes in use",
        empty.bytes_in_use,
        one.bytes_in_use
    );
    complete_request(&*store, conversation, "q2", 0, &incompressible(payload, 2)).await?;
    let two = store.storage().await?;
    assert!(
        two.bytes_in_use >= one.bytes_in_use + payload as u64 / 2,
        "a second {payload}-byte answer: {} -> {} bytes in use",
        one.bytes_in_use,
        two.bytes_in_use
    );
    Ok(())
}

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
/// checkpoint, `a2`'s checkpoints of turns 1 (seeded) and 2, and the two
/// journal rows.
fn completed_prunable() -> TableCounts {
    TableCounts {
        runs: 1,
        loop_checkpoints: 3,
        tool_calls: 2,
        ..TableCounts::default()
    }
}

/// Everything of the abandoned request but its row: run `b`, its
/// checkpoint, its journal row, its three pending messages (input, model
/// answer, tool result) and its turn's verification report.
fn abandoned_prunable() -> TableCounts {
    TableCounts {
        runs: 1,
        loop_checkpoints: 1,
        tool_calls: 1,
        run_messages: 3,
        verification_reports: 1,
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
    // journal rows; the abandoned request's 3 pending messages. The held
    // conversation's committed request has nothing to spare.
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
    assert_eq!(held_after, held_before, "a held conversation is kept whole");
    assert!(held_after.requests[0]
        .as_ref()
        .is_some_and(|r| r.outcome.is_some()));
    Ok(())
}
