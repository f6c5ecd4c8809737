//! A step whose statement goes through but whose commit fails is answered
//! with the error, and nothing of it stays. The writer sends a lone step as
//! its statement alone (no `BEGIN`/`COMMIT`), so SQLite commits it when the
//! statement ends; a step whose statement returns a row (`RETURNING`) must
//! still see that end. The failing commit is made with a deferred foreign
//! key, which SQLite checks only when the transaction commits: a trigger on
//! a table the step writes adds a row that breaks it.

use std::path::Path;

use sqlx::{Connection, SqliteConnection};
use turnstile::CheckpointPhase;
use turnstile::{Error, Message, SqliteStore, Store};
use turnstile_conformance::support::{
    admit, checkpoint, new_conversation, new_request, TestResult,
};

/// Makes every commit of a transaction that writes `table` fail.
async fn break_commits_writing(path: &Path, table: &str, event: &str) -> TestResult {
    let mut raw = SqliteConnection::connect(&format!("sqlite:{}", path.display())).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS broken_at_commit (
             ref BLOB REFERENCES conversations (id) DEFERRABLE INITIALLY DEFERRED)",
    )
    .execute(&mut raw)
    .await?;
    sqlx::query(&format!(
        "CREATE TRIGGER break_{table} AFTER {event} ON {table}
         BEGIN INSERT INTO broken_at_commit VALUES (x'00'); END"
    ))
    .execute(&mut raw)
    .await?;
    raw.close().await?;
    Ok(())
}

#[tokio::test]
async fn a_lone_claim_whose_commit_fails_is_refused_and_leaves_nothing() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("commit.db");
    let store = SqliteStore::open(&path).await?;
    let conversation = new_conversation(&store).await?;
    let before = store.admission(conversation).await?;
    break_commits_writing(&path, "requests", "INSERT").await?;

    let claim = new_request(conversation, before.revision, "hello");
    match store.claim(&claim).await {
        Err(Error::Store(e)) => assert!(e.message().contains("FOREIGN KEY"), "{e}"),
        other => panic!("expected the failed commit, got {other:?}"),
    }
    assert_eq!(
        store.admission(conversation).await?,
        before,
        "the claim stayed"
    );
    assert_eq!(store.request(claim.request_id).await?, None);
    Ok(())
}

#[tokio::test]
async fn a_lone_commit_whose_commit_fails_is_refused_and_the_request_stays_held() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("commit.db");
    let store = SqliteStore::open(&path).await?;
    let conversation = new_conversation(&store).await?;
    let fence = admit(&store, conversation, "hello").await?;
    break_commits_writing(&path, "transcript", "INSERT").await?;

    let last = checkpoint(fence.run_id, 1, CheckpointPhase::Ready, 2);
    match store.commit(&fence, &last, &Message::assistant("hi")).await {
        Err(Error::Store(e)) => assert!(e.message().contains("FOREIGN KEY"), "{e}"),
        other => panic!("expected the failed commit, got {other:?}"),
    }
    let admission = store.admission(conversation).await?;
    assert_eq!(admission.revision, fence.revision);
    assert_eq!(
        admission.active.map(|a| a.request_id),
        Some(fence.request_id)
    );
    assert!(store.transcript_window(conversation, 10).await?.is_empty());
    let request = store.request(fence.request_id).await?.expect("the request");
    assert!(request.outcome.is_none(), "{request:?}");
    Ok(())
}

#[tokio::test]
async fn a_lone_turn_write_whose_commit_fails_is_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("commit.db");
    let store = SqliteStore::open(&path).await?;
    let conversation = new_conversation(&store).await?;
    let fence = admit(&store, conversation, "hello").await?;
    break_commits_writing(&path, "requests", "UPDATE").await?;

    let ahead = checkpoint(fence.run_id, 1, CheckpointPhase::TurnInFlight, 1);
    match store.begin_turn(&fence, &ahead).await {
        Err(Error::Store(e)) => assert!(e.message().contains("FOREIGN KEY"), "{e}"),
        other => panic!("expected the failed commit, got {other:?}"),
    }
    assert!(store.checkpoints(fence.run_id).await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn a_lone_abandon_whose_commit_fails_is_refused_and_the_request_stays_held() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("commit.db");
    let store = SqliteStore::open(&path).await?;
    let conversation = new_conversation(&store).await?;
    let fence = admit(&store, conversation, "hello").await?;
    break_commits_writing(&path, "requests", "UPDATE").await?;

    match store
        .abandon(conversation, fence.request_id, fence.revision)
        .await
    {
        Err(Error::Store(e)) => assert!(e.message().contains("FOREIGN KEY"), "{e}"),
        other => panic!("expected the failed commit, got {other:?}"),
    }
    let admission = store.admission(conversation).await?;
    assert_eq!(admission.revision, fence.revision);
    assert_eq!(
        admission.active.map(|a| a.request_id),
        Some(fence.request_id)
    );
    Ok(())
}
