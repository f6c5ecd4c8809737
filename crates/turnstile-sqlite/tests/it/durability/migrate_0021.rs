//! Migration 0021 on a database written before it: request rows whose
//! folded first run committed, is held, failed, was taken over or was
//! abandoned read back the same through the store once their words are
//! codes and their repeats are gone, and the rows lose those bytes.

use std::path::Path;

use turnstile::{CheckpointPhase, ConversationId, RequestId, RunId, SqliteStore, Store};
use turnstile_conformance::support::{
    admitted, checkpoint, commit_answer, new_conversation, new_request, recover, tool_call,
    tool_turn, Snapshot,
};

use super::raw_pool;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// A row's `state`, `committed_by`, `run_ended_early_at` and
/// `checkpoint_early_at`.
type StoredColumns = (i64, Option<Vec<u8>>, Option<i64>, Option<i64>);

/// Turns the generated column `column` of `requests` back into a stored
/// one of the same values, as 0020 left it.
fn store_column(column: &str, affinity: &str) -> [String; 4] {
    [
        format!("ALTER TABLE requests ADD COLUMN {column}_0020 {affinity}"),
        format!("UPDATE requests SET {column}_0020 = {column}"),
        format!("ALTER TABLE requests DROP COLUMN {column}"),
        format!("ALTER TABLE requests RENAME COLUMN {column}_0020 TO {column}"),
    ]
}

/// The database as the build before 0021 left it: the words and repeats in
/// stored columns, no codes, 0021 (and every migration after it)
/// not applied.
async fn undo_0021(path: &Path) -> TestResult {
    let pool = raw_pool(path).await?;
    super::migrate_0025::undo_0025(&pool).await?;
    let event_triggers: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'event\\_%' ESCAPE '\\'",
    )
    .fetch_all(&pool)
    .await?;
    let mut undo_0022: Vec<String> = event_triggers
        .iter()
        .map(|trigger| format!("DROP TRIGGER \"{trigger}\""))
        .collect();
    undo_0022.extend([
        // The steps that name the table (installed again at the next open).
        "DROP VIEW conversation_opens".to_owned(),
        "DROP VIEW turn_write_batches".to_owned(),
        "DROP VIEW turn_writes".to_owned(),
        "DROP TABLE events".to_owned(),
        "ALTER TABLE admissions DROP COLUMN event_seq".to_owned(),
        "DROP TABLE tokens".to_owned(),
        // 0026's index back.
        "CREATE INDEX admissions_held ON admissions (active_request_id)
         WHERE active_request_id IS NOT NULL"
            .to_owned(),
        "DELETE FROM _sqlx_migrations WHERE version > 21".to_owned(),
    ]);
    for sql in undo_0022 {
        sqlx::query(&sql)
            .execute(&pool)
            .await
            .map_err(|e| format!("{sql}: {e}"))?;
    }
    let kept: Vec<String> = sqlx::query_scalar(
        "SELECT sql FROM sqlite_master WHERE name IN ('all_runs', 'all_checkpoints')",
    )
    .fetch_all(&pool)
    .await?;
    let views: Vec<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'view'")
            .fetch_all(&pool)
            .await?;
    let mut undo: Vec<String> = views
        .iter()
        .map(|view| format!("DROP VIEW \"{view}\""))
        .collect();
    for (column, affinity) in [
        ("status", "TEXT"),
        ("committed_run_id", "BLOB"),
        ("run_status", "TEXT"),
        ("run_ended_at", "INTEGER"),
        ("phase", "TEXT"),
        ("checkpoint_at", "INTEGER"),
    ] {
        undo.extend(store_column(column, affinity));
    }
    for code in [
        "state",
        "committed_by",
        "run_state",
        "run_ended_early_at",
        "checkpoint_phase",
        "checkpoint_early_at",
    ] {
        undo.push(format!("ALTER TABLE requests DROP COLUMN {code}"));
    }
    undo.extend(kept);
    undo.push("DELETE FROM _sqlx_migrations WHERE version = 21".into());
    undo.push("UPDATE step_set SET version = 0".into());
    for sql in undo {
        sqlx::query(&sql)
            .execute(&pool)
            .await
            .map_err(|e| format!("{sql}: {e}"))?;
    }
    pool.close().await;
    Ok(())
}

/// A request in each state a folded first run leaves its row in, each in a
/// conversation of its own: the conversation, the request, its runs.
type Written = Vec<(ConversationId, RequestId, Vec<RunId>)>;

const STATES: [&str; 5] = ["committed", "held", "failed", "taken over", "abandoned"];

async fn write_each_state(store: &dyn Store) -> Result<Written, turnstile::Error> {
    let mut written = Vec::new();
    for state in STATES {
        let conversation = new_conversation(store).await?;
        let revision = store.admission(conversation).await?.revision;
        let claim = new_request(conversation, revision, state);
        let fence = admitted(store, &claim).await?;
        let mut runs = vec![fence.run_id];
        let mut count = 1;
        for turn in 1..=2 {
            let call = tool_call(&format!("call-{turn}"), "{}");
            count = tool_turn(store, &fence, turn, count, call, "r").await?;
        }
        match state {
            "committed" => {
                commit_answer(store, &fence, 3, count, "done").await?;
            }
            "failed" | "taken over" => {
                let settled = checkpoint(fence.run_id, 2, CheckpointPhase::Ready, count);
                store
                    .fail_run(&fence, "the model went away", Some(&settled))
                    .await?;
                if state == "taken over" {
                    let second = recover(store, &fence).await?;
                    runs.push(second.run_id);
                    commit_answer(store, &second, 3, count, "done").await?;
                }
            }
            "abandoned" => {
                store
                    .abandon(conversation, claim.request_id, fence.revision)
                    .await?;
            }
            _ => {}
        }
        written.push((conversation, claim.request_id, runs));
    }
    Ok(written)
}

async fn read_all(store: &dyn Store, written: &Written) -> Result<Vec<Snapshot>, turnstile::Error> {
    let mut snapshots = Vec::new();
    for (conversation, request, runs) in written {
        snapshots.push(Snapshot::take(store, *conversation, &[*request], runs, 3).await?);
    }
    Ok(snapshots)
}

#[tokio::test]
async fn folded_runs_in_every_state_read_the_same_after_the_migration() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("before-0021.db");
    let store = SqliteStore::open(&path).await?;
    let written = write_each_state(&store).await?;
    let mut before = read_all(&store, &written).await?;
    store.close().await?;
    // The event log starts at its migration: what came before is not in it.
    for snapshot in &mut before {
        snapshot.events.clear();
    }

    undo_0021(&path).await?;
    let pool = raw_pool(&path).await?;
    let words: Vec<(String, Option<String>, Option<String>)> =
        sqlx::query_as("SELECT status, run_status, phase FROM requests ORDER BY created_at")
            .fetch_all(&pool)
            .await?;
    let expected = [
        ("completed", "completed", "completed"),
        ("active", "running", "ready"),
        ("active", "failed", "ready"),
        ("completed", "superseded", "ready"),
        ("abandoned", "abandoned", "ready"),
    ]
    .map(|(s, r, p)| (s.to_owned(), Some(r.to_owned()), Some(p.to_owned())));
    assert_eq!(words, expected, "the rows as 0020 stored them");

    // A damaged word stops the migration, which leaves the file as it was;
    // mended, the file migrates.
    let damage = "UPDATE requests SET phase = 'TOOLS_IN_FLIGHT' WHERE status = 'active'
                  AND run_status = 'running'";
    sqlx::query(damage).execute(&pool).await?;
    pool.close().await;
    let refused = SqliteStore::open(&path)
        .await
        .expect_err("the migration stopped");
    assert!(refused.to_string().contains("CHECK"), "{refused}");
    assert!(
        refused
            .to_string()
            .contains("migration 21 was undone, so the file is as it was"),
        "{refused}"
    );
    let pool = raw_pool(&path).await?;
    let versions: Vec<i64> = sqlx::query_scalar("SELECT version FROM _sqlx_migrations")
        .fetch_all(&pool)
        .await?;
    assert_eq!(versions.last(), Some(&20), "0021 not applied");
    let phases: Vec<Option<String>> =
        sqlx::query_scalar("SELECT phase FROM requests ORDER BY created_at")
            .fetch_all(&pool)
            .await?;
    assert_eq!(
        phases[1].as_deref(),
        Some("TOOLS_IN_FLIGHT"),
        "the file as it was"
    );
    sqlx::query("UPDATE requests SET phase = 'ready' WHERE phase = 'TOOLS_IN_FLIGHT'")
        .execute(&pool)
        .await?;
    pool.close().await;

    let store = SqliteStore::open(&path).await?;
    assert_eq!(read_all(&store, &written).await?, before);
    store.close().await?;

    // What repeats the request's id or its completion is no longer stored.
    let pool = raw_pool(&path).await?;
    let stored: Vec<StoredColumns> = sqlx::query_as(
        "SELECT state, committed_by, run_ended_early_at, checkpoint_early_at
         FROM requests ORDER BY created_at",
    )
    .fetch_all(&pool)
    .await?;
    let repeats: Vec<_> = stored
        .iter()
        .map(|(state, by, ended, _)| (*state, by.is_some(), ended.is_some()))
        .collect();
    assert_eq!(
        repeats,
        [
            // committed by its folded run: nothing repeated
            (1, false, false),
            (0, false, false),
            // failed: the failure's time
            (0, false, true),
            // taken over: the committing run's id, the take-over's time
            (1, true, true),
            // abandoned while running: it ended at the abandon
            (2, false, false),
        ]
    );
    // A checkpoint's own time is kept unless it is the completion's: the
    // commit's is, a held run's is not (a finished request's checkpoint may
    // fall in its completion's millisecond, and then reads the same).
    let checkpoint_times: Vec<_> = stored.iter().map(|(.., at)| at.is_some()).collect();
    assert_eq!(checkpoint_times[..3], [false, true, true]);
    pool.close().await;
    Ok(())
}
