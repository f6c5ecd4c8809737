//! Racing ownership changes: exactly one compare-and-swap wins.

use std::sync::Arc;

use tokio::sync::Barrier;
use turnstile_core::store::{ClaimOutcome, RunStatus};
use turnstile_core::{Error, Revision};

use crate::support::{admit, new_conversation, new_request, recovery_of, SharedStore, TestResult};

const TASKS: usize = 32;

pub async fn concurrent_claims_at_one_revision_admit_exactly_one(store: SharedStore) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let start = Arc::new(Barrier::new(TASKS));
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let (store, start) = (store.clone(), start.clone());
            let claim = new_request(conversation, Revision(0), &format!("racer {i}"));
            tokio::spawn(async move {
                start.wait().await;
                (claim.request_id, store.claim(&claim).await)
            })
        })
        .collect();

    let mut winners = Vec::new();
    let mut losers = Vec::new();
    for task in tasks {
        let (request_id, result) = task.await?;
        match result {
            Ok(ClaimOutcome::Admitted(fence)) => winners.push(fence),
            Ok(ClaimOutcome::Existing(record)) => panic!("fresh id reported existing: {record:?}"),
            Err(e @ (Error::Busy { .. } | Error::Conflict { .. })) => losers.push((request_id, e)),
            Err(e) => panic!("claim failed with neither Busy nor Conflict: {e}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one claim wins");
    let winner = winners[0];
    assert_eq!(winner.revision, Revision(1));
    for (request_id, error) in &losers {
        if let Error::Busy {
            request_id: holder, ..
        } = error
        {
            assert_eq!(*holder, winner.request_id);
        }
        assert_eq!(store.request(*request_id).await?, None, "loser wrote a row");
    }
    let admission = store.admission(conversation).await?;
    assert_eq!(admission.revision, Revision(1));
    assert_eq!(
        admission.active.map(|a| a.request_id),
        Some(winner.request_id)
    );
    Ok(())
}

pub async fn concurrent_recovery_claims_at_one_revision_admit_exactly_one(
    store: SharedStore,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let stalled = admit(&*store, conversation, "hello").await?;
    let start = Arc::new(Barrier::new(TASKS));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (store, start) = (store.clone(), start.clone());
            let claim = recovery_of(&stalled);
            tokio::spawn(async move {
                start.wait().await;
                (claim.new_run, store.claim_recovery(&claim).await)
            })
        })
        .collect();

    let mut winners = Vec::new();
    for task in tasks {
        let (new_run, result) = task.await?;
        match result {
            Ok(fence) => winners.push(fence),
            Err(Error::Conflict { .. } | Error::Busy { .. }) => {
                assert_eq!(store.run(new_run).await?, None, "loser wrote a run");
            }
            Err(e) => panic!("recovery failed with neither Conflict nor Busy: {e}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one recovery wins");
    let winner = winners[0];
    assert_eq!(winner.revision, Revision(2));
    let admission = store.admission(conversation).await?;
    assert_eq!(admission.revision, Revision(2));
    assert_eq!(admission.active.map(|a| a.run_id), Some(winner.run_id));
    let old = store.run(stalled.run_id).await?.expect("old run");
    assert_eq!(old.status, RunStatus::Superseded);
    Ok(())
}
