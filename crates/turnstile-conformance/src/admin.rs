//! The operations on a store ([`StoreAdmin`]): listings newest first,
//! filtered and limited; what stuck admissions hold; health and storage
//! figures. Retention is in `retention.rs`.

use std::time::Duration;

use turnstile_core::admin::ListFilter;
use turnstile_core::store::{Fence, RequestStatus, RunStatus};
use turnstile_core::{
    CheckpointPhase, ConversationId, Error, Namespace, RequestId, Revision, RunId, StoreAdmin,
};

use crate::activity::SharedAdmin;
use crate::support::{
    admit, commit_answer, complete_request, new_conversation, ns, recover, tool_call, tool_turn,
    TestResult,
};

/// Times are milliseconds: lets the clock move past the last write's, so
/// "newest first" and "finished before now" have one answer.
pub(crate) async fn tick() {
    tokio::time::sleep(Duration::from_millis(20)).await;
}

fn other_ns() -> Namespace {
    Namespace::new("conformance-other").expect("valid namespace")
}

/// The usual `stale_after`: nothing in these tests waits that long.
pub(crate) const PATIENT: Duration = Duration::from_secs(300);

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

pub(crate) fn filter() -> ListFilter {
    ListFilter {
        stale_after: PATIENT,
        ..ListFilter::default()
    }
}

pub(crate) async fn conversation_ids(
    store: &dyn StoreAdmin,
    filter: ListFilter,
) -> Result<Vec<ConversationId>, Error> {
    let listed = store.list_conversations(&filter).await?.conversations;
    Ok(listed.into_iter().map(|c| c.id).collect())
}

pub(crate) async fn request_ids(
    store: &dyn StoreAdmin,
    filter: ListFilter,
) -> Result<Vec<RequestId>, Error> {
    let listed = store.list_requests(&filter).await?;
    Ok(listed.into_iter().map(|r| r.request_id).collect())
}

pub(crate) async fn run_ids(
    store: &dyn StoreAdmin,
    filter: ListFilter,
) -> Result<Vec<RunId>, Error> {
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
    let listed = store.list_conversations(&filter()).await?.conversations;
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

    let listed = store.list_conversations(&filter()).await?.conversations;
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
    let listed = store
        .list_conversations(&stuck(PATIENT))
        .await?
        .conversations;
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
    assert!(
        report.not_checked.is_empty(),
        "not checked: {:?}",
        report.not_checked
    );
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
    assert!(report.integrity_ok == Some(true) && report.not_checked.is_empty());
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
