//! Two OS processes, 64 tokio tasks each, racing every kind of ownership
//! change on the same few conversations of one WAL SQLite file: fresh
//! claims (through the `Store` trait and through `AgentSession::stream`),
//! recovery claims (`Store::claim_recovery` and
//! `AgentSession::recover_after_owner_exit`), abandons (both layers) and
//! commits of live owners, while the losers' owners keep writing.
//!
//! The second process is this test binary re-run with `--ignored --exact`,
//! the name of `worker_process` and [`ENV_DB`] set; it prints its results
//! on stdout (`RACE …` lines) and the parent merges them with its own. The
//! race and its checks are `turnstile_testkit::race`, shared with the
//! PostgreSQL races; this file opens the stores and reads the file back.
//!
//! What must hold:
//! - every successful ownership change is reported with the revision it
//!   produced, and over both processes each revision of a conversation is
//!   won exactly once: the winners' revisions are exactly `1..=final`, the
//!   final revision read from the database;
//! - in revision order, the winners' changes follow the admission state
//!   machine (a fresh claim only from idle; recovery, commit and abandon only
//!   from held), and the final state matches the last winner;
//! - commits and abandons counted by the winners match the conversation
//!   version and the request rows in the file;
//! - every loser gets one of the typed errors its operation documents (Busy,
//!   Conflict, Fenced, NotActive, AmbiguousCheckpoint, RequestAbandoned, or a
//!   replay of a request completed in between); nothing else reaches a caller
//!   — in particular no store error and no "database is locked".
//!
//! `a_recoverer_overtaken_before_reading_its_messages_is_fenced` pins down,
//! with a store that pauses the loser, a bug in that last guarantee whose
//! window is too narrow for the race to hit reliably: an overtaken recoverer
//! got `Corrupt` instead of `Fenced` (fixed).

use std::sync::Arc;
use std::time::Duration;

use turnstile::{ConversationId, SqliteStore, Store};
use turnstile_testkit::race::{self, Facts, TestResult};
use turnstile_testkit::worker_test;

/// Racing tasks per process.
const TASKS: usize = 64;

const ENV_DB: &str = "TURNSTILE_RACES_DB";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_of_64_tasks_win_each_admission_revision_exactly_once() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("races.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).await?);
    let outcome = race::race(
        store.clone(),
        &worker_test!(worker_process),
        TASKS,
        (ENV_DB, path.as_os_str()),
        &["database is locked"],
    )
    .await?;
    outcome.assert_callers();

    let pool = raw_pool(&path).await?;
    outcome
        .assert_conversations(&*store, |conversation| facts(&pool, conversation))
        .await?;
    pool.close().await;
    Ok(())
}

/// The second process. Does nothing unless started by the test above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the second process of two_processes_of_64_tasks_win_each_admission_revision_exactly_once"]
async fn worker_process() -> TestResult {
    let Ok(path) = std::env::var(ENV_DB) else {
        return Ok(());
    };
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).await?);
    let tally = race::race_in_worker(store, TASKS).await?;
    race::report(&tally, &[])?;
    Ok(())
}

/// A plain sqlx pool on the file, outside turnstile, for inspection.
async fn raw_pool(path: &std::path::Path) -> Result<sqlx::SqlitePool, sqlx::Error> {
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .read_only(true)
        .busy_timeout(Duration::from_secs(30));
    sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
}

/// A conversation's rows in the file.
async fn facts(pool: &sqlx::SqlitePool, conversation: ConversationId) -> sqlx::Result<Facts> {
    let bind = conversation.as_uuid();
    let revision = sqlx::query_scalar("SELECT revision FROM admissions WHERE conversation_id = ?1")
        .bind(bind)
        .fetch_one(pool)
        .await?;
    let version = sqlx::query_scalar("SELECT version FROM conversations WHERE id = ?1")
        .bind(bind)
        .fetch_one(pool)
        .await?;
    let statuses = sqlx::query_as(
        "SELECT status, COUNT(*) FROM requests WHERE conversation_id = ?1 GROUP BY status",
    )
    .bind(bind)
    .fetch_all(pool)
    .await?;
    Ok(Facts {
        revision,
        version,
        statuses,
    })
}

/// Regression (found by this suite): a recoverer overtaken right after
/// its claim — another recoverer takes the request over and commits it before
/// the first one has read the request's messages — gets `Error::Corrupt`
/// ("expected N messages, found 0": the commit moved them to the transcript)
/// instead of `Error::Fenced`. The database is fine; the loser is told it is
/// damaged. The window is narrow, so a store that pauses the loser there
/// makes it certain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recoverer_overtaken_before_reading_its_messages_is_fenced() -> TestResult {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::in_memory().await?);
    race::a_recoverer_overtaken_before_reading_its_messages_is_fenced(store).await
}
