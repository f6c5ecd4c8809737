//! Migration 0025 on a database written before it: a request's `admitted`
//! and settling events move from `events` into its row. The events logged
//! before it keep their rows and numbers; a request held across it commits
//! or is abandoned in `events`, as it was admitted; the next one keeps both
//! in its row, and the log reads on without a gap.

use std::path::Path;

use sqlx::SqlitePool;
use turnstile::SqliteStore;
use turnstile_conformance::event_log::{
    conversations_with_requests_held, the_logs_read_on_after_their_admission_events_moved,
};

use super::raw_pool;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// The database as 0024 left it: every event in `events` (the ones kept in
/// the requests' rows moved there, the admissions' counters unchanged), the
/// triggers that logged a request's admission and settling, the index by
/// creation time, and 0025 and the steps that name its columns not
/// installed (the next open installs this build's).
pub(super) async fn undo_0025(pool: &SqlitePool) -> TestResult {
    for sql in [
        "CREATE TEMP TABLE counters AS SELECT conversation_id, event_seq FROM admissions",
        "INSERT INTO events (conversation_key, seq, kind, request_id, run_id, entry_seq, at)
         SELECT c.key, r.admitted_event, 0, r.request_id, r.admitted_run_id, r.admitted_entry,
             r.created_at
         FROM requests r JOIN conversations c ON c.id = r.conversation_id
         WHERE r.admitted_event IS NOT NULL",
        "INSERT INTO events (conversation_key, seq, kind, request_id, run_id, at)
         SELECT c.key, r.settled_event, IIF(r.state = 1, 7, 8), r.request_id,
             IIF(r.state = 1, r.committed_by, NULL), COALESCE(r.completed_at, 0)
         FROM requests r JOIN conversations c ON c.id = r.conversation_id
         WHERE r.settled_event IS NOT NULL",
        "UPDATE admissions SET event_seq = (SELECT event_seq FROM counters
                                            WHERE counters.conversation_id = admissions.conversation_id)",
        "DROP TABLE counters",
        "DROP VIEW claims",
        "DROP VIEW claim_batches",
        "DROP VIEW commits",
        "DROP VIEW commit_batches",
        "DROP VIEW abandons",
        "DROP TRIGGER event_settled",
        "CREATE TRIGGER event_admitted AFTER INSERT ON requests
         BEGIN
             INSERT INTO events (conversation_key, seq, kind, request_id, run_id, entry_seq, at)
             SELECT c.key, a.event_seq + 1, 0, NEW.request_id, NULLIF(a.run_id, NEW.request_id),
                 c.transcript_length, NEW.created_at
             FROM admissions a JOIN conversations c ON c.id = a.conversation_id
             WHERE a.conversation_id = NEW.conversation_id;
         END",
        "CREATE TRIGGER event_settled AFTER UPDATE OF state ON requests
         WHEN NEW.state <> OLD.state AND NEW.state IN (1, 2)
         BEGIN
             INSERT INTO events (conversation_key, seq, kind, request_id, run_id, at)
             SELECT c.key, a.event_seq + 1, IIF(NEW.state = 1, 7, 8), NEW.request_id,
                 IIF(NEW.state = 1, NEW.committed_by, NULL), COALESCE(NEW.completed_at, 0)
             FROM admissions a JOIN conversations c ON c.id = a.conversation_id
             WHERE a.conversation_id = NEW.conversation_id;
         END",
        "DROP INDEX requests_by_conversation",
        "CREATE INDEX requests_by_conversation ON requests (conversation_id, created_at)",
        "ALTER TABLE requests DROP COLUMN admitted_event",
        "ALTER TABLE requests DROP COLUMN admitted_entry",
        "ALTER TABLE requests DROP COLUMN admitted_run_id",
        "ALTER TABLE requests DROP COLUMN settled_event",
        "DELETE FROM _sqlx_migrations WHERE version = 25",
        "UPDATE step_set SET version = 0",
    ] {
        sqlx::query(sql)
            .execute(pool)
            .await
            .map_err(|e| format!("{sql}: {e}"))?;
    }
    Ok(())
}

/// The `events` rows of each kind, as (kind, count).
async fn logged_kinds(path: &Path) -> Result<Vec<(i64, i64)>, sqlx::Error> {
    let pool = raw_pool(path).await?;
    let kinds = sqlx::query_as("SELECT kind, COUNT(*) FROM events GROUP BY kind ORDER BY kind")
        .fetch_all(&pool)
        .await;
    pool.close().await;
    kinds
}

#[tokio::test]
async fn the_log_reads_on_across_it_and_a_request_held_across_it_settles_once() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("before-0025.db");
    let store = SqliteStore::open(&path).await?;
    let held = conversations_with_requests_held(&store).await?;
    store.close().await?;
    assert_eq!(logged_kinds(&path).await?, [], "kept in the requests' rows");

    let pool = raw_pool(&path).await?;
    undo_0025(&pool).await?;
    pool.close().await;
    assert_eq!(
        logged_kinds(&path).await?,
        [(0, 4), (7, 2)],
        "in each conversation two admissions and a commit, as 0022 logged them"
    );

    let store = SqliteStore::open(&path).await?;
    the_logs_read_on_after_their_admission_events_moved(&store, held).await?;
    store.close().await?;
    assert_eq!(
        logged_kinds(&path).await?,
        [(0, 4), (7, 3), (8, 1)],
        "the held requests' commit and abandon logged where their admissions are; the next \
         requests' in their rows"
    );
    Ok(())
}
