//! Group commit on a WAL file: steps of many sessions that wait for the
//! writer together are committed in one transaction, a fenced step among them
//! fails alone, and every caller is answered only once its step is durable.
//!
//! To make the crowd certain, another connection holds the write lock while
//! the steps are sent: they all queue behind the writer's first transaction
//! and form the next batch. The writer's trace events say how many steps each
//! transaction committed.

use std::sync::Arc;
use std::time::Duration;

use sqlx::{Connection, SqliteConnection};
use turnstile::{CheckpointPhase, Error, SqliteStore, Store};
use turnstile_conformance::logs::LogBuffer;
use turnstile_conformance::support::{admit, checkpoint, new_conversation, recover, TestResult};

/// The (steps, failed) counts of the group transactions logged so far.
fn batches(logs: &LogBuffer) -> Vec<(usize, usize)> {
    let text = logs.text();
    let field = |line: &str, name: &str| -> Option<usize> {
        let at = line.find(name)? + name.len();
        line[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    text.lines()
        .filter(|line| line.contains("group transaction committed"))
        .filter_map(|line| Some((field(line, "steps=")?, field(line, "failed=")?)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowd_of_steps_commits_together_and_a_fenced_step_fails_alone() -> TestResult {
    let logs = LogBuffer::default();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(logs.clone())
            .with_ansi(false)
            .finish(),
    )?;
    const LIVE: usize = 24;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("group.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).await?);

    let mut live = Vec::new();
    for _ in 0..LIVE {
        let conversation = new_conversation(store.as_ref()).await?;
        live.push(admit(store.as_ref(), conversation, "live").await?);
    }
    // A zombie: its request was taken over by another run.
    let conversation = new_conversation(store.as_ref()).await?;
    let zombie = admit(store.as_ref(), conversation, "zombie").await?;
    let successor = recover(store.as_ref(), &zombie).await?;

    // Another process holds the write lock: the first step waits at BEGIN,
    // everything sent after it queues behind.
    let mut holder = SqliteConnection::connect(&format!("sqlite:{}", path.display())).await?;
    sqlx::query("BEGIN IMMEDIATE").execute(&mut holder).await?;
    let first = tokio::spawn({
        let (store, fence) = (store.clone(), live[0]);
        async move {
            let cp = checkpoint(fence.run_id, 1, CheckpointPhase::TurnInFlight, 1);
            store.begin_turn(&fence, &cp).await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut crowd = Vec::new();
    for fence in live[1..].iter().copied() {
        let store = store.clone();
        crowd.push(tokio::spawn(async move {
            let cp = checkpoint(fence.run_id, 1, CheckpointPhase::TurnInFlight, 1);
            store.begin_turn(&fence, &cp).await
        }));
    }
    let fenced = tokio::spawn({
        let store = store.clone();
        async move {
            let cp = checkpoint(zombie.run_id, 1, CheckpointPhase::TurnInFlight, 1);
            store.begin_turn(&zombie, &cp).await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Nobody was answered while the writer waited for the lock.
    assert!(!first.is_finished());
    assert!(crowd.iter().all(|task| !task.is_finished()));
    assert!(!fenced.is_finished());
    sqlx::query("COMMIT").execute(&mut holder).await?;

    first.await??;
    for task in crowd {
        task.await??;
    }
    match fenced.await? {
        Err(Error::Fenced { run_id, revision }) => {
            assert_eq!((run_id, revision), (zombie.run_id, zombie.revision));
        }
        other => panic!("expected the zombie to be fenced, got {other:?}"),
    }

    // Every live step is durable and visible to a new connection; the
    // zombie wrote nothing and the successor is untouched.
    let mut reader = SqliteConnection::connect(&format!("sqlite:{}", path.display())).await?;
    for fence in &live {
        let (turn, phase): (i64, String) = sqlx::query_as(
            "SELECT turn, phase FROM loop_checkpoints WHERE run_id = ?1 ORDER BY turn DESC LIMIT 1",
        )
        .bind(fence.run_id.as_uuid())
        .fetch_one(&mut reader)
        .await?;
        assert_eq!((turn, phase.as_str()), (1, "turn_in_flight"));
    }
    let zombie_rows: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM loop_checkpoints WHERE run_id = ?1")
            .bind(zombie.run_id.as_uuid())
            .fetch_one(&mut reader)
            .await?;
    assert_eq!(zombie_rows, 0);
    let admission = store.admission(conversation).await?;
    assert_eq!(admission.revision, successor.revision);
    assert_eq!(
        admission.active.map(|a| a.run_id),
        Some(successor.run_id),
        "the zombie's step moved the admission"
    );

    // The crowd (all live steps but the first) and the zombie's step shared
    // one transaction, in which the zombie's step alone was rolled back.
    let batches = batches(&logs);
    assert!(
        batches.contains(&(LIVE, 1)),
        "no group transaction of {LIVE} steps with 1 failed in {batches:?}"
    );
    Ok(())
}
