//! Crash torture: worker processes drive eight conversations concurrently on
//! one SQLite file (WAL, `synchronous=FULL`) and are killed with SIGKILL at
//! seeded random moments, again and again; each next worker recovers every
//! held admission (`recover_after_owner_exit` with
//! `RetryInterruptedTurn`) and goes on with the remaining requests; a last
//! worker, never killed, finishes everything.
//!
//! After every kill the parent reopens the file (read-only, so the next
//! worker still opens the crashed file itself), runs `PRAGMA
//! integrity_check`, and reads the tool-call journal and the side-effect
//! log. At the end every conversation must hold exactly what a crash-free
//! run of the same seeded plan commits on `SqliteStore::in_memory()`; no
//! journaled tool call may have run again; and every request's usage must be
//! the sum of one recorded model answer per turn.
//!
//! `TURNSTILE_TORTURE_KILLS` (default 50) and `TURNSTILE_TORTURE_SEED`
//! (default fixed, decimal or `0x` hex) choose the kill count and the seed;
//! the seed decides the plan and the kill moments (the moments are timers,
//! so what a kill interrupts still varies from run to run).
//!
//! The workers are this test binary, re-run with `--ignored --exact` and
//! the name of `torture_worker`. Every worker traces its steps to stdout
//! (see `turnstile_testkit::torture`), which tells the parent where each
//! kill landed. The torture itself is `turnstile_testkit::torture::kills`,
//! shared with the PostgreSQL one; this file says how to open, read and
//! check a SQLite file.
#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection, SqliteConnection};
use turnstile::{SqliteStore, Store};
use turnstile_testkit::torture::checks::Reference;
use turnstile_testkit::torture::kills::{self, Backend, Stats, Tables};
use turnstile_testkit::torture::Plan;
use turnstile_testkit::worker_test;

/// Kills land up to this long after the worker says it is ready.
const MAX_KILL_DELAY_MS: u64 = 150;
const DB: &str = "torture.db";

/// The child: recovers every held request of the plan and runs the rest,
/// eight conversations at once, until it is killed or done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child process of the crash torture test"]
async fn torture_worker() {
    kills::work(|dir: PathBuf| SqliteStore::open(dir.join(DB))).await;
}

#[test]
fn sigkilled_workers_on_eight_conversations_commit_exactly_what_a_crash_free_run_commits() {
    kills::torture(&worker_test!(torture_worker), || Sqlite);
}

/// The torture's database: one file in the test's directory, read by the
/// parent through read-only connections of its own.
struct Sqlite;

/// A read-only connection: no checkpoint of the WAL happens through it, so
/// the next worker opens the file as the crash left it.
async fn read_only(dir: &Path) -> SqliteConnection {
    SqliteConnectOptions::new()
        .filename(dir.join(DB))
        .read_only(true)
        .connect()
        .await
        .expect("open the database read-only")
}

#[turnstile::async_trait]
impl Backend for Sqlite {
    const NAME: &'static str = "crash torture";
    const MAX_KILL_DELAY_MS: u64 = MAX_KILL_DELAY_MS;
    const CHECKS: &'static str = "integrity checks (all ok)";

    fn worker_env(&self) -> Vec<(&'static str, String)> {
        // The file is in the directory every worker is told.
        Vec::new()
    }

    async fn settle(&self) -> Option<Duration> {
        // Nothing outlives a SQLite worker.
        None
    }

    async fn read(&self, dir: &Path) -> Tables {
        if !dir.join(DB).exists() {
            // Killed before it created the file.
            return Tables::default();
        }
        let mut conn = read_only(dir).await;
        let integrity: Vec<String> = sqlx::query_scalar("PRAGMA integrity_check")
            .fetch_all(&mut conn)
            .await
            .expect("integrity check");
        let mut tables = Tables {
            broken: if integrity == ["ok"] {
                Vec::new()
            } else {
                vec![format!("PRAGMA integrity_check: {integrity:?}")]
            },
            checked: true,
            ..Tables::default()
        };
        let has_schema: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'tool_calls'",
        )
        .fetch_one(&mut conn)
        .await
        .expect("read the schema");
        if has_schema == 1 {
            tables.journal =
                sqlx::query_as("SELECT request_id, turn, call_id, status FROM tool_calls")
                    .fetch_all(&mut conn)
                    .await
                    .expect("read the tool-call journal");
            tables.requests = sqlx::query_as("SELECT request_id, status FROM requests")
                .fetch_all(&mut conn)
                .await
                .expect("read the requests");
            // Each held admission's usage (what `recovery_usage` reports)
            // and the usage of its run's latest checkpoint.
            tables.held = sqlx::query_as(
                "SELECT a.active_request_id,
                        a.input_tokens, a.output_tokens,
                        a.cache_read_tokens, a.cache_write_tokens,
                        c.input_tokens, c.output_tokens,
                        c.cache_read_tokens, c.cache_write_tokens
                 FROM admissions a
                 LEFT JOIN all_checkpoints c ON c.run_id = a.run_id
                     AND c.turn = (SELECT MAX(turn) FROM all_checkpoints WHERE run_id = a.run_id)
                 WHERE a.active_request_id IS NOT NULL",
            )
            .fetch_all(&mut conn)
            .await
            .expect("read the admissions");
        }
        conn.close().await.expect("close the read-only connection");
        tables
    }

    async fn reference_store(&self) -> Arc<dyn Store> {
        Arc::new(SqliteStore::in_memory().await.expect("in-memory store"))
    }

    async fn final_checks(
        &self,
        dir: &Path,
        plan: &Plan,
        reference: &Reference,
        stats: &mut Stats,
    ) -> usize {
        let store = Arc::new(SqliteStore::open(dir.join(DB)).await.expect("reopen"));
        let mut conn = read_only(dir).await;
        let rows: Vec<(uuid::Uuid, uuid::Uuid)> =
            sqlx::query_as("SELECT request_id, run_id FROM all_runs")
                .fetch_all(&mut conn)
                .await
                .expect("list runs");
        conn.close().await.expect("close");
        let runs = kills::runs_by_request(rows);
        kills::final_checks(store, &runs, dir, plan, reference, stats).await
    }
}
