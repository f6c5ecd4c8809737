//! Migration 0028 (a request's `admitted` and settling events in its row):
//! on a database written before it, the events logged keep their rows and
//! numbers; a request held across it commits or is abandoned in `events`,
//! as it was admitted; the next one keeps both in its row, and the log
//! reads on without a gap.

use sqlx::PgPool;
use turnstile::PostgresStore;
use turnstile_conformance::event_log::{
    conversations_with_requests_held, the_logs_read_on_after_their_admission_events_moved,
};
use turnstile_testkit::postgres::durability::inspect_pool;
use turnstile_testkit::postgres::{database_url, fresh_options};

/// The database as the build before 0028 left it: every event in `events`
/// (the ones kept in the requests' rows moved there), the index by
/// creation time, 0028 not applied (0029, which changes only the indexes
/// of `admissions`, stays).
const UNDO_0028: [&str; 6] = [
    "INSERT INTO events (conversation_id, seq, kind, request_id, run_id, entry_seq, at)
     SELECT conversation_id, admitted_event, 0, request_id, admitted_run_id, admitted_entry,
         created_at
     FROM requests WHERE admitted_event IS NOT NULL",
    "INSERT INTO events (conversation_id, seq, kind, request_id, run_id, at)
     SELECT conversation_id, settled_event, CASE WHEN status = 'completed' THEN 7 ELSE 8 END,
         request_id,
         CASE WHEN status = 'completed' THEN NULLIF(committed_run_id, request_id) END,
         completed_at
     FROM requests WHERE settled_event IS NOT NULL",
    "DROP INDEX requests_by_conversation",
    "CREATE INDEX requests_by_conversation ON requests (conversation_id, created_at)",
    "ALTER TABLE requests DROP COLUMN admitted_event, DROP COLUMN admitted_entry,
         DROP COLUMN admitted_run_id, DROP COLUMN settled_event",
    "DELETE FROM _sqlx_migrations WHERE version = 28",
];

/// The `events` rows of each kind, as (kind, count).
async fn logged_kinds(pool: &PgPool) -> Vec<(i16, i64)> {
    sqlx::query_as("SELECT kind, COUNT(*) FROM events GROUP BY kind ORDER BY kind")
        .fetch_all(pool)
        .await
        .expect("kinds")
}

#[tokio::test]
async fn the_log_reads_on_across_it_and_a_request_held_across_it_settles_once() {
    let options = fresh_options();
    let schema = options.schema.clone().expect("schema");
    let store = PostgresStore::connect_with(options.clone())
        .await
        .expect("connect");
    let held = conversations_with_requests_held(&store)
        .await
        .expect("conversations with a committed request and a held one");
    store.close().await;
    let pool = inspect_pool(database_url(), &schema);
    assert_eq!(logged_kinds(&pool).await, [], "kept in the requests' rows");

    for sql in UNDO_0028 {
        sqlx::query(sql).execute(&pool).await.expect(sql);
    }
    assert_eq!(
        logged_kinds(&pool).await,
        [(0, 4), (7, 2)],
        "in each conversation two admissions and a commit, as 0026 logged them"
    );

    let store = PostgresStore::connect_with(options)
        .await
        .expect("migrated");
    the_logs_read_on_after_their_admission_events_moved(&store, held)
        .await
        .expect("the logs read on");
    assert_eq!(
        logged_kinds(&pool).await,
        [(0, 4), (7, 3), (8, 1)],
        "the held requests' commit and abandon logged where their admissions are; the next \
         requests' in their rows"
    );
    pool.close().await;
    store.close().await;
}
