// A binary of its own: it counts the store's retries with a global tracing subscriber.
//! Two OS processes, 32 tokio tasks each, racing every kind of ownership
//! change on the same few conversations of one PostgreSQL database (a
//! schema of its own on the test server): fresh claims (through the
//! `Store` trait and through `AgentSession::stream`), recovery claims
//! (`Store::claim_recovery` and `AgentSession::recover_after_owner_exit`),
//! abandons (both layers) and commits of live owners, while the losers'
//! owners keep writing. The SQLite `crates/turnstile/tests/it/races.rs` (two
//! processes of 64 tasks on one WAL file) is the model; only the store, the
//! inspection and the transient-failure accounting differ.
//!
//! The second process is this test binary re-run with `--ignored --exact`,
//! the name of `worker_process` and [`ENV_URL`] set; it prints its results
//! on stdout (`RACE …` lines) and the parent merges them with its own. The
//! race and its checks are `turnstile_testkit::race`, shared with the
//! SQLite races; this file connects the stores, reads the schema back and
//! accounts for the store's retries.
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
//!   version and the request rows in the database;
//! - every loser gets one of the typed errors its operation documents (Busy,
//!   Conflict, Fenced, NotActive, AmbiguousCheckpoint, RequestAbandoned, or a
//!   replay of a request completed in between); nothing else reaches a caller
//!   — in particular no store error, and none of a transient kind
//!   (serialization failure, deadlock, dropped connection): those are
//!   counted apart, and must be zero.
//!
//! The regression test at the end ports the SQLite one: a recoverer
//! overtaken before reading its messages is fenced.

use std::ffi::OsStr;
use std::sync::Arc;

use turnstile::{ConversationId, Error, PostgresOptions, PostgresStore, Store};
use turnstile_test_postgres::Server;
use turnstile_testkit::postgres::durability;
use turnstile_testkit::race::{self, Facts, TestResult};
use turnstile_testkit::worker_test;

/// Racing tasks per process.
const TASKS: usize = 32;

const ENV_URL: &str = "TURNSTILE_RACES_URL";
const SCHEMA: &str = "races";

/// The store of both processes: a schema of the test's own database.
async fn connect(url: &str) -> Result<PostgresStore, Error> {
    PostgresStore::connect_with(PostgresOptions {
        schema: Some(SCHEMA.into()),
        ..PostgresOptions::new(url)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_of_32_tasks_win_each_admission_revision_exactly_once() -> TestResult {
    let retries = durability::count_retries_everywhere();
    let url = Server::shared().fresh_database();
    let pool = durability::inspect_pool(&url, SCHEMA);
    let deadlocks_before = deadlocks(&pool).await?;
    let store: Arc<dyn Store> = Arc::new(connect(&url).await?);
    let outcome = race::race(
        store.clone(),
        &worker_test!(worker_process),
        TASKS,
        (ENV_URL, OsStr::new(&url)),
        &["deadlock", "could not serialize", "terminating connection"],
    )
    .await?;

    let worker_retries: u64 = outcome
        .out
        .lines()
        .find_map(|l| l.split_once("RACE retries ").map(|(_, n)| n.trim().parse()))
        .transpose()?
        .unwrap_or(0);
    println!(
        "races: store retries absorbed: parent {} ({:?}), worker {worker_retries}; deadlocks \
         the server detected: {}",
        retries.count(),
        retries.causes(4),
        deadlocks(&pool).await? - deadlocks_before
    );
    outcome.assert_callers();

    outcome
        .assert_conversations(&*store, |conversation| facts(&pool, conversation))
        .await?;
    pool.close().await;
    Ok(())
}

/// The second process. Does nothing unless started by the test above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the second process of two_processes_of_32_tasks_win_each_admission_revision_exactly_once"]
async fn worker_process() -> TestResult {
    let Ok(url) = std::env::var(ENV_URL) else {
        return Ok(());
    };
    let retries = durability::count_retries_everywhere();
    let store: Arc<dyn Store> = Arc::new(connect(&url).await?);
    let tally = race::race_in_worker(store, TASKS).await?;
    race::report(&tally, &[format!("RACE retries {}", retries.count())])?;
    Ok(())
}

/// Deadlocks the server detected in the database so far (the store retries
/// them; none should reach a caller).
async fn deadlocks(pool: &sqlx::PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        .fetch_one(pool)
        .await
}

/// A conversation's rows in the schema.
async fn facts(pool: &sqlx::PgPool, conversation: ConversationId) -> sqlx::Result<Facts> {
    let bind = conversation.as_uuid();
    let revision = sqlx::query_scalar("SELECT revision FROM admissions WHERE conversation_id = $1")
        .bind(bind)
        .fetch_one(pool)
        .await?;
    let version =
        sqlx::query_scalar("SELECT version FROM conversations WHERE conversation_id = $1")
            .bind(bind)
            .fetch_one(pool)
            .await?;
    let statuses = sqlx::query_as(
        "SELECT status, COUNT(*) FROM requests WHERE conversation_id = $1 GROUP BY status",
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

/// The SQLite suite's regression, on PostgreSQL: a recoverer overtaken
/// right after its claim — another recoverer takes the request over and
/// commits it before the first one has read the request's messages — must
/// get `Error::Fenced` (on SQLite it once got `Error::Corrupt`). A store that
/// pauses the loser there makes the narrow window certain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recoverer_overtaken_before_reading_its_messages_is_fenced() -> TestResult {
    let url = Server::shared().fresh_database();
    let store: Arc<dyn Store> = Arc::new(connect(&url).await?);
    race::a_recoverer_overtaken_before_reading_its_messages_is_fenced(store).await
}
