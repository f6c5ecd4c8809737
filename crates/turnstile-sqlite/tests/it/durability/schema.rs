//! A database written by a newer schema is refused and never modified.

use std::path::Path;

use sha2::{Digest, Sha256};
use sqlx::migrate::Migrator;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};
use sqlx::{ConnectOptions, Connection};
use turnstile::{Error, SqliteStore};

use turnstile_conformance::support::TestResult;

fn file_hash(path: &Path) -> std::io::Result<[u8; 32]> {
    Ok(Sha256::digest(std::fs::read(path)?).into())
}

/// Builds, without turnstile, the database a newer turnstile would leave:
/// today's schema plus one applied migration this build does not know.
/// The connection is closed, so the file holds everything and no WAL
/// remains.
async fn future_database(path: &Path, journal: SqliteJournalMode) -> TestResult {
    let mut conn = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(journal)
        .connect()
        .await?;
    let migrations = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    Migrator::new(migrations).await?.run(&mut conn).await?;
    let future = SqliteStore::supported_schema_version() + 1;
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES (?1, 'from the future', TRUE, x'00', 1)",
    )
    .bind(future)
    .execute(&mut conn)
    .await?;
    conn.close().await?;
    assert!(!path.with_extension("db-wal").exists(), "WAL left behind");
    Ok(())
}

async fn assert_refused_untouched(path: &Path) -> TestResult {
    let before = file_hash(path)?;
    match SqliteStore::open(path).await {
        Err(Error::SchemaTooNew { found, supported }) => {
            assert_eq!(supported, SqliteStore::supported_schema_version());
            assert_eq!(found, supported + 1);
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    assert_eq!(file_hash(path)?, before, "refused database was modified");
    Ok(())
}

#[tokio::test]
async fn wal_database_from_a_newer_schema_is_refused_and_left_byte_identical() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("future.db");
    future_database(&path, SqliteJournalMode::Wal).await?;
    assert_refused_untouched(&path).await
}

#[tokio::test]
async fn rollback_journal_database_from_a_newer_schema_is_refused_and_left_byte_identical(
) -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("future.db");
    future_database(&path, SqliteJournalMode::Delete).await?;
    assert_refused_untouched(&path).await
}

#[tokio::test]
async fn database_at_the_supported_schema_opens() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("current.db");
    drop(SqliteStore::open(&path).await?);
    // Reopening a database this build created is not "too new".
    SqliteStore::open(&path).await?;
    assert!(SqliteStore::supported_schema_version() >= 1);
    Ok(())
}

/// A migration the database disagrees with (its recorded checksum changed)
/// is no race with another opener: the open fails at once, not marked busy
/// (which would tell the caller to retry later), and changes nothing.
#[tokio::test]
async fn a_migration_the_database_disagrees_with_is_refused_and_not_called_busy() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("tampered.db");
    SqliteStore::open(&path).await?.close().await?;
    let pool = super::raw_pool(&path).await?;
    sqlx::query("UPDATE _sqlx_migrations SET checksum = X'00' WHERE version = 1")
        .execute(&pool)
        .await?;
    pool.close().await;
    match SqliteStore::open(&path).await {
        Err(Error::Store(e)) => assert!(!e.is_busy(), "marked busy: {e}"),
        other => panic!("expected a store error, got {other:?}"),
    }
    Ok(())
}

/// The event log is written by triggers on the step tables: a later
/// migration that rebuilds one of those tables drops its triggers with it,
/// and this fails until the migration makes them again.
#[tokio::test]
async fn every_event_log_trigger_is_in_place_after_the_migrations() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("events.db");
    SqliteStore::open(&path).await?.close().await?;
    let mut conn = SqliteConnectOptions::new()
        .filename(&path)
        .connect()
        .await?;
    let triggers: Vec<(String, String)> = sqlx::query_as(
        "SELECT name, tbl_name FROM sqlite_master
         WHERE type = 'trigger' AND name LIKE 'event\\_%' ESCAPE '\\' ORDER BY name",
    )
    .fetch_all(&mut conn)
    .await?;
    let expected = [
        ("event_answered", "transcript"),
        ("event_approval_decided", "approvals"),
        ("event_approval_requested", "approvals"),
        ("event_first_run_stopped", "requests"),
        ("event_run_started", "runs"),
        ("event_run_stopped", "runs"),
        ("event_settled", "requests"),
        ("event_tool_finished", "tool_calls"),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(name, table)| (name.to_string(), table.to_string()))
        .collect();
    assert_eq!(triggers, expected);
    conn.close().await?;
    Ok(())
}
