//! `doctor` finds a stored blob that no row names by reading the rows, not
//! the reference counts: a blob written behind the store's back, with a
//! count that claims a reference, is reported.

use std::time::Duration;

use sqlx::{Connection, SqliteConnection};
use turnstile::{SqliteStore, StoreAdmin};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

#[tokio::test]
async fn doctor_reports_a_blob_no_row_names_whatever_its_count_says() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("orphan.db");
    let store = SqliteStore::open(&path).await?;
    let report = store.doctor(Duration::from_secs(60)).await?;
    assert_eq!(
        (report.blobs, report.unreferenced_blobs),
        (Some(0), Some(0))
    );
    store.close().await?;

    let mut raw = SqliteConnection::connect(&format!("sqlite:{}", path.display())).await?;
    sqlx::query("INSERT INTO blobs (sha256, size, refs) VALUES (?1, 3, 1)")
        .bind("ab".repeat(32))
        .execute(&mut raw)
        .await?;
    sqlx::query("INSERT INTO blob_bytes (sha256, bytes) VALUES (?1, x'010203')")
        .bind("ab".repeat(32))
        .execute(&mut raw)
        .await?;
    raw.close().await?;

    let store = SqliteStore::open(&path).await?;
    let report = store.doctor(Duration::from_secs(60)).await?;
    assert_eq!(
        (report.blobs, report.blob_bytes, report.unreferenced_blobs),
        (Some(1), Some(3), Some(1))
    );
    store.close().await?;
    Ok(())
}
