//! Migration 0027 (a request's first run and its latest checkpoint in the
//! request's row): a one-turn request writes no `runs` or
//! `loop_checkpoints` row; on a database written before it, every run and
//! checkpoint reads as before, and a request held across the upgrade goes
//! on and commits from the rows it had.

use sqlx::PgPool;
use turnstile::checkpoint::CheckpointPhase;
use turnstile::ids::RunId;
use turnstile::store::RunStatus;
use turnstile::{PostgresStore, Store};
use turnstile_conformance::support::{
    admit, commit_answer, complete_request, new_conversation, tool_call, tool_turn, Snapshot,
};
use turnstile_testkit::postgres::durability::inspect_pool;
use turnstile_testkit::postgres::{database_url, fresh_options};

/// The database as the build before 0027 left it: every folded run back in
/// `runs`, its checkpoints in `loop_checkpoints`, 0027 not applied.
const UNDO_0027: [&str; 11] = [
    "INSERT INTO runs (conversation_id, run_id, request_id, status, error, started_at, ended_at)
     SELECT conversation_id, request_id, request_id, run_status, run_error, created_at,
         run_ended_at
     FROM requests WHERE run_status IS NOT NULL",
    "INSERT INTO loop_checkpoints (conversation_id, run_id, turn, phase, input_tokens,
         output_tokens, cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count,
         message_count, created_at)
     SELECT conversation_id, request_id, turn, phase, input_tokens, output_tokens,
         cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count, message_count,
         created_at
     FROM first_run_checkpoints",
    "INSERT INTO loop_checkpoints (conversation_id, run_id, turn, phase, input_tokens,
         output_tokens, cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count,
         message_count, created_at)
     SELECT conversation_id, request_id, turn, phase, input_tokens, output_tokens,
         cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count, message_count,
         checkpoint_at
     FROM requests WHERE phase IS NOT NULL",
    "DROP VIEW all_checkpoints",
    "DROP VIEW all_runs",
    "DROP TABLE first_run_checkpoints",
    "DROP TRIGGER event_first_run_stopped ON requests",
    "DROP FUNCTION event_first_run_stopped()",
    "DROP FUNCTION turnstile_row_moved()",
    "ALTER TABLE requests DROP COLUMN run_status, DROP COLUMN run_error,
         DROP COLUMN run_ended_at, DROP COLUMN turn, DROP COLUMN phase,
         DROP COLUMN input_tokens, DROP COLUMN output_tokens, DROP COLUMN cache_read_tokens,
         DROP COLUMN cache_write_tokens, DROP COLUMN tool_calls_count,
         DROP COLUMN reports_count, DROP COLUMN message_count, DROP COLUMN checkpoint_at",
    "DELETE FROM _sqlx_migrations WHERE version = 27",
];

#[tokio::test]
async fn a_one_turn_request_writes_one_bookkeeping_row() {
    let options = fresh_options();
    let schema = options.schema.clone().expect("schema");
    let store = PostgresStore::connect_with(options).await.expect("connect");
    let conversation = new_conversation(&store).await.expect("conversation");
    let (fence, outcome) = complete_request(&store, conversation, "hello", 0, "hi")
        .await
        .expect("a one-turn request");
    let (tool_fence, _) = complete_request(&store, conversation, "look it up", 2, "found")
        .await
        .expect("a request of two tool turns");

    let pool = inspect_pool(database_url(), &schema);
    assert_eq!(rows(&pool, "runs").await, 0);
    assert_eq!(rows(&pool, "loop_checkpoints").await, 0);
    // The tool request's turns before its committed one, 1 and 2, each at
    // its last phase.
    assert_eq!(rows(&pool, "first_run_checkpoints").await, 2);

    let run = store.run(fence.run_id).await.expect("run").expect("a run");
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(run.request_id, fence.request_id);
    let checkpoints = store.checkpoints(fence.run_id).await.expect("checkpoints");
    assert_eq!(checkpoints.len(), 1);
    assert_eq!(checkpoints[0].phase, CheckpointPhase::Completed);
    let replayed = store.request(fence.request_id).await.expect("request");
    assert_eq!(replayed.and_then(|r| r.outcome), Some(outcome));
    assert_eq!(turns(&store, tool_fence.run_id).await, [1, 2, 3]);
    pool.close().await;
    store.close().await;
}

#[tokio::test]
async fn runs_written_before_0027_read_as_before_and_a_held_request_commits() {
    let options = fresh_options();
    let schema = options.schema.clone().expect("schema");
    let store = PostgresStore::connect_with(options.clone())
        .await
        .expect("connect");
    let conversation = new_conversation(&store).await.expect("conversation");
    let (done, _) = complete_request(&store, conversation, "first", 1, "first answer")
        .await
        .expect("a committed request");
    let held = admit(&store, conversation, "second").await.expect("held");
    let count = tool_turn(&store, &held, 1, 1, tool_call("c1", "{}"), "r1")
        .await
        .expect("a tool turn");
    let requests = [done.request_id, held.request_id];
    let runs = [done.run_id, held.run_id];
    let before = Snapshot::take(&store, conversation, &requests, &runs, 2)
        .await
        .expect("snapshot");
    store.close().await;

    let pool = inspect_pool(database_url(), &schema);
    for sql in UNDO_0027 {
        sqlx::query(sql).execute(&pool).await.expect(sql);
    }
    assert_eq!(rows(&pool, "runs").await, 2);

    let store = PostgresStore::connect_with(options)
        .await
        .expect("migrated");
    let after = Snapshot::take(&store, conversation, &requests, &runs, 2)
        .await
        .expect("snapshot");
    assert_eq!(after, before);
    assert_eq!(rows(&pool, "runs").await, 2, "the migration copies nothing");

    let count = tool_turn(&store, &held, 2, count, tool_call("c2", "{}"), "r2")
        .await
        .expect("the held request's next turn");
    let outcome = commit_answer(&store, &held, 3, count, "second answer")
        .await
        .expect("the held request commits");
    assert_eq!(outcome.run_id, held.run_id);
    assert_eq!(turns(&store, held.run_id).await, [1, 2, 3]);
    let replayed = store.request(held.request_id).await.expect("request");
    assert_eq!(replayed.and_then(|r| r.outcome), Some(outcome));
    let (next, _) = complete_request(&store, conversation, "third", 0, "third answer")
        .await
        .expect("the next request");
    assert_eq!(
        rows(&pool, "runs").await,
        2,
        "a new request's run is folded"
    );
    let run = store.run(next.run_id).await.expect("run").expect("a run");
    assert_eq!(run.status, RunStatus::Completed);
    pool.close().await;
    store.close().await;
}

async fn rows(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
        .fetch_one(pool)
        .await
        .expect("count")
}

/// The turns of `run`'s checkpoints, oldest first.
async fn turns(store: &PostgresStore, run: RunId) -> Vec<u32> {
    store
        .checkpoints(run)
        .await
        .expect("checkpoints")
        .iter()
        .map(|c| c.turn)
        .collect()
}
