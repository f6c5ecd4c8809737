//! Lease-based takeover across real processes on PostgreSQL: see
//! `turnstile_testkit::lease` for the scenario. The child connects to the parent's
//! schema on the test server.

use std::sync::Arc;

use turnstile::{PostgresOptions, PostgresStore, StoreAdmin};
use turnstile_testkit::postgres::fresh_options;
use turnstile_testkit::{lease, worker_test};

/// `location` is `URL SCHEMA`.
async fn open(location: String) -> Arc<dyn StoreAdmin> {
    let (url, schema) = location.split_once(' ').expect("url and schema");
    let options = PostgresOptions {
        schema: Some(schema.to_owned()),
        ..PostgresOptions::new(url)
    };
    Arc::new(PostgresStore::connect_with(options).await.unwrap())
}

#[tokio::test]
#[ignore = "child process of the lease takeover test"]
async fn lease_worker() {
    lease::worker(open).await;
}

#[tokio::test]
async fn a_worker_frozen_past_its_lease_is_taken_over_and_fenced_when_it_wakes() {
    let dir = tempfile::tempdir().unwrap();
    let options = fresh_options();
    let schema = options.schema.expect("a fresh schema");
    lease::frozen_worker_is_taken_over_and_fenced(
        &worker_test!(lease_worker),
        format!("{} {schema}", options.url),
        dir.path(),
        open,
    )
    .await;
}
