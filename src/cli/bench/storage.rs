//! What the workload left on disk, read on a connection of its own once the
//! store is closed: the write-ahead log is checkpointed into the file, then
//! the pages in use are counted. PRAGMAs are runtime queries (the offline
//! query macros cannot describe them).

use std::path::Path;
use std::time::Duration;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection, SqliteConnection};

use super::report::Storage;
use crate::cli::exit::CliError;

pub(super) async fn measure(db: &Path, message_text_bytes: u64) -> Result<Storage, CliError> {
    let mut conn = SqliteConnectOptions::new()
        .filename(db)
        .busy_timeout(Duration::from_secs(30))
        .connect()
        .await
        .map_err(failed("open the database to measure it"))?;
    // TRUNCATE waits (up to the busy timeout) for readers, copies every
    // logged page into the file and empties the log.
    let (busy, _, _): (i64, i64, i64) = sqlx::query_as("PRAGMA wal_checkpoint(TRUNCATE)")
        .fetch_one(&mut conn)
        .await
        .map_err(failed("checkpoint the write-ahead log"))?;
    let page_size = pragma(&mut conn, "PRAGMA page_size").await?;
    let page_count = pragma(&mut conn, "PRAGMA page_count").await?;
    let freelist_count = pragma(&mut conn, "PRAGMA freelist_count").await?;
    conn.close()
        .await
        .map_err(failed("close the measuring connection"))?;
    let bytes_in_use = page_count.saturating_sub(freelist_count) * page_size;
    let file_size = |path: &Path| std::fs::metadata(path).map_or(0, |m| m.len());
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    Ok(Storage {
        message_text_bytes,
        page_size,
        page_count,
        freelist_count,
        bytes_in_use,
        bytes_per_message_byte: bytes_in_use as f64 / message_text_bytes.max(1) as f64,
        file_bytes: file_size(db),
        wal_bytes: file_size(Path::new(&wal)),
        wal_checkpoint_complete: busy == 0,
    })
}

async fn pragma(conn: &mut SqliteConnection, pragma: &str) -> Result<u64, CliError> {
    let value: i64 = sqlx::query_scalar(pragma)
        .fetch_one(conn)
        .await
        .map_err(failed(pragma))?;
    u64::try_from(value).map_err(|_| CliError::Failed(format!("{pragma} returned {value}")))
}

fn failed(what: &str) -> impl FnOnce(sqlx::Error) -> CliError + '_ {
    move |e| CliError::Failed(format!("{what}: {e}"))
}
