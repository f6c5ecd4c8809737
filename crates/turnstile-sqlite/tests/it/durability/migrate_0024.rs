//! Migration 0024 on a database written before it: the event log is copied
//! into a table that takes `checkpoint_saved`, every event kept with its
//! number, and the next turn that ends is logged after them.

use std::path::Path;

use turnstile::store::{LoggedEvent, LoggedStep};
use turnstile::{SqliteStore, Store};
use turnstile_conformance::support::{
    admit, complete_request, new_conversation, tool_call, tool_turn,
};

use super::raw_pool;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// The database as the build before 0024 left it, near enough: its log
/// without `checkpoint_saved` events, in a table whose kinds stop at 8, and
/// 0024 not applied. The removed events leave gaps in the numbering, which
/// that build's log would not have; the numbers kept must stay all the
/// same.
async fn undo_0024(path: &Path) -> TestResult {
    let pool = raw_pool(path).await?;
    super::migrate_0025::undo_0025(&pool).await?;
    for sql in [
        "DELETE FROM events WHERE kind = 9",
        // The old table under the name the triggers write to, as 0022 made
        // it.
        "PRAGMA legacy_alter_table = ON",
        "CREATE TABLE events_before_0024 (
             conversation_key INTEGER NOT NULL REFERENCES conversations (key) ON DELETE CASCADE,
             seq              INTEGER NOT NULL,
             kind             INTEGER NOT NULL CHECK (kind BETWEEN 0 AND 8),
             request_id       BLOB NOT NULL,
             run_id           BLOB,
             turn             INTEGER,
             entry_seq        INTEGER,
             call_id          TEXT,
             at               INTEGER NOT NULL,
             PRIMARY KEY (conversation_key, seq)
         ) WITHOUT ROWID",
        "INSERT INTO events_before_0024 SELECT * FROM events",
        "DROP TABLE events",
        "ALTER TABLE events_before_0024 RENAME TO events",
        "PRAGMA legacy_alter_table = OFF",
        "CREATE TRIGGER events_numbered AFTER INSERT ON events
         BEGIN
             UPDATE admissions SET event_seq = NEW.seq
             WHERE conversation_id = (SELECT id FROM conversations WHERE key = NEW.conversation_key);
         END",
        // The steps of that build wrote no kind 9; the next open installs
        // this build's.
        "DELETE FROM _sqlx_migrations WHERE version = 24",
        "UPDATE step_set SET version = 0",
    ] {
        sqlx::query(sql)
            .execute(&pool)
            .await
            .map_err(|e| format!("{sql}: {e}"))?;
    }
    let kinds: Vec<i64> = sqlx::query_scalar("SELECT DISTINCT kind FROM events ORDER BY kind")
        .fetch_all(&pool)
        .await?;
    assert_eq!(kinds, [0, 2, 3, 7], "the log as 0022 wrote it");
    let refused = sqlx::query("UPDATE events SET kind = 9 WHERE seq = 1")
        .execute(&pool)
        .await;
    assert!(refused.is_err(), "the old table takes no kind 9");
    pool.close().await;
    Ok(())
}

#[tokio::test]
async fn the_log_keeps_every_event_and_number_and_goes_on_with_saved_checkpoints() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("before-0024.db");
    let store = SqliteStore::open(&path).await?;
    let conversation = new_conversation(&store).await?;
    complete_request(&store, conversation, "first", 2, "done").await?;
    let all = store.events_after(conversation, 0, 100).await?;
    store.close().await?;
    let before: Vec<LoggedEvent> = all
        .into_iter()
        .filter(|e| !matches!(e.step, LoggedStep::CheckpointSaved { .. }))
        .collect();

    undo_0024(&path).await?;
    let store = SqliteStore::open(&path).await?;
    assert_eq!(store.events_after(conversation, 0, 100).await?, before);
    let last = before.last().expect("events").seq;

    let fence = admit(&store, conversation, "second").await?;
    tool_turn(&store, &fence, 1, 1, tool_call("call-1", "{}"), "r").await?;
    let after = store.events_after(conversation, last, 100).await?;
    let steps: Vec<_> = after.iter().map(|e| (e.seq, e.step.kind())).collect();
    assert_eq!(
        steps,
        [
            (last + 1, "admitted"),
            (last + 2, "answered"),
            (last + 3, "tool_finished"),
            (last + 4, "checkpoint_saved"),
        ]
    );
    assert_eq!(
        after[3].step,
        LoggedStep::CheckpointSaved {
            run_id: fence.run_id,
            turn: 1
        }
    );
    store.close().await?;
    Ok(())
}
