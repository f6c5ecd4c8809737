//! `schema.sql` beside this crate's `Cargo.toml` is the current schema:
//! every table, index and invariant trigger as a freshly migrated database
//! holds them (the durable steps are in `src/steps/`). This test fails when
//! the two drift apart; `TURNSTILE_BLESS_SCHEMA=1 cargo test -p
//! turnstile-sqlite schema_sql` writes the file anew after a migration.

use std::path::Path;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::ConnectOptions;

use crate::SqliteStore;

const HEADER: &str = "\
-- The current schema of a turnstile SQLite database, as a freshly migrated
-- database holds it (written by the test `schema_sql`; do not edit by hand).
-- Migrations under migrations/ change it; the durable steps, views with
-- their INSTEAD OF triggers, are installed from src/steps/ when a store opens.
";

#[tokio::test]
async fn schema_sql_matches_a_freshly_migrated_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("schema.db");
    let store = SqliteStore::open(&path).await.unwrap();
    store.close().await.unwrap();
    drop(store);
    let mut conn = SqliteConnectOptions::new()
        .filename(&path)
        .connect()
        .await
        .unwrap();
    // In creation order; the steps' views and their triggers excluded, and
    // SQLite's and sqlx's own bookkeeping.
    let statements: Vec<String> = sqlx::query_scalar(
        "SELECT sql FROM sqlite_master
         WHERE sql IS NOT NULL AND type <> 'view' AND name NOT LIKE 'sqlite_%'
           AND name <> '_sqlx_migrations'
           AND tbl_name NOT IN (SELECT name FROM sqlite_master WHERE type = 'view')
         ORDER BY rowid",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let mut dumped = HEADER.to_owned();
    for statement in statements {
        dumped.push('\n');
        dumped.push_str(&statement);
        dumped.push_str(";\n");
    }

    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("schema.sql");
    if std::env::var_os("TURNSTILE_BLESS_SCHEMA").is_some() {
        std::fs::write(&file, &dumped).unwrap();
    }
    let checked_in = std::fs::read_to_string(&file).unwrap_or_default();
    assert!(
        checked_in == dumped,
        "{} differs from a freshly migrated database; if the migration is meant, write it \
         anew with TURNSTILE_BLESS_SCHEMA=1 cargo test -p turnstile-sqlite --lib schema_sql \
         and review the diff",
        file.display()
    );
}
