//! Crash torture on PostgreSQL: worker processes drive eight conversations
//! concurrently on one database (a schema of its own on the test server)
//! and are killed with SIGKILL at seeded random moments, again and again;
//! each next worker recovers every held admission
//! (`recover_after_owner_exit` with `RetryInterruptedTurn`) and goes on with
//! the remaining requests; a last worker, never killed, finishes everything.
//!
//! The torture is the SQLite one's (the facade's `crash_torture` test):
//! the plan, the scripted model, the effect tools, the kills, the checks
//! after every kill and at the end are `turnstile_testkit::torture` (its
//! `kills` module); this file says how to reach, read and check the
//! database. On PostgreSQL the server outlives the worker: after every
//! kill the parent waits until the server has ended every backend of the
//! dead worker (a commit it had sent finishes or rolls back first), then
//! reads the schema in one snapshot through a pool of its own: the
//! consistency rules of `durability::consistency_violations` (PostgreSQL's
//! stand-in for SQLite's integrity check), the tool-call journal, the
//! requests and the held admissions, and the side-effect log. At the end
//! every conversation must hold exactly what a crash-free run of the same
//! seeded plan commits on `SqliteStore::in_memory()`; no journaled tool call
//! may have run again; and every request's usage must be the sum of one
//! recorded model answer per turn.
//!
//! `TURNSTILE_TORTURE_KILLS` (default 50) and `TURNSTILE_TORTURE_SEED`
//! (default fixed, decimal or `0x` hex) choose the kill count and the seed.
//!
//! The workers are this test binary, re-run with `--ignored --exact` and
//! the name of `torture_worker`, told the database by environment (they
//! never start a server of their own).
#![cfg(unix)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::{Connection, PgPool};
use turnstile::{PostgresOptions, PostgresStore, Store};
use turnstile_test_postgres::Server;
use turnstile_testkit::postgres::durability;
use turnstile_testkit::torture::checks::Reference;
use turnstile_testkit::torture::kills::{self, Backend, Stats, Tables};
use turnstile_testkit::torture::Plan;
use turnstile_testkit::worker_test;

/// Kills land up to this long after the worker says it is ready.
const MAX_KILL_DELAY_MS: u64 = 300;
const SCHEMA: &str = "torture";
/// Where a worker finds the database.
const ENV_URL: &str = "TORTURE_URL";

/// The store every worker opens, and the parent for its final checks.
fn options(url: &str) -> PostgresOptions {
    PostgresOptions {
        schema: Some(SCHEMA.into()),
        pool_size: 8,
        ..PostgresOptions::new(url)
    }
}

/// The child: recovers every held request of the plan and runs the rest,
/// eight conversations at once, until it is killed or done. Does nothing
/// unless started by the test below.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child process of the crash torture test"]
async fn torture_worker() {
    let Ok(url) = std::env::var(ENV_URL) else {
        return;
    };
    kills::work(|_| PostgresStore::connect_with(options(&url))).await;
}

#[test]
fn sigkilled_workers_on_eight_conversations_commit_exactly_what_a_crash_free_run_commits() {
    kills::torture(&worker_test!(torture_worker), || {
        let url = Server::shared().fresh_database();
        let pool = durability::inspect_pool(&url, SCHEMA);
        Postgres { url, pool }
    });
}

/// The torture's database, and the parent's inspection pool on it.
struct Postgres {
    url: String,
    pool: PgPool,
}

#[turnstile::async_trait]
impl Backend for Postgres {
    const NAME: &'static str = "crash torture (PostgreSQL)";
    const MAX_KILL_DELAY_MS: u64 = MAX_KILL_DELAY_MS;
    const CHECKS: &'static str = "consistency checks (all rules held)";

    fn worker_env(&self) -> Vec<(&'static str, String)> {
        vec![(ENV_URL, self.url.clone())]
    }

    /// Waits until the server has ended every backend of the dead worker
    /// (turnstile's connections are named `turnstile`): a statement it was
    /// running, a commit included, has then finished or rolled back, so the
    /// snapshot that follows is what the kill left.
    async fn settle(&self) -> Option<Duration> {
        let started = Instant::now();
        loop {
            let left: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = 'turnstile'",
            )
            .fetch_one(&self.pool)
            .await
            .expect("read pg_stat_activity");
            if left == 0 {
                return Some(started.elapsed());
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{left} backends of a killed worker still open after 20 s"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Reads everything in one repeatable-read transaction: one snapshot.
    async fn read(&self, _dir: &Path) -> Tables {
        let mut tables = Tables::default();
        let mut conn = self.pool.acquire().await.expect("an inspection connection");
        let mut tx = conn.begin().await.expect("begin");
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .execute(&mut *tx)
            .await
            .expect("repeatable read");
        let has_schema: bool = sqlx::query_scalar(
            "SELECT to_regclass('tool_calls') IS NOT NULL AND to_regclass('admissions') IS NOT NULL",
        )
        .fetch_one(&mut *tx)
        .await
        .expect("read the schema");
        if !has_schema {
            // Killed before the first migration committed.
            return tables;
        }
        tables.broken = durability::consistency_violations(&mut tx).await;
        tables.checked = true;
        let calls: Vec<(uuid::Uuid, i64, Vec<u8>, String)> =
            sqlx::query_as("SELECT request_id, turn, call_id, status FROM tool_calls")
                .fetch_all(&mut *tx)
                .await
                .expect("read the tool-call journal");
        tables.journal = calls
            .into_iter()
            .map(|(request, turn, call, status)| {
                let call = String::from_utf8(call).expect("a UTF-8 call id");
                (request, turn, call, status)
            })
            .collect();
        tables.requests = sqlx::query_as("SELECT request_id, status FROM requests")
            .fetch_all(&mut *tx)
            .await
            .expect("read the requests");
        // Each held admission's usage (what `recovery_usage` reports) and
        // the usage of its run's latest checkpoint.
        tables.held = sqlx::query_as(
            "SELECT a.active_request_id,
                    a.input_tokens, a.output_tokens,
                    a.cache_read_tokens, a.cache_write_tokens,
                    c.input_tokens, c.output_tokens,
                    c.cache_read_tokens, c.cache_write_tokens
             FROM admissions a
             LEFT JOIN all_checkpoints c ON c.conversation_id = a.conversation_id
                 AND c.run_id = a.run_id
                 AND c.turn = (SELECT MAX(turn) FROM all_checkpoints
                               WHERE conversation_id = a.conversation_id AND run_id = a.run_id)
             WHERE a.active_request_id IS NOT NULL",
        )
        .fetch_all(&mut *tx)
        .await
        .expect("read the admissions");
        tx.rollback().await.expect("end the snapshot");
        tables
    }

    async fn reference_store(&self) -> Arc<dyn Store> {
        durability::reference_store().await
    }

    async fn final_checks(
        &self,
        dir: &Path,
        plan: &Plan,
        reference: &Reference,
        stats: &mut Stats,
    ) -> usize {
        let pg = PostgresStore::connect_with(options(&self.url))
            .await
            .expect("reconnect");
        let rows = sqlx::query_as("SELECT request_id, run_id FROM all_runs")
            .fetch_all(&self.pool)
            .await
            .expect("list runs");
        let runs = kills::runs_by_request(rows);
        let store: Arc<dyn Store> = Arc::new(pg.clone());
        let journaled = kills::final_checks(store, &runs, dir, plan, reference, stats).await;
        pg.close().await;
        journaled
    }

    async fn close(&self) {
        self.pool.close().await;
    }
}
