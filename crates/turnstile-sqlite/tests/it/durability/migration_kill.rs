//! A migration killed midway: the database is as it was before that
//! migration, and the next open applies it with every row.
//!
//! The test grows a copy of the schema-4 fixture's transcript to 100,000
//! rows of 1 KB, re-runs its own test binary as a child that opens it (so
//! it migrates, printing each migration as it starts and each batch of rows
//! it copies), and SIGKILLs the child once migration 0017, which copies the
//! transcript, has copied its first batch (half the rows) and goes on to
//! the second.
//!
//! The same database opened under a size quota it fits migrates past the
//! quota: for a moment the copy needs room for both tables.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use sqlx::Row;
use turnstile::{MigrationEvent, MigrationObserver, SqliteOptions, SqliteStore};
use turnstile_conformance::support::TestResult;

use super::compat::{applied_migrations, copy_of_fixture};

const CHILD_DB: &str = "TURNSTILE_TEST_MIGRATING_DB";
/// The migration the child is killed in: it copies the whole transcript.
const KILLED_IN: i64 = 17;
const ROWS: i64 = 100_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_killed_midway_leaves_the_database_as_before_it_and_the_next_open_applies_it(
) -> TestResult {
    if let Ok(path) = std::env::var(CHILD_DB) {
        return child(&path).await;
    }
    let dir = tempfile::tempdir()?;
    let path = copy_of_fixture(dir.path())?;
    grow_transcript(&path).await?;
    let before = transcript_by_conversation(&path, "t.conversation_id", "").await?;
    assert_eq!(before.iter().map(|(_, n, _)| n).sum::<i64>(), ROWS + 10);

    let test_name = concat!(
        module_path!(),
        "::a_migration_killed_midway_leaves_the_database_as_before_it_and_the_next_open_applies_it"
    );
    let test_name = test_name.split_once("::").map_or(test_name, |(_, t)| t);
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--exact", test_name, "--nocapture", "--test-threads=1"])
        .env(CHILD_DB, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // Midway through the copy: a batch of rows copied, more to come.
    let midway = format!("MIGRATION COPIED {KILLED_IN} transcript ");
    loop {
        match lines.recv_timeout(Duration::from_secs(120)) {
            Ok(line) if line.starts_with(&midway) => {
                let copied: Vec<i64> = line[midway.len()..]
                    .split(' ')
                    .map(|n| n.parse().expect("a count"))
                    .collect();
                assert!(copied[0] > 0 && copied[0] < copied[1], "{line}");
                break;
            }
            Ok(line) => assert_ne!(line, format!("MIGRATION APPLIED {KILLED_IN}")),
            Err(e) => {
                child.kill().ok();
                panic!("the child never copied a batch in migration {KILLED_IN}: {e}");
            }
        }
    }
    child.kill()?;
    child.wait()?;

    // As before migration 0017: the migrations before it applied, the
    // transcript in its old table with every row.
    assert_eq!(
        applied_migrations(&path).await?,
        (1..KILLED_IN).collect::<Vec<_>>()
    );
    assert_eq!(integrity(&path).await?, "ok");
    assert_eq!(
        transcript_by_conversation(&path, "t.conversation_id", "").await?,
        before
    );

    // The next open applies it; every row is there, under its conversation.
    let store = SqliteStore::open(&path).await?;
    store.close().await?;
    assert_fully_migrated(&path, &before).await
}

#[tokio::test]
async fn a_database_under_a_quota_it_fits_migrates_past_the_quota_and_keeps_every_row() -> TestResult
{
    let dir = tempfile::tempdir()?;
    let path = copy_of_fixture(dir.path())?;
    grow_transcript(&path).await?;
    let before = transcript_by_conversation(&path, "t.conversation_id", "").await?;
    let size = std::fs::metadata(&path)?.len();
    // Room for a few more pages, not for a second copy of the transcript.
    let options = SqliteOptions {
        max_database_bytes: Some(size + (1 << 20)),
        ..SqliteOptions::default()
    };
    let store = SqliteStore::open_with(&path, options).await?;
    store.close().await?;
    assert!(std::fs::metadata(&path)?.len() > size + (1 << 20));
    assert_fully_migrated(&path, &before).await
}

/// Every migration applied, the file whole, and every transcript row of
/// `before` under its conversation, now named by its key, among its
/// committed entries (a held request's messages follow them since 0019).
async fn assert_fully_migrated(path: &Path, before: &[(String, i64, String)]) -> TestResult {
    assert_eq!(
        applied_migrations(path).await?,
        (1..=SqliteStore::supported_schema_version()).collect::<Vec<_>>()
    );
    assert_eq!(integrity(path).await?, "ok");
    assert_eq!(
        transcript_by_conversation(
            path,
            "(SELECT c.id FROM conversations c WHERE c.key = t.conversation_key)",
            "WHERE t.seq < (SELECT c.transcript_length FROM conversations c
                            WHERE c.key = t.conversation_key)"
        )
        .await?,
        before
    );
    Ok(())
}

/// The child's side: open (and so migrate) the database, telling the parent
/// of each migration as it starts and ends.
async fn child(path: &str) -> TestResult {
    let options = SqliteOptions {
        on_migration: Some(MigrationObserver::new(|event| {
            use std::io::Write as _;
            let line = match event {
                MigrationEvent::Started { version, .. } => format!("MIGRATION STARTED {version}"),
                MigrationEvent::Copied {
                    version,
                    table,
                    rows,
                    of,
                } => format!("MIGRATION COPIED {version} {table} {rows} {of}"),
                MigrationEvent::Applied { version, .. } => format!("MIGRATION APPLIED {version}"),
                _ => return,
            };
            let mut out = std::io::stdout().lock();
            writeln!(out, "{line}").ok();
            out.flush().ok();
        })),
        ..SqliteOptions::default()
    };
    SqliteStore::open_with(path, options).await?.close().await?;
    Ok(())
}

/// 100,000 more transcript rows of 1 KB in conversation `…0a` of the
/// schema-4 fixture, after its own ten.
async fn grow_transcript(path: &Path) -> TestResult {
    let pool = super::raw_pool(path).await?;
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 10 UNION ALL SELECT i + 1 FROM n WHERE i < ?1 + 9)
         INSERT INTO transcript (conversation_id, seq, request_id, role, content, meta)
         SELECT x'0000000000004000800000000000000a', i, x'000000000000400080000000000000a4',
                CASE i % 2 WHEN 0 THEN 'user' ELSE 'assistant' END,
                printf('%d %.*c', i, 1000, 'x'), NULL
         FROM n",
    )
    .bind(ROWS)
    .execute(&pool)
    .await?;
    pool.close().await;
    Ok(())
}

/// Per conversation id (hex): its rows, and a digest of their `seq`,
/// request id, role and content.
/// The transcript's rows that `filter` (a `WHERE` clause or nothing) keeps,
/// summed up per conversation (`conversation`: how a row names it).
async fn transcript_by_conversation(
    path: &Path,
    conversation: &str,
    filter: &str,
) -> Result<Vec<(String, i64, String)>, sqlx::Error> {
    let pool = super::raw_pool(path).await?;
    let rows = sqlx::query(&format!(
        "SELECT hex({conversation}) AS conversation, COUNT(*) AS n,
                SUM(t.seq) || '/' || SUM(length(t.content)) || '/' || SUM(unicode(t.role))
                    || '/' || group_concat(substr(t.content, 1, 8), '' ORDER BY t.seq) AS digest
         FROM transcript t {filter} GROUP BY 1 ORDER BY 1"
    ))
    .fetch_all(&pool)
    .await?;
    pool.close().await;
    Ok(rows
        .into_iter()
        .map(|r| (r.get("conversation"), r.get("n"), r.get("digest")))
        .collect())
}

async fn integrity(path: &Path) -> Result<String, sqlx::Error> {
    let pool = super::raw_pool(path).await?;
    let result = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&pool)
        .await?;
    pool.close().await;
    Ok(result)
}
