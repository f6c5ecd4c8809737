//! The transcript window of `claim_context` arrives as one JSON array from
//! SQLite. What the transcript holds arrives through it as the
//! row-per-entry reads (`transcript_range`, `transcript_window`) read it,
//! and an entry that cannot be decoded is a typed `Corrupt` error, not a
//! panic.

use sqlx::{Connection, SqliteConnection};
use turnstile::{Error, RequestId, SqliteStore, Store};
use turnstile_conformance::support::{complete_request, new_conversation, ns, TestResult};

#[tokio::test]
async fn the_claim_window_carries_every_text_the_transcript_holds() -> TestResult {
    let store = SqliteStore::in_memory().await?;
    let id = new_conversation(&store).await?;
    let awkward = "nul \u{0} bidi \u{202e} \"quoted\" back\\slash\u{1}\ttab 😀 é";
    complete_request(
        &store,
        id,
        &format!("{awkward} q"),
        1,
        &format!("{awkward} a"),
    )
    .await?;
    complete_request(&store, id, "plain", 0, "").await?;

    let context = store
        .claim_context(&ns(), id, RequestId::new(), Some(50))
        .await?;
    let rows = store.transcript_range(id, 0, 6).await?;
    assert_eq!(context.window, rows);
    assert_eq!(store.transcript_window(id, 50).await?, rows);
    assert_eq!(store.transcript_window(id, 2).await?, rows[4..]);
    let texts: Vec<&str> = context.window.iter().map(|e| e.message.content()).collect();
    assert_eq!(texts.len(), 6);
    assert_eq!(texts[0], format!("{awkward} q"));
    assert_eq!(texts[3], format!("{awkward} a"));
    assert_eq!(texts[4..], ["plain", ""]);
    Ok(())
}

#[tokio::test]
async fn an_undecodable_window_entry_is_corrupt_not_a_panic() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("window.db");
    let store = SqliteStore::open(&path).await?;
    let id = new_conversation(&store).await?;
    complete_request(&store, id, "q", 0, "a").await?;
    let mut raw = SqliteConnection::connect(&format!("sqlite:{}", path.display())).await?;
    sqlx::query("UPDATE transcript SET request_id = x'0102' WHERE seq = 1")
        .execute(&mut raw)
        .await?;
    raw.close().await?;

    match store
        .claim_context(&ns(), id, RequestId::new(), Some(10))
        .await
    {
        Err(Error::Corrupt { table, .. }) => assert_eq!(table, "transcript"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    match store.transcript_window(id, 10).await {
        Err(Error::Corrupt { table, .. }) => assert_eq!(table, "transcript"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // The entry before it still reads.
    assert_eq!(store.transcript_range(id, 0, 1).await?.len(), 1);
    Ok(())
}
