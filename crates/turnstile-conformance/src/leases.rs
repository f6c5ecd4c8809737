//! Opt-in leases: a renewal is fenced and moves neither the revision nor
//! the activity time; every change of owner drops the lease; the expired
//! listing holds only expired leases of running owners; stuck detection
//! goes by the lease when there is one.

use std::time::Duration;

use turnstile_core::admin::ListFilter;
use turnstile_core::backend::now_ms;
use turnstile_core::store::ExpiredLease;
use turnstile_core::{ConversationId, Error, StoreAdmin};

use crate::activity::SharedAdmin;
use crate::admin::tick;
use crate::support::{admit, commit_answer, new_conversation, ns, recover, TestResult};

/// Far enough ahead that no test outlives it.
const LATER_MS: i64 = 600_000;

/// The lease of a conversation's held admission, as the listings show it.
async fn lease_of(store: &dyn StoreAdmin, id: ConversationId) -> Result<Option<i64>, Error> {
    let summary = store
        .conversation_summary(id, Duration::from_secs(300))
        .await?;
    Ok(summary
        .and_then(|s| s.held)
        .and_then(|held| held.lease_expires_at))
}

pub async fn a_renewal_sets_the_lease_and_moves_neither_the_revision_nor_the_activity_time(
    store: SharedAdmin,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let fence = admit(&*store, conversation, "leased").await?;
    assert_eq!(lease_of(&*store, conversation).await?, None);
    let before = store
        .conversation_summary(conversation, Duration::from_secs(300))
        .await?
        .expect("conversation");
    tick().await;

    let expires_at = now_ms() + LATER_MS;
    store.renew_lease(&fence, expires_at).await?;
    // Renewed again, later: the newest renewal counts.
    store.renew_lease(&fence, expires_at + 1).await?;

    let after = store
        .conversation_summary(conversation, Duration::from_secs(300))
        .await?
        .expect("conversation");
    let held = after.held.expect("held");
    assert_eq!(held.lease_expires_at, Some(expires_at + 1));
    assert_eq!(held.revision, fence.revision);
    assert_eq!(
        store.admission(conversation).await?.revision,
        fence.revision
    );
    assert_eq!(after.last_activity_at, before.last_activity_at);
    // The owner's fence still holds: it commits.
    commit_answer(&*store, &fence, 1, 1, "answer").await?;
    Ok(())
}

pub async fn a_renewal_by_a_replaced_or_finished_owner_is_fenced_and_writes_nothing(
    store: SharedAdmin,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let old = admit(&*store, conversation, "taken over").await?;
    store.renew_lease(&old, now_ms() + LATER_MS).await?;
    let new = recover(&*store, &old).await?;

    let refused = store.renew_lease(&old, now_ms() + 2 * LATER_MS).await;
    assert!(
        matches!(refused, Err(Error::Fenced { run_id, revision })
            if run_id == old.run_id && revision == old.revision),
        "{refused:?}"
    );
    // The recovery dropped the old owner's lease and the refusal set none.
    assert_eq!(lease_of(&*store, conversation).await?, None);
    assert_eq!(store.admission(conversation).await?.revision, new.revision);

    let expires_at = now_ms() + LATER_MS;
    store.renew_lease(&new, expires_at).await?;
    assert_eq!(lease_of(&*store, conversation).await?, Some(expires_at));

    commit_answer(&*store, &new, 1, 1, "answer").await?;
    let after_commit = store.renew_lease(&new, now_ms() + LATER_MS).await;
    assert!(
        matches!(after_commit, Err(Error::Fenced { .. })),
        "{after_commit:?}"
    );
    assert!(store.admission(conversation).await?.active.is_none());
    Ok(())
}

pub async fn expired_leases_lists_only_expired_leases_of_running_owners_soonest_first(
    store: SharedAdmin,
) -> TestResult {
    let now = now_ms();
    let mut expired = Vec::new();
    for (input, expires_at) in [("second", now - 500), ("first", now - 1_000)] {
        let conversation = new_conversation(&*store).await?;
        let fence = admit(&*store, conversation, input).await?;
        store.renew_lease(&fence, expires_at).await?;
        expired.push((fence, expires_at));
    }
    // Not listed: a live lease, no lease, a failed owner, a committed
    // request, an abandoned one.
    let live = admit(&*store, new_conversation(&*store).await?, "live").await?;
    store.renew_lease(&live, now + LATER_MS).await?;
    admit(&*store, new_conversation(&*store).await?, "no lease").await?;
    let failed = admit(&*store, new_conversation(&*store).await?, "failed").await?;
    store.renew_lease(&failed, now - 1_000).await?;
    store.fail_run(&failed, "model unavailable", None).await?;
    let committed = admit(&*store, new_conversation(&*store).await?, "committed").await?;
    store.renew_lease(&committed, now - 1_000).await?;
    commit_answer(&*store, &committed, 1, 1, "answer").await?;
    let abandoned = admit(&*store, new_conversation(&*store).await?, "abandoned").await?;
    store.renew_lease(&abandoned, now - 1_000).await?;
    store
        .abandon(
            abandoned.conversation_id,
            abandoned.request_id,
            abandoned.revision,
        )
        .await?;

    let listed = store.expired_leases(10).await?;
    let want: Vec<ExpiredLease> = expired
        .iter()
        .rev()
        .map(|(fence, expires_at)| ExpiredLease {
            conversation_id: fence.conversation_id,
            namespace: ns(),
            request_id: fence.request_id,
            run_id: fence.run_id,
            revision: fence.revision,
            lease_expires_at: *expires_at,
        })
        .collect();
    assert_eq!(listed, want);
    assert_eq!(store.expired_leases(1).await?, want[..1]);

    // The store reads its own clock: a lease that expires shortly is not
    // listed before its time, and is (last) once that has passed.
    let soon = admit(&*store, new_conversation(&*store).await?, "soon").await?;
    let soon_expires_at = now_ms() + 400;
    store.renew_lease(&soon, soon_expires_at).await?;
    assert_eq!(store.expired_leases(10).await?, want);
    while now_ms() <= soon_expires_at {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let later = store.expired_leases(10).await?;
    assert_eq!(later[..2], want[..]);
    assert_eq!(
        later[2..]
            .iter()
            .map(|l| (l.request_id, l.lease_expires_at))
            .collect::<Vec<_>>(),
        [(soon.request_id, soon_expires_at)]
    );
    Ok(())
}

pub async fn stuck_goes_by_the_lease_when_the_owner_holds_one(store: SharedAdmin) -> TestResult {
    let renewed_conv = new_conversation(&*store).await?;
    let renewed = admit(&*store, renewed_conv, "renewed").await?;
    store.renew_lease(&renewed, now_ms() + LATER_MS).await?;
    let lapsed_conv = new_conversation(&*store).await?;
    let lapsed = admit(&*store, lapsed_conv, "lapsed").await?;
    store.renew_lease(&lapsed, now_ms() - 1).await?;
    let plain_conv = new_conversation(&*store).await?;
    admit(&*store, plain_conv, "no lease").await?;
    tokio::time::sleep(Duration::from_millis(120)).await;

    let stuck = |stale_after| ListFilter {
        stuck_only: true,
        stale_after,
        ..ListFilter::default()
    };
    let ids = |filter| {
        let store = store.clone();
        async move {
            let listed = store.list_conversations(&filter).await?;
            Ok::<_, Error>(
                listed
                    .conversations
                    .into_iter()
                    .map(|c| c.id)
                    .collect::<Vec<_>>(),
            )
        }
    };
    // Patient: only the expired lease is stuck, though its activity is fresh.
    assert_eq!(ids(stuck(Duration::from_secs(300))).await?, [lapsed_conv]);
    // Impatient: the owner without a lease is stale; the renewed one is not.
    let mut impatient = ids(stuck(Duration::from_millis(60))).await?;
    impatient.sort();
    let mut want = vec![lapsed_conv, plain_conv];
    want.sort();
    assert_eq!(impatient, want);

    let held = store
        .conversation_summary(renewed_conv, Duration::from_millis(60))
        .await?
        .and_then(|s| s.held)
        .expect("held");
    assert!(!held.stuck);
    let requests = store
        .list_requests(&stuck(Duration::from_secs(300)))
        .await?;
    assert_eq!(
        requests.iter().map(|r| r.request_id).collect::<Vec<_>>(),
        [lapsed.request_id]
    );
    let runs = store.list_runs(&stuck(Duration::from_secs(300))).await?;
    assert_eq!(
        runs.iter().map(|r| r.run_id).collect::<Vec<_>>(),
        [lapsed.run_id]
    );
    let report = store.doctor(Duration::from_secs(300)).await?;
    assert_eq!(
        (report.held_admissions, report.stuck_admissions),
        (Some(3), Some(1))
    );
    let report = store.doctor(Duration::from_millis(60)).await?;
    assert_eq!(
        (report.held_admissions, report.stuck_admissions),
        (Some(3), Some(2))
    );
    Ok(())
}

pub async fn a_recovery_claim_a_commit_and_an_abandon_each_drop_the_lease(
    store: SharedAdmin,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let first = admit(&*store, conversation, "recovered").await?;
    store.renew_lease(&first, now_ms() + LATER_MS).await?;
    let second = recover(&*store, &first).await?;
    assert_eq!(lease_of(&*store, conversation).await?, None);

    // A commit releases with the lease: the next request starts without one.
    store.renew_lease(&second, now_ms() + LATER_MS).await?;
    commit_answer(&*store, &second, 1, 1, "answer").await?;
    let next = admit(&*store, conversation, "next").await?;
    assert_eq!(lease_of(&*store, conversation).await?, None);

    store.renew_lease(&next, now_ms() + LATER_MS).await?;
    store
        .abandon(conversation, next.request_id, next.revision)
        .await?;
    admit(&*store, conversation, "after abandon").await?;
    assert_eq!(lease_of(&*store, conversation).await?, None);
    Ok(())
}
