//! Retention as a policy of the admin contract, and a background task that
//! applies it on a timer.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{PruneOptions, PruneReport, StoreAdmin};
use crate::store::RequestStatus;

/// What a store keeps. Each age is counted from when a request finished
/// (committed or abandoned) or, for a conversation, from its last activity;
/// `None` keeps that kind forever. What a replay needs is always kept (see
/// [`StoreAdmin::prune`]), active requests are never touched, and the
/// newest `keep_last_requests` requests of each conversation are spared
/// whatever their age.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Committed requests finished longer ago than this are pruned;
    /// `None` keeps them.
    pub completed_older_than: Option<Duration>,
    /// Abandoned requests finished longer ago than this are pruned;
    /// `None` keeps them.
    pub abandoned_older_than: Option<Duration>,
    /// The newest requests of each conversation spared whatever their age.
    pub keep_last_requests: u32,
    /// Idle conversations (no active request) last active longer ago than
    /// this are deleted whole, their request ids forgotten.
    pub idle_conversations_older_than: Option<Duration>,
}

impl RetentionPolicy {
    /// The prune passes that apply the policy, in order: conversations
    /// first, so their requests are not counted twice.
    pub fn passes(&self) -> Vec<PruneOptions> {
        let mut passes = Vec::new();
        if let Some(age) = self.idle_conversations_older_than {
            passes.push(PruneOptions {
                // No request is that old: this pass only deletes
                // conversations.
                older_than: Duration::MAX,
                include_transcripts: true,
                conversations_older_than: Some(age),
                ..PruneOptions::older_than(Duration::MAX)
            });
        }
        let by_status = [
            (RequestStatus::Completed, self.completed_older_than),
            (RequestStatus::Abandoned, self.abandoned_older_than),
        ];
        for (status, age) in by_status {
            if let Some(age) = age {
                passes.push(PruneOptions {
                    status: Some(status),
                    keep_last_requests: self.keep_last_requests,
                    ..PruneOptions::older_than(age)
                });
            }
        }
        passes
    }
}

/// What one application of a [`RetentionPolicy`] did: one report per pass,
/// in the order of [`RetentionPolicy::passes`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RetentionReport {
    /// One report per pass, in order.
    pub passes: Vec<PruneReport>,
}

impl RetentionReport {
    /// Rows deleted by every pass.
    pub fn rows_deleted(&self) -> u64 {
        self.passes.iter().map(|p| p.deleted.total()).sum()
    }
}

/// The outcome of the latest pass of a [`Retention`] task: its report, or
/// what went wrong (the task goes on at the next tick).
pub type RetentionOutcome = Result<RetentionReport, String>;

/// A background task that applies a [`RetentionPolicy`] every `every`,
/// started and stopped by the host. Dropping it stops it too (between two
/// batches: each batch is one transaction).
pub struct Retention {
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
    latest: watch::Receiver<Option<RetentionOutcome>>,
}

impl Retention {
    /// Starts applying `policy` to `store` now and then every `every`
    /// (from the end of one application to the start of the next). Needs
    /// a Tokio runtime.
    pub fn spawn(store: Arc<dyn StoreAdmin>, policy: RetentionPolicy, every: Duration) -> Self {
        let stop = CancellationToken::new();
        let (report, latest) = watch::channel(None);
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                loop {
                    let outcome = tokio::select! {
                        _ = stop.cancelled() => return,
                        outcome = store.apply_retention(&policy) => outcome,
                    };
                    if let Err(e) = &outcome {
                        tracing::warn!(error = %e, "retention pass failed");
                    }
                    report.send_replace(Some(outcome.map_err(|e| e.to_string())));
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(every) => {}
                    }
                }
            }
        });
        Self {
            stop,
            task: Some(task),
            latest,
        }
    }

    /// The latest application's outcome; `None` before the first ends.
    pub fn latest(&self) -> Option<RetentionOutcome> {
        self.latest.borrow().clone()
    }

    /// Waits until an application ends after this call, and returns its
    /// outcome (`None` if the task stopped first).
    pub async fn next(&mut self) -> Option<RetentionOutcome> {
        self.latest.borrow_and_update();
        self.latest.changed().await.ok()?;
        self.latest.borrow().clone()
    }

    /// Stops the task and waits for it: a batch in progress is dropped
    /// (rolled back whole), the batches before it stay.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Retention {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
