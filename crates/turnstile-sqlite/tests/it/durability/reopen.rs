//! What a file database keeps across a close and reopen, and how it is
//! created.

use turnstile::{SqliteStore, Store};

use turnstile_conformance::support::{
    admit, commit_answer, complete_request, new_conversation, recover, tool_call, tool_turn,
    Snapshot, TestResult,
};

#[tokio::test]
async fn reopened_database_keeps_every_committed_row_and_checkpoint() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("reopen.db");
    let store = SqliteStore::open(&path).await?;

    // A conversation of three committed requests...
    let done = new_conversation(&store).await?;
    let mut done_requests = Vec::new();
    let mut done_runs = Vec::new();
    for turns in 0..3 {
        let input = format!("question {turns}");
        let (fence, _) = complete_request(&store, done, &input, turns, "answer").await?;
        done_requests.push(fence.request_id);
        done_runs.push(fence.run_id);
    }
    // ...and one with a request in flight, recovered once, mid-turn.
    let open = new_conversation(&store).await?;
    let first = admit(&store, open, "long job").await?;
    let count = tool_turn(&store, &first, 1, 1, tool_call("c1", "{}"), "one").await?;
    let owner = recover(&store, &first).await?;
    let count = tool_turn(&store, &owner, 2, count, tool_call("c2", "{}"), "two").await?;
    let open_runs = [first.run_id, owner.run_id];

    let done_before = Snapshot::take(&store, done, &done_requests, &done_runs, 3).await?;
    let open_before = Snapshot::take(&store, open, &[first.request_id], &open_runs, 3).await?;
    assert_eq!(done_before.transcript.len(), 2 + 4 + 6);
    assert_eq!(
        open_before.checkpoints[1].len(),
        2,
        "seeded turn 1 and turn 2"
    );
    drop(store);

    let store = SqliteStore::open(&path).await?;
    let done_after = Snapshot::take(&store, done, &done_requests, &done_runs, 3).await?;
    let open_after = Snapshot::take(&store, open, &[first.request_id], &open_runs, 3).await?;
    assert_eq!(done_after, done_before);
    assert_eq!(open_after, open_before);

    // The owner's fence survived too: it commits after the reopen.
    let outcome = commit_answer(&store, &owner, 3, count, "finally").await?;
    assert_eq!(outcome.end_seq, count + 1);
    assert_eq!(store.admission(open).await?.active, None);
    Ok(())
}

#[cfg(unix)]
#[tokio::test]
async fn new_database_file_is_readable_by_its_owner_only() -> TestResult {
    use std::os::unix::fs::PermissionsExt;

    let dir = tempfile::tempdir()?;
    let path = dir.path().join("private.db");
    let store = SqliteStore::open(&path).await?;
    // Write something so the WAL exists and holds data.
    new_conversation(&store).await?;
    let mode = |p: &std::path::Path| -> std::io::Result<u32> {
        Ok(std::fs::metadata(p)?.permissions().mode() & 0o777)
    };
    assert_eq!(mode(&path)?, 0o600, "database file");
    let wal = path.with_extension("db-wal");
    assert!(wal.exists(), "a WAL database has a -wal file while open");
    assert_eq!(mode(&wal)?, 0o600, "-wal file");
    let shm = path.with_extension("db-shm");
    assert_eq!(mode(&shm)?, 0o600, "-shm file");
    Ok(())
}

#[tokio::test]
async fn a_closed_store_leaves_the_database_file_alone_complete_and_refuses_later_calls(
) -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("closed.db");
    let store = SqliteStore::open(&path).await?;
    let conversation = new_conversation(&store).await?;
    let (done, _) = complete_request(&store, conversation, "question", 1, "answer").await?;
    let held = admit(&store, conversation, "in flight").await?;
    let requests = [done.request_id, held.request_id];
    let runs = [done.run_id, held.run_id];
    let before = Snapshot::take(&store, conversation, &requests, &runs, 2).await?;
    let clone = store.clone();
    store.close().await?;

    let names: Vec<String> = std::fs::read_dir(dir.path())?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    assert_eq!(names, ["closed.db"], "no -wal or -shm beside the file");
    // Every clone is closed: a write or a read is an error, not a panic.
    assert!(matches!(
        clone
            .ensure_conversation(
                &turnstile_conformance::support::ns(),
                turnstile::ConversationId::new()
            )
            .await,
        Err(turnstile::Error::Store(_))
    ));
    assert!(clone.admission(conversation).await.is_err());

    // The file alone, copied, holds every committed row.
    let copy = dir.path().join("copy.db");
    std::fs::copy(&path, &copy)?;
    let reopened = SqliteStore::open(&copy).await?;
    assert_eq!(
        Snapshot::take(&reopened, conversation, &requests, &runs, 2).await?,
        before
    );
    Ok(())
}
