//! Migration 0028 (a request's `admitted` and settling events in its row):
//! on a database written before it, the events logged keep their rows and
//! numbers; a request held across it settles in `events`, as it was
//! admitted; the next one keeps both in its row, and the log reads on
//! without a gap.

use sqlx::PgPool;
use turnstile::{PostgresStore, Store};
use turnstile_conformance::support::{admit, commit_answer, complete_request, new_conversation};
use turnstile_testkit::postgres::durability::inspect_pool;
use turnstile_testkit::postgres::{database_url, fresh_options};

/// The database as the build before 0028 left it: every event in `events`
/// (the ones kept in the requests' rows moved there), the index by
/// creation time, 0028 not applied.
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
    let conversation = new_conversation(&store).await.expect("conversation");
    complete_request(&store, conversation, "first", 0, "done")
        .await
        .expect("a committed request");
    let held = admit(&store, conversation, "second").await.expect("held");
    let before = store
        .events_after(conversation, 0, 100)
        .await
        .expect("events");
    store.close().await;
    let pool = inspect_pool(database_url(), &schema);
    assert_eq!(logged_kinds(&pool).await, [], "kept in the requests' rows");

    for sql in UNDO_0028 {
        sqlx::query(sql).execute(&pool).await.expect(sql);
    }
    assert_eq!(
        logged_kinds(&pool).await,
        [(0, 2), (7, 1)],
        "two admissions and a commit, as 0026 logged them"
    );

    let store = PostgresStore::connect_with(options)
        .await
        .expect("migrated");
    let events = store.events_after(conversation, 0, 100).await;
    assert_eq!(events.expect("events"), before);
    let last = before.last().expect("events").seq;
    commit_answer(&store, &held, 1, 1, "held across")
        .await
        .expect("the held request commits");
    complete_request(&store, conversation, "third", 0, "after")
        .await
        .expect("the next request");
    let after = store
        .events_after(conversation, last, 100)
        .await
        .expect("events");
    let steps: Vec<_> = after.iter().map(|e| (e.seq, e.step.kind())).collect();
    assert_eq!(
        steps,
        [
            (last + 1, "committed"),
            (last + 2, "admitted"),
            (last + 3, "committed"),
        ]
    );
    // From inside the third request: its commit alone.
    let inside = store.events_after(conversation, last + 2, 100).await;
    assert_eq!(inside.expect("events"), after[2..]);
    assert_eq!(
        logged_kinds(&pool).await,
        [(0, 2), (7, 2)],
        "the held request's commit logged where its admission is; the third's in its row"
    );
    pool.close().await;
    store.close().await;
}
