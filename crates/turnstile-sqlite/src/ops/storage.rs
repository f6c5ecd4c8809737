//! What a SQLite store occupies: pages in use, and the file and log sizes.

use turnstile_core::admin::StorageReport;
use turnstile_core::Error;

use super::doctor::{pragma_number, PAGE_PRAGMAS};
use super::prune::store_file_sizes;
use crate::SqliteStore;

/// `(page_count − freelist_count) × page_size`, read on one reader: the
/// page count includes what the write-ahead log holds, so no checkpoint is
/// needed first.
pub(super) async fn storage(store: &SqliteStore) -> Result<StorageReport, Error> {
    let mut conn = store.reader.acquire().await?;
    let mut errors = Vec::new();
    let mut pages = [0u64; 3];
    let mut details = std::collections::BTreeMap::new();
    for (slot, (name, pragma)) in pages.iter_mut().zip(PAGE_PRAGMAS) {
        let value = pragma_number(&mut conn, pragma, &mut errors).await;
        *slot = value.unwrap_or(0);
        details.insert(name.to_owned(), value.into());
    }
    if let Some(error) = errors.into_iter().next() {
        return Err(Error::Store(turnstile_core::StoreError::new(error, None)));
    }
    let [page_count, page_size, freelist_count] = pages;
    let (database_bytes, wal_bytes) = store_file_sizes(store);
    Ok(StorageReport {
        bytes_in_use: page_count.saturating_sub(freelist_count) * page_size,
        database_bytes,
        wal_bytes,
        details,
    })
}
