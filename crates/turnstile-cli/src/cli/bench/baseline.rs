//! The floors the SQLite workload is measured against, in the same run on
//! the same kind of database (a WAL file with the workload's durability, or
//! memory): a bare transaction writing the rows of a one-turn request
//! (`BEGIN IMMEDIATE`, two message inserts, one update, `COMMIT`) and bare
//! single-row commits, both on one plain sqlx connection with no store
//! around it. Plain runtime SQL: this is the yardstick, not the store.

use std::str::FromStr;
use std::time::{Duration, Instant};

use serde::Serialize;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection, SqliteConnection};

use super::args::BenchDurability;
use super::stats::Latency;
use crate::cli::exit::CliError;

/// Bare turns written before the sampled ones: at two or three WAL pages
/// each, past the first checkpoint of the WAL.
const WARM_UP_TURNS: i64 = 500;

#[derive(Debug, Serialize)]
pub(super) struct Baseline {
    pub what: &'static str,
    /// p50 of the bare one-turn transaction.
    pub bare_turn_p50_ms: f64,
    /// Single-row commits per second on one connection.
    pub bare_commit_per_second: f64,
    pub bare_turn: Latency,
    pub bare_commit: Latency,
}

/// The run's figures over its baseline.
#[derive(Debug, Serialize)]
pub(super) struct Ratios {
    /// The workload's one-turn request p50 ÷ the bare one-turn transaction's.
    pub turn_p50_vs_bare_turn: f64,
    /// The workload's turns per second ÷ bare single-row commits per second.
    pub turns_per_second_vs_bare_commits: f64,
}

impl Ratios {
    pub(super) fn of(turn_p50_ms: f64, turns_per_second: f64, baseline: &Baseline) -> Self {
        Self {
            turn_p50_vs_bare_turn: turn_p50_ms / baseline.bare_turn_p50_ms.max(f64::MIN_POSITIVE),
            turns_per_second_vs_bare_commits: turns_per_second
                / baseline.bare_commit_per_second.max(f64::MIN_POSITIVE),
        }
    }
}

/// Measures both floors, `samples` of each, on a new database in `dir`
/// (`None`: in memory).
pub(super) async fn measure(
    dir: Option<&std::path::Path>,
    durability: BenchDurability,
    message_bytes: usize,
    samples: usize,
) -> Result<Baseline, CliError> {
    let options = match dir {
        Some(dir) => SqliteConnectOptions::new()
            .filename(dir.join("baseline.db"))
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match durability {
                BenchDurability::Full => SqliteSynchronous::Full,
                BenchDurability::Normal => SqliteSynchronous::Normal,
            }),
        None => SqliteConnectOptions::from_str("sqlite::memory:").map_err(failed("open"))?,
    };
    let mut conn = options.connect().await.map_err(failed("open"))?;
    for ddl in [
        "CREATE TABLE messages (id INTEGER PRIMARY KEY, conversation BLOB NOT NULL,
             seq INTEGER NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL)",
        "CREATE TABLE heads (id INTEGER PRIMARY KEY, revision INTEGER NOT NULL)",
        "INSERT INTO heads (id, revision) VALUES (1, 0)",
        "CREATE TABLE commits (id INTEGER PRIMARY KEY, body TEXT NOT NULL)",
    ] {
        sqlx::query(ddl)
            .execute(&mut conn)
            .await
            .map_err(failed("create tables"))?;
    }
    let body = "x".repeat(message_bytes);
    let conversation = uuid::Uuid::new_v4().as_bytes().to_vec();
    // Unsampled first, so the floor is taken where the workload spends its
    // time: a WAL file grows until its first checkpoint (1,000 pages), and
    // a commit that grows the file cost 1.4 to 3 times one that reuses it
    // in probes here (its fsync must also write the file's new size). The
    // default workload spends about 1 % of its commits growing the WAL;
    // 2,000 bare turns spent their first 367 (a fifth) growing it.
    for seq in 0..WARM_UP_TURNS {
        bare_turn(&mut conn, &conversation, -2 * (seq + 1), &body).await?;
    }
    let mut turns = Vec::with_capacity(samples);
    for seq in 0..samples as i64 {
        let started = Instant::now();
        bare_turn(&mut conn, &conversation, 2 * seq, &body).await?;
        turns.push(started.elapsed());
    }
    let mut commits = Vec::with_capacity(samples);
    let wall = Instant::now();
    for _ in 0..samples {
        let started = Instant::now();
        bare_commit(&mut conn, &body).await?;
        commits.push(started.elapsed());
    }
    let wall = wall.elapsed();
    conn.close().await.map_err(failed("close"))?;
    let bare_turn = Latency::of(turns);
    Ok(Baseline {
        what: "BEGIN IMMEDIATE, 2 message inserts, 1 update, COMMIT; and single-row commits; one plain sqlx connection",
        bare_turn_p50_ms: bare_turn.p50_ms,
        bare_commit_per_second: samples as f64 / wall.max(Duration::from_nanos(1)).as_secs_f64(),
        bare_turn,
        bare_commit: Latency::of(commits),
    })
}

async fn bare_turn(
    conn: &mut SqliteConnection,
    conversation: &[u8],
    seq: i64,
    body: &str,
) -> Result<(), CliError> {
    let mut tx = conn
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(failed("begin"))?;
    for (offset, role) in [(0, "user"), (1, "assistant")] {
        sqlx::query(
            "INSERT INTO messages (conversation, seq, role, content) VALUES (?1, ?2, ?3, ?4)",
        )
        .bind(conversation)
        .bind(seq + offset)
        .bind(role)
        .bind(body)
        .execute(&mut *tx)
        .await
        .map_err(failed("insert"))?;
    }
    sqlx::query("UPDATE heads SET revision = revision + 1 WHERE id = 1")
        .execute(&mut *tx)
        .await
        .map_err(failed("update"))?;
    tx.commit().await.map_err(failed("commit"))
}

async fn bare_commit(conn: &mut SqliteConnection, body: &str) -> Result<(), CliError> {
    let mut tx = conn
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(failed("begin"))?;
    sqlx::query("INSERT INTO commits (body) VALUES (?1)")
        .bind(body)
        .execute(&mut *tx)
        .await
        .map_err(failed("insert"))?;
    tx.commit().await.map_err(failed("commit"))
}

fn failed(what: &'static str) -> impl FnOnce(sqlx::Error) -> CliError {
    move |e| CliError::Failed(format!("bench baseline: {what}: {e}"))
}
