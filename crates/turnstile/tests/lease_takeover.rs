//! Lease-based takeover across real processes on a SQLite WAL file: see
//! `lease_support` for the scenario.

mod lease_support;

use std::sync::Arc;

use turnstile::{SqliteStore, StoreAdmin};

async fn open(path: String) -> Arc<dyn StoreAdmin> {
    Arc::new(SqliteStore::open(&path).await.unwrap())
}

#[tokio::test]
#[ignore = "child process of the lease takeover test"]
async fn lease_worker() {
    lease_support::worker(open).await;
}

#[tokio::test]
async fn a_worker_frozen_past_its_lease_is_taken_over_and_fenced_when_it_wakes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("leases.db");
    lease_support::frozen_worker_is_taken_over_and_fenced(
        db.to_string_lossy().into_owned(),
        dir.path(),
        open,
    )
    .await;
}
