//! What the workload left on disk, through the operations contract: the
//! store is closed (its write-ahead log folded into the database), then
//! reopened and asked what it occupies.

use std::path::Path;

use turnstile::{SqliteStore, StoreAdmin};

/// What an in-memory store holds after the workload: its pages in use.
pub(super) async fn in_memory(
    store: &SqliteStore,
    (message_text_bytes, image_bytes): (u64, u64),
) -> Result<Storage, CliError> {
    let report = store.storage().await?;
    Ok(Storage {
        message_text_bytes,
        image_bytes,
        details: report.details,
        bytes_in_use: report.bytes_in_use,
        bytes_per_message_byte: report.bytes_in_use as f64
            / (message_text_bytes + image_bytes).max(1) as f64,
        file_bytes: 0,
        wal_bytes: 0,
        wal_checkpoint_complete: true,
    })
}

use super::report::Storage;
use crate::cli::exit::CliError;

pub(super) async fn measure(
    store: &SqliteStore,
    db: &Path,
    (message_text_bytes, image_bytes): (u64, u64),
) -> Result<Storage, CliError> {
    let wal_checkpoint_complete = match store.close().await {
        Ok(()) => true,
        Err(turnstile::Error::Store(e)) if e.is_busy() => false,
        Err(e) => return Err(e.into()),
    };
    let reopened = SqliteStore::open(db).await?;
    let report = reopened.storage().await?;
    reopened.close().await?;
    Ok(Storage {
        message_text_bytes,
        image_bytes,
        details: report.details,
        bytes_in_use: report.bytes_in_use,
        bytes_per_message_byte: report.bytes_in_use as f64
            / (message_text_bytes + image_bytes).max(1) as f64,
        file_bytes: report.database_bytes,
        wal_bytes: report.wal_bytes,
        wal_checkpoint_complete,
    })
}
