//! Two steps of one run that wait for the admission's lock together (a
//! first attempt still running on the server when the run's next step
//! starts): the second statement read the request's row before the first
//! committed. A run kept in its request's row (migration 0027) is not
//! written back from that stale read: a step sent as one statement stops
//! as a serialization failure and the store runs it again on a fresh one,
//! and a commit in a transaction reads the row only once it holds the
//! admission's lock; either way the first step's checkpoints stay and the
//! turn's end is logged once.

use std::future::Future;
use std::time::Duration;

use sqlx::PgPool;
use turnstile::checkpoint::CheckpointPhase;
use turnstile::store::{Fence, LoggedStep, RunStatus};
use turnstile::{ConversationId, Error, Message, PostgresStore, Store};
use turnstile_conformance::support::{admit, checkpoint, commit_answer, new_conversation};
use turnstile_testkit::postgres::durability::inspect_pool;
use turnstile_testkit::postgres::{database_url, fresh_options};

#[tokio::test]
async fn a_failure_that_waited_behind_a_turns_end_keeps_the_next_turn() {
    let (store, conversation, fence) = behind_a_turns_end(|store, fence| async move {
        let settled = checkpoint(fence.run_id, 1, CheckpointPhase::Ready, 1);
        store
            .fail_run(&fence, "the model went away", Some(&settled))
            .await
    })
    .await;
    assert_eq!(
        shape(&store, &fence).await,
        [
            (1, CheckpointPhase::Ready),
            (2, CheckpointPhase::TurnInFlight)
        ],
        "the turn's end and the next turn's write-ahead are kept"
    );
    let stopped = store.run(fence.run_id).await.expect("run").expect("a run");
    assert_eq!(stopped.status, RunStatus::Failed);
    assert_eq!(turn_ends(&store, conversation).await, 1, "logged once");
    store.close().await;
}

#[tokio::test]
async fn a_commit_that_waited_behind_a_turns_end_keeps_that_turns_end() {
    let (store, conversation, fence) = behind_a_turns_end(|store, fence| async move {
        commit_answer(&store, &fence, 2, 1, "done").await.map(drop)
    })
    .await;
    assert_eq!(
        shape(&store, &fence).await,
        [(1, CheckpointPhase::Ready), (2, CheckpointPhase::Completed)],
        "the turn's end stays as it was written"
    );
    let done = store.run(fence.run_id).await.expect("run").expect("a run");
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(turn_ends(&store, conversation).await, 1, "logged once");
    store.close().await;
}

#[tokio::test]
async fn a_lone_commit_that_waited_behind_a_turns_end_is_run_again_on_a_fresh_read() {
    // No report, at the turn the row held when it started: the commit's one
    // statement, sent alone, whose read of the row the turn's end made stale.
    let (store, conversation, fence) = behind_a_turns_end(|store, fence| async move {
        let mut last = checkpoint(fence.run_id, 1, CheckpointPhase::Ready, 2);
        last.verification_reports.clear();
        store
            .commit(&fence, &last, &Message::assistant("early"))
            .await
            .map(drop)
    })
    .await;
    assert_eq!(
        shape(&store, &fence).await,
        [
            (1, CheckpointPhase::Completed),
            (2, CheckpointPhase::TurnInFlight)
        ],
        "run again on a fresh read, it commits below the row's turn: the turn's end and the \
         next turn's write-ahead are kept"
    );
    assert_eq!(turn_ends(&store, conversation).await, 1, "logged once");
    store.close().await;
}

/// A run at turn 1; with the admission's lock held elsewhere, its turn's
/// end (and turn 2's write-ahead) starts, then `second`; both wait for the
/// lock, and run in that order once it is released.
async fn behind_a_turns_end<F, R>(second: F) -> (PostgresStore, ConversationId, Fence)
where
    F: FnOnce(PostgresStore, Fence) -> R,
    R: Future<Output = Result<(), Error>> + Send + 'static,
{
    let options = fresh_options();
    let schema = options.schema.clone().expect("schema");
    let store = PostgresStore::connect_with(options).await.expect("connect");
    let conversation = new_conversation(&store).await.expect("conversation");
    let fence = admit(&store, conversation, "two steps at once")
        .await
        .expect("admitted");
    let run = fence.run_id;
    store
        .begin_turn(
            &fence,
            &checkpoint(run, 1, CheckpointPhase::TurnInFlight, 1),
        )
        .await
        .expect("turn 1 begins");

    let inspector = inspect_pool(database_url(), &schema);
    let mut holder = inspector.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM admissions WHERE conversation_id = $1 FOR UPDATE")
        .bind(conversation.as_uuid())
        .execute(&mut *holder)
        .await
        .expect("lock the admission");
    let holder_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *holder)
        .await
        .expect("the holder's backend");
    let finishing = {
        let store = store.clone();
        tokio::spawn(async move {
            let ready = checkpoint(run, 1, CheckpointPhase::Ready, 1);
            let next = checkpoint(run, 2, CheckpointPhase::TurnInFlight, 1);
            store.finish_turn(&fence, &ready, &[], Some(&next)).await
        })
    };
    waiting_behind(&inspector, holder_pid, 1).await;
    let second = tokio::spawn(second(store.clone(), fence));
    waiting_behind(&inspector, holder_pid, 2).await;
    holder.commit().await.expect("release the lock");
    finishing
        .await
        .expect("the turn's end task")
        .expect("the turn ends");
    second
        .await
        .expect("the second step's task")
        .expect("the second step");
    inspector.close().await;
    (store, conversation, fence)
}

/// Waits until `n` backends wait behind `holder`, directly or behind one
/// that does.
async fn waiting_behind(pool: &PgPool, holder: i32, n: i64) {
    for _ in 0..500 {
        let waiting: i64 = sqlx::query_scalar(
            "WITH RECURSIVE behind (pid) AS (
                 SELECT pid FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))
                 UNION
                 SELECT a.pid FROM pg_stat_activity a, behind b
                 WHERE b.pid = ANY (pg_blocking_pids(a.pid))
             )
             SELECT COUNT(*) FROM behind",
        )
        .bind(holder)
        .fetch_one(pool)
        .await
        .expect("read the waiting backends");
        if waiting >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{n} steps never waited for the admission's lock");
}

async fn shape(store: &PostgresStore, fence: &Fence) -> Vec<(u32, CheckpointPhase)> {
    store
        .checkpoints(fence.run_id)
        .await
        .expect("checkpoints")
        .iter()
        .map(|c| (c.turn, c.phase))
        .collect()
}

/// How many times turn 1's end is logged.
async fn turn_ends(store: &PostgresStore, conversation: ConversationId) -> usize {
    store
        .events_after(conversation, 0, u32::MAX)
        .await
        .expect("events")
        .into_iter()
        .filter(|e| matches!(e.step, LoggedStep::CheckpointSaved { turn: 1, .. }))
        .count()
}
