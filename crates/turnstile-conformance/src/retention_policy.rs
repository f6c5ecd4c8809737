//! Retention as a policy of the admin contract: each request status at its
//! own age, the newest requests of each conversation spared, idle
//! conversations deleted whole, and the background task that applies it.

use std::time::Duration;

use turnstile_core::admin::{PruneOptions, Retention, RetentionPolicy};
use turnstile_core::store::RequestStatus;
use turnstile_core::{ConversationId, Error, RequestId, StoreAdmin};

use crate::activity::SharedAdmin;
use crate::admin::tick;
use crate::support::{
    admit, complete_request, new_conversation, ns, tool_call, tool_turn, TestResult,
};

/// Completes `n` one-tool-turn requests on `conversation`, oldest first.
async fn completed(
    store: &dyn StoreAdmin,
    conversation: ConversationId,
    n: usize,
) -> Result<Vec<RequestId>, Error> {
    let mut ids = Vec::new();
    for i in 0..n {
        let (fence, _) = complete_request(store, conversation, &format!("q{i}"), 1, "a").await?;
        ids.push(fence.request_id);
        // Distinct creation times, so "newest" is well defined.
        tick().await;
    }
    Ok(ids)
}

/// Whether the request's tool journal is still there (prune deletes it).
async fn journaled(store: &dyn StoreAdmin, request: RequestId) -> Result<bool, Error> {
    Ok(!store.journal(request, 1).await?.is_empty())
}

pub async fn keep_last_requests_spares_the_newest_requests_of_each_conversation(
    store: SharedAdmin,
) -> TestResult {
    let (a, b) = (
        new_conversation(&*store).await?,
        new_conversation(&*store).await?,
    );
    let of_a = completed(&*store, a, 4).await?;
    let of_b = completed(&*store, b, 1).await?;
    let transcript = store.transcript_window(a, u32::MAX).await?;
    tick().await;

    let report = store
        .prune(&PruneOptions {
            keep_last_requests: 2,
            ..PruneOptions::older_than(Duration::ZERO)
        })
        .await?;
    assert_eq!(report.deleted.tool_calls, 2, "{report:?}");
    assert_eq!(report.requests_examined, 2);
    for (request, kept) in [
        (of_a[0], false),
        (of_a[1], false),
        (of_a[2], true),
        (of_a[3], true),
        (of_b[0], true),
    ] {
        assert_eq!(journaled(&*store, request).await?, kept, "{request}");
        let record = store
            .request(request)
            .await?
            .expect("the request row stays");
        assert!(record.outcome.is_some(), "a pruned request still replays");
    }
    assert_eq!(store.transcript_window(a, u32::MAX).await?, transcript);
    Ok(())
}

/// A request that holds the admission counts among the newest N: it is
/// one of the conversation's requests, even though prune never touches it.
pub async fn keep_last_requests_counts_a_held_request_among_the_newest(
    store: SharedAdmin,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let finished = completed(&*store, conversation, 2).await?;
    let held = admit(&*store, conversation, "held").await?;
    tool_turn(&*store, &held, 1, 1, tool_call("call-1", "{}"), "r").await?;
    tick().await;

    let report = store
        .prune(&PruneOptions {
            keep_last_requests: 2,
            ..PruneOptions::older_than(Duration::ZERO)
        })
        .await?;
    assert_eq!(report.requests_examined, 1, "{report:?}");
    assert!(
        !journaled(&*store, finished[0]).await?,
        "the third newest is pruned"
    );
    assert!(
        journaled(&*store, finished[1]).await?,
        "the second newest is spared, after the held one"
    );
    assert!(
        journaled(&*store, held.request_id).await?,
        "held, untouched"
    );
    Ok(())
}

pub async fn a_retention_policy_prunes_each_status_at_its_own_age_and_idle_conversations_whole(
    store: SharedAdmin,
) -> TestResult {
    let busy = new_conversation(&*store).await?;
    let kept = completed(&*store, busy, 1).await?[0];
    let abandoned = admit(&*store, busy, "abandoned").await?;
    tool_turn(&*store, &abandoned, 1, 1, tool_call("call-1", "{}"), "r").await?;
    store
        .abandon(busy, abandoned.request_id, abandoned.revision)
        .await?;
    let idle = new_conversation(&*store).await?;
    let idle_request = completed(&*store, idle, 1).await?[0];
    let held = new_conversation(&*store).await?;
    let active = admit(&*store, held, "active").await?;
    tool_turn(&*store, &active, 1, 1, tool_call("call-1", "{}"), "r").await?;
    tick().await;

    // Completed requests at once; abandoned ones and conversations kept.
    let policy = RetentionPolicy {
        completed_older_than: Some(Duration::ZERO),
        ..RetentionPolicy::default()
    };
    let report = store.apply_retention(&policy).await?;
    assert_eq!(report.passes.len(), 1);
    assert!(!journaled(&*store, kept).await?);
    assert!(!journaled(&*store, idle_request).await?);
    assert!(
        journaled(&*store, abandoned.request_id).await?,
        "abandoned kept"
    );
    assert_eq!(
        store
            .request_messages(abandoned.request_id, u64::MAX)
            .await?
            .len(),
        3
    );

    // Abandoned at their age (an hour: not yet), then at once.
    let policy = RetentionPolicy {
        abandoned_older_than: Some(Duration::from_secs(3600)),
        ..RetentionPolicy::default()
    };
    assert_eq!(store.apply_retention(&policy).await?.rows_deleted(), 0);
    let policy = RetentionPolicy {
        abandoned_older_than: Some(Duration::ZERO),
        ..RetentionPolicy::default()
    };
    store.apply_retention(&policy).await?;
    assert!(!journaled(&*store, abandoned.request_id).await?);
    let record = store
        .request(abandoned.request_id)
        .await?
        .expect("row kept");
    assert_eq!(
        record.status,
        RequestStatus::Abandoned,
        "its id stays burned"
    );

    // Idle conversations whole; the held one untouched.
    let held_before = store.journal(active.request_id, 1).await?;
    let policy = RetentionPolicy {
        idle_conversations_older_than: Some(Duration::ZERO),
        ..RetentionPolicy::default()
    };
    let report = store.apply_retention(&policy).await?;
    assert_eq!(report.passes[0].deleted.conversations, 2, "{report:?}");
    for gone in [busy, idle] {
        assert!(matches!(
            store.conversation(&ns(), gone).await,
            Err(Error::NotFound { .. })
        ));
    }
    assert_eq!(store.request(kept).await?, None, "its id is forgotten");
    assert_eq!(store.journal(active.request_id, 1).await?, held_before);
    let admission = store.admission(held).await?;
    assert_eq!(
        admission.active.map(|a| a.request_id),
        Some(active.request_id)
    );
    Ok(())
}

pub async fn the_retention_task_applies_its_policy_on_a_timer_until_stopped(
    store: SharedAdmin,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let first = completed(&*store, conversation, 1).await?[0];
    let policy = RetentionPolicy {
        completed_older_than: Some(Duration::ZERO),
        ..RetentionPolicy::default()
    };
    let mut task = Retention::spawn(store.clone(), policy, Duration::from_millis(20));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while journaled(&*store, first).await? {
        assert!(tokio::time::Instant::now() < deadline, "never pruned");
        task.next()
            .await
            .expect("the task runs")
            .expect("a clean pass");
    }
    // A request finished later is pruned by a later tick.
    let second = completed(&*store, conversation, 1).await?[0];
    while journaled(&*store, second).await? {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not pruned by a later tick"
        );
        task.next()
            .await
            .expect("the task runs")
            .expect("a clean pass");
    }
    assert!(task.latest().is_some_and(|outcome| outcome.is_ok()));
    task.stop().await;

    // Stopped: nothing more is pruned.
    let third = completed(&*store, conversation, 1).await?[0];
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(journaled(&*store, third).await?);
    Ok(())
}
