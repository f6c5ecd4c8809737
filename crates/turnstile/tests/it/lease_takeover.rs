//! Lease-based takeover across real processes on a SQLite WAL file: see
//! `turnstile_testkit::lease` for the scenario.

use std::sync::Arc;

use turnstile::{SqliteStore, StoreAdmin};
use turnstile_testkit::lease;
use turnstile_testkit::worker_test;

async fn open(path: String) -> Arc<dyn StoreAdmin> {
    Arc::new(SqliteStore::open(&path).await.unwrap())
}

#[tokio::test]
#[ignore = "child process of the lease takeover test"]
async fn lease_worker() {
    lease::worker(open).await;
}

#[tokio::test]
async fn a_worker_frozen_past_its_lease_is_taken_over_and_fenced_when_it_wakes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("leases.db");
    lease::frozen_worker_is_taken_over_and_fenced(
        &worker_test!(lease_worker),
        db.to_string_lossy().into_owned(),
        dir.path(),
        open,
    )
    .await;
}
