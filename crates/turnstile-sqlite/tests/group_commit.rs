//! Group commit on a WAL file: steps of many sessions that wait for the
//! writer together are committed in one transaction, a fenced step among them
//! fails alone, and every caller is answered only once its step is durable.
//!
//! To make the crowd certain, another connection holds the write lock while
//! the steps are sent: they all queue behind the writer's first transaction
//! and form the next batch, in the order they were sent. The writer's trace
//! events say how many steps each transaction committed.
//!
//! The steps of a run's owner are one statement each and take no savepoint:
//! a refused one (fenced) is undone by SQLite alone; one that fails
//! otherwise (here an injected fault) rolls its whole transaction back.
//! Steps of several statements (a summary's commit) still run in a
//! savepoint of their own.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::{Connection, SqliteConnection};
use turnstile::store::{Fence, SummaryCommit, SummaryPass};
use turnstile::{CheckpointPhase, Error, SqliteStore, Store, Usage};
use turnstile_conformance::logs::LogBuffer;
use turnstile_conformance::support::{
    admit, checkpoint, complete_request, new_conversation, recover, TestResult,
};

/// The log of every test of this file (one subscriber per process).
fn logs() -> LogBuffer {
    static LOGS: OnceLock<LogBuffer> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = LogBuffer::default();
        tracing::subscriber::set_global_default(
            tracing_subscriber::fmt()
                .with_max_level(tracing::Level::TRACE)
                .with_writer(logs.clone())
                .with_ansi(false)
                .finish(),
        )
        .expect("the only subscriber");
        logs
    })
    .clone()
}

type Step = Pin<Box<dyn Future<Output = Result<(), Error>> + Send>>;

/// A turn's write-ahead of `fence`'s run, as a step to send.
fn write_ahead(store: &Arc<dyn Store>, fence: Fence) -> Step {
    let store = store.clone();
    Box::pin(async move {
        let cp = checkpoint(fence.run_id, 1, CheckpointPhase::TurnInFlight, 1);
        store.begin_turn(&fence, &cp).await
    })
}

/// Sends `crowd` while another connection holds the write lock of `path`:
/// a first step (`first`) waits for the lock, the crowd queues behind it in
/// order; nobody is answered until the lock is let go. Returns the first
/// step's result and the crowd's, in order.
async fn crowd_behind_a_lock(
    path: &Path,
    first: Step,
    crowd: Vec<Step>,
) -> Result<(Result<(), Error>, Vec<Result<(), Error>>), Box<dyn std::error::Error + Send + Sync>> {
    let mut holder = SqliteConnection::connect(&format!("sqlite:{}", path.display())).await?;
    sqlx::query("BEGIN IMMEDIATE").execute(&mut holder).await?;
    let first = tokio::spawn(first);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // One task polls the steps in order: each is queued at its first poll.
    let crowd = tokio::spawn(futures_util::future::join_all(crowd));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!first.is_finished(), "answered while the lock was held");
    assert!(!crowd.is_finished(), "answered while the lock was held");
    sqlx::query("COMMIT").execute(&mut holder).await?;
    Ok((first.await?, crowd.await?))
}

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

/// How many checkpoint rows a run has, read on a connection of its own.
async fn checkpoint_rows(path: &Path, fence: &Fence) -> Result<i64, sqlx::Error> {
    let mut reader = SqliteConnection::connect(&format!("sqlite:{}", path.display())).await?;
    sqlx::query_scalar("SELECT COUNT(*) FROM loop_checkpoints WHERE run_id = ?1")
        .bind(fence.run_id.as_uuid())
        .fetch_one(&mut reader)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowd_of_steps_commits_together_and_a_fenced_step_fails_alone() -> TestResult {
    let logs = logs();
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

    let mut crowd: Vec<Step> = live[1..].iter().map(|f| write_ahead(&store, *f)).collect();
    crowd.push(write_ahead(&store, zombie));
    let (first, mut crowd) =
        crowd_behind_a_lock(&path, write_ahead(&store, live[0]), crowd).await?;
    first?;
    match crowd.pop().expect("the zombie's step") {
        Err(Error::Fenced { run_id, revision }) => {
            assert_eq!((run_id, revision), (zombie.run_id, zombie.revision));
        }
        other => panic!("expected the zombie to be fenced, got {other:?}"),
    }
    for result in crowd {
        result?;
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
    // one transaction, in which SQLite undid the zombie's statement alone
    // (no savepoint).
    let batches = batches(&logs);
    assert!(
        batches.contains(&(LIVE, 1)),
        "no group transaction of {LIVE} steps with 1 failed in {batches:?}"
    );
    Ok(())
}

/// A step that fails with a store error (a fault injected on its run's
/// checkpoints) among others: no savepoint can undo it alone, so its whole
/// transaction is rolled back. The steps before it in that transaction are
/// told the error and wrote nothing; the steps after it commit in the next
/// transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_error_in_a_crowd_rolls_back_its_transaction_and_the_rest_goes_on() -> TestResult {
    let logs = logs();
    const BEFORE: usize = 5;
    const AFTER: usize = 7;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("group.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).await?);
    let mut fences = Vec::new();
    for _ in 0..BEFORE + 1 + AFTER + 1 {
        let conversation = new_conversation(store.as_ref()).await?;
        fences.push(admit(store.as_ref(), conversation, "live").await?);
    }
    let first = fences.pop().expect("the first step's");
    let faulty = fences[BEFORE];
    let run: String = faulty
        .run_id
        .as_uuid()
        .as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut raw = SqliteConnection::connect(&format!("sqlite:{}", path.display())).await?;
    sqlx::query(&format!(
        "CREATE TRIGGER fault BEFORE INSERT ON loop_checkpoints WHEN NEW.run_id = x'{run}' \
         BEGIN SELECT RAISE(ABORT, 'injected'); END"
    ))
    .execute(&mut raw)
    .await?;

    let crowd = fences.iter().map(|f| write_ahead(&store, *f)).collect();
    let (first_result, results) =
        crowd_behind_a_lock(&path, write_ahead(&store, first), crowd).await?;
    first_result?;
    for (i, (fence, result)) in fences.iter().zip(results).enumerate() {
        let rows = checkpoint_rows(&path, fence).await?;
        if i <= BEFORE {
            match result {
                Err(Error::Store(e)) => assert!(e.message().contains("injected"), "{i}: {e}"),
                other => panic!("step {i}: expected the injected error, got {other:?}"),
            }
            assert_eq!(rows, 0, "step {i} was rolled back and wrote nothing");
            // The admission still names the run: nothing moved it.
            let admission = store.admission(fence.conversation_id).await?;
            assert_eq!(admission.revision, fence.revision, "step {i}");
        } else {
            result?;
            assert_eq!(rows, 1, "step {i} is durable");
        }
    }
    // The steps after the faulty one made a transaction of their own.
    let batches = batches(&logs);
    assert!(
        batches.contains(&(AFTER, 0)),
        "no group transaction of {AFTER} steps in {batches:?}"
    );
    Ok(())
}

/// A summary's commit is several statements: in a crowd it runs in a
/// savepoint, and when it is refused after its first write (the fence
/// touches the admission's activity time, then the pass does not match the
/// one in flight), rolling back to the savepoint undoes that write and
/// nothing else: the crowd commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_summary_commit_in_a_crowd_is_rolled_back_to_its_savepoint() -> TestResult {
    let logs = logs();
    const LIVE: usize = 9;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("group.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).await?);
    let mut live = Vec::new();
    for _ in 0..LIVE + 1 {
        let conversation = new_conversation(store.as_ref()).await?;
        live.push(admit(store.as_ref(), conversation, "live").await?);
    }
    let first = live.pop().expect("the first step's");
    // A held request over two committed ones (entries 0..=3, version 2),
    // with a pass over entries 0..=3 in flight.
    let conversation = new_conversation(store.as_ref()).await?;
    for i in 0..2 {
        let (q, a) = (format!("question {i}"), format!("answer {i}"));
        complete_request(store.as_ref(), conversation, &q, 0, &a).await?;
    }
    let summarizing = admit(store.as_ref(), conversation, "summarize first").await?;
    let in_flight = SummaryPass {
        from_seq: 0,
        through_seq: 3,
        transcript_version: 2,
        prompt_sha256: [1; 32],
    };
    store.record_summary_pass(&summarizing, &in_flight).await?;
    let activity = || async {
        let mut reader = SqliteConnection::connect(&format!("sqlite:{}", path.display())).await?;
        sqlx::query_scalar::<_, i64>("SELECT updated_at FROM admissions WHERE conversation_id = ?1")
            .bind(conversation.as_uuid())
            .fetch_one(&mut reader)
            .await
    };
    let before = activity().await?;
    tokio::time::sleep(Duration::from_millis(5)).await;

    let mut crowd: Vec<Step> = live[..LIVE / 2]
        .iter()
        .map(|f| write_ahead(&store, *f))
        .collect();
    let other_pass = SummaryCommit {
        pass: SummaryPass {
            prompt_sha256: [2; 32],
            ..in_flight.clone()
        },
        content: "a summary of another pass".into(),
        usage: Usage::default(),
    };
    crowd.push({
        let store = store.clone();
        Box::pin(async move {
            store
                .commit_summary(&summarizing, &other_pass)
                .await
                .map(drop)
        })
    });
    crowd.extend(live[LIVE / 2..].iter().map(|f| write_ahead(&store, *f)));
    let (first_result, mut results) =
        crowd_behind_a_lock(&path, write_ahead(&store, first), crowd).await?;
    first_result?;
    let refused = results.remove(LIVE / 2);
    assert!(
        matches!(refused, Err(Error::Conflict { .. })),
        "expected a conflict, got {refused:?}"
    );
    for (fence, result) in live.iter().zip(results) {
        result?;
        assert_eq!(checkpoint_rows(&path, fence).await?, 1);
    }
    assert_eq!(activity().await?, before, "the refused step's write stayed");
    let admission = store.admission(conversation).await?;
    let active = admission.active.expect("held");
    assert_eq!(
        active.summary.pending,
        Some(in_flight),
        "the pass in flight"
    );
    assert_eq!(active.summary.passes, 0);
    let batches = batches(&logs);
    assert!(
        batches.contains(&(LIVE + 1, 1)),
        "no group transaction of {} steps with 1 failed in {batches:?}",
        LIVE + 1
    );
    Ok(())
}
