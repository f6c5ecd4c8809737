//! The SQLite floors: a bare transaction writing the rows of a one-turn
//! request (`BEGIN IMMEDIATE`, two message inserts, one update, `COMMIT`)
//! and bare single-row commits, both on one plain sqlx connection, on a
//! WAL file with the workload's durability or in memory.

use std::path::Path;
use std::str::FromStr;
use std::time::{Duration, Instant};

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection, SqliteConnection};
use turnstile::Durability;

use super::{BaselineError, Commits};

/// Says how the floors were written, for the report.
pub const WHAT: &str =
    "BEGIN IMMEDIATE, 2 message inserts, 1 update, COMMIT; and single-row commits; one plain sqlx connection";

/// Bare turns written before the sampled ones: at two or three WAL pages
/// each, past the first checkpoint of the WAL.
const WARM_UP_TURNS: i64 = 500;

/// Both SQLite floors.
#[derive(Debug)]
pub struct Floors {
    /// The latency of each bare one-turn transaction.
    pub bare_turns: Vec<Duration>,
    /// The bare single-row commits.
    pub bare_commits: Commits,
    /// The SQLite they and the store ran on.
    pub build: SqliteBuild,
}

/// The linked SQLite, and whether it takes the two process-wide mutexes
/// that make connections on several threads queue on each other (off in
/// this workspace's builds: `.cargo/config.toml`).
#[derive(Debug, serde::Serialize)]
pub struct SqliteBuild {
    pub version: String,
    /// Memory statistics, updated under one mutex by every allocation.
    pub memory_statistics: bool,
    /// One page cache for every connection, under one mutex.
    pub shared_page_cache: bool,
}

/// Measures both floors, `samples` of each, with `message_bytes` per
/// message, on a new database `baseline.db` in `dir` (`None`: in memory).
///
/// # Errors
/// What failed, as `bench baseline: <step>: <cause>`.
pub async fn measure(
    dir: Option<&Path>,
    durability: Durability,
    message_bytes: usize,
    samples: usize,
) -> Result<Floors, BaselineError> {
    let options = match dir {
        Some(dir) => SqliteConnectOptions::new()
            .filename(dir.join("baseline.db"))
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match durability {
                Durability::Full => SqliteSynchronous::Full,
                Durability::Normal => SqliteSynchronous::Normal,
            }),
        None => SqliteConnectOptions::from_str("sqlite::memory:").map_err(failed("open"))?,
    };
    let mut conn = options.connect().await.map_err(failed("open"))?;
    let build = sqlite_build(&mut conn).await?;
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
    let mut bare_turns = Vec::with_capacity(samples);
    for seq in 0..samples as i64 {
        let started = Instant::now();
        bare_turn(&mut conn, &conversation, 2 * seq, &body).await?;
        bare_turns.push(started.elapsed());
    }
    let mut commits = Vec::with_capacity(samples);
    let wall = Instant::now();
    for _ in 0..samples {
        let started = Instant::now();
        bare_commit(&mut conn, &body).await?;
        commits.push(started.elapsed());
    }
    let bare_commits = Commits {
        latencies: commits,
        wall: wall.elapsed(),
    };
    conn.close().await.map_err(failed("close"))?;
    Ok(Floors {
        bare_turns,
        bare_commits,
        build,
    })
}

async fn sqlite_build(conn: &mut SqliteConnection) -> Result<SqliteBuild, BaselineError> {
    let (version, memstatus_off, memory_management): (String, bool, bool) = sqlx::query_as(
        "SELECT sqlite_version(), sqlite_compileoption_used('DEFAULT_MEMSTATUS=0'),
                sqlite_compileoption_used('ENABLE_MEMORY_MANAGEMENT')",
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(failed("read the SQLite build"))?;
    Ok(SqliteBuild {
        version,
        memory_statistics: !memstatus_off,
        shared_page_cache: memory_management,
    })
}

async fn bare_turn(
    conn: &mut SqliteConnection,
    conversation: &[u8],
    seq: i64,
    body: &str,
) -> Result<(), BaselineError> {
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

async fn bare_commit(conn: &mut SqliteConnection, body: &str) -> Result<(), BaselineError> {
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

fn failed(what: &'static str) -> impl FnOnce(sqlx::Error) -> BaselineError {
    move |e| BaselineError::new(format!("bench baseline: {what}: {e}"))
}
