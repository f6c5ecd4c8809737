//! Stores on the PostgreSQL test server: one database per test process, a
//! schema of its own per test (created by the store), so tests never see
//! each other's rows and a test costs no `CREATE DATABASE`; and what the
//! durability tests inspect ([`durability`]).

pub mod durability;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use turnstile::{PostgresOptions, PostgresStore};
use turnstile_test_postgres::Server;

/// The URL of this test process's database on the shared server.
pub fn database_url() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| Server::shared().fresh_database())
}

/// A schema name no other test of this process uses.
pub fn fresh_schema() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("t{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Options for a store in a fresh schema of this process's database.
pub fn fresh_options() -> PostgresOptions {
    PostgresOptions {
        schema: Some(fresh_schema()),
        pool_size: 8,
        ..PostgresOptions::new(database_url())
    }
}

/// A store in a fresh schema.
pub async fn fresh_store() -> PostgresStore {
    PostgresStore::connect_with(fresh_options())
        .await
        .expect("connect to the test server")
}
