//! The transcript window of `claim_context` arrives as one value from
//! SQLite, its entries one after another. What the transcript holds arrives
//! through it as the row-per-entry reads (`transcript_range`,
//! `transcript_window`) read it, and an entry that cannot be decoded is a
//! typed `Corrupt` error, not a panic.

use std::path::Path;

use sqlx::{Connection, SqliteConnection};
use turnstile::{ConversationId, Error, RequestId, SqliteStore, Store};
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
    let texts: Vec<_> = context.window.iter().map(|e| e.message.text()).collect();
    assert_eq!(texts.len(), 6);
    assert_eq!(texts[0], format!("{awkward} q"));
    assert_eq!(texts[3], format!("{awkward} a"));
    assert_eq!(texts[4..], ["plain", ""]);

    // A shorter window is the newest entries, oldest first; none is none.
    let two = store
        .claim_context(&ns(), id, RequestId::new(), Some(2))
        .await?;
    assert_eq!(two.window, rows[4..]);
    let none = store
        .claim_context(&ns(), id, RequestId::new(), Some(0))
        .await?;
    assert!(none.window.is_empty());
    assert!(none.admission.is_some());
    Ok(())
}

/// A file store whose conversation holds one committed request (entries 0
/// and 1), with `corruption` then applied by a connection of its own.
async fn corrupted(
    path: &Path,
    corruption: &str,
) -> Result<(SqliteStore, ConversationId), Box<dyn std::error::Error + Send + Sync>> {
    let store = SqliteStore::open(path).await?;
    let id = new_conversation(&store).await?;
    complete_request(&store, id, "q", 0, "a").await?;
    let mut raw = SqliteConnection::connect(&format!("sqlite:{}", path.display())).await?;
    sqlx::query(corruption).execute(&mut raw).await?;
    raw.close().await?;
    Ok((store, id))
}

#[tokio::test]
async fn a_text_another_client_stored_as_a_blob_reads_as_the_row_reads_read_it() -> TestResult {
    let dir = tempfile::tempdir()?;
    // 'a' alone, and a text whose first byte a JSONB reader would take for
    // a header.
    for text in ["a", "hello w"] {
        let path = dir.path().join(format!("blob-{}.db", text.len()));
        let (store, id) = corrupted(
            &path,
            &format!("UPDATE transcript SET content = CAST('{text}' AS BLOB) WHERE seq = 1"),
        )
        .await?;
        let context = store
            .claim_context(&ns(), id, RequestId::new(), Some(10))
            .await?;
        assert_eq!(context.window, store.transcript_window(id, 10).await?);
        assert_eq!(context.window[1].message.text(), text);
    }
    Ok(())
}

#[tokio::test]
async fn an_undecodable_window_entry_is_corrupt_not_a_panic() -> TestResult {
    let dir = tempfile::tempdir()?;
    let corruptions = [
        "UPDATE transcript SET request_id = x'0102' WHERE seq = 1",
        // (A text `seq` sorts after every integer, past the transcript's
        // length: no read takes it, as no read takes a deleted row.)
        "UPDATE transcript SET seq = 1.5 WHERE seq = 1",
        "UPDATE transcript SET seq = -5 WHERE seq = 1",
        "UPDATE transcript SET role = 'robot' WHERE seq = 1",
        "UPDATE transcript SET content = CAST(x'fffe41' AS TEXT) WHERE seq = 1",
    ];
    for (i, corruption) in corruptions.iter().enumerate() {
        let (store, id) = corrupted(&dir.path().join(format!("{i}.db")), corruption).await?;
        match store
            .claim_context(&ns(), id, RequestId::new(), Some(10))
            .await
        {
            Err(Error::Corrupt { table, .. }) => assert_eq!(table, "transcript", "{corruption}"),
            other => panic!("{corruption}: expected Corrupt, got {other:?}"),
        }
        // The entry before it still reads.
        assert_eq!(store.transcript_range(id, 0, 1).await?.len(), 1);
    }
    Ok(())
}
