//! What a fork costs on SQLite: a conversation of 1,000 committed entries
//! forked whole, on a WAL file. The fork copies each entry as one row, so
//! it may take at most about the bytes the source's transcript takes, and
//! it is one transaction. Prints the figures docs/performance.md quotes.

use std::time::Instant;

use turnstile_conformance::support::{complete_request, new_conversation, ns};
use turnstile_core::admin::StoreAdmin;
use turnstile_core::{ConversationId, Store};
use turnstile_sqlite::SqliteStore;

const REQUESTS: u32 = 500;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_of_1000_entries_costs_at_most_one_row_per_entry() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("fork.db"))
        .await
        .expect("open");
    let empty = store.storage().await.expect("storage").bytes_in_use;
    let source = new_conversation(&store).await.expect("conversation");
    let text = "x".repeat(200);
    for i in 0..REQUESTS {
        complete_request(&store, source, &format!("{i} {text}"), 0, &text)
            .await
            .expect("request");
    }
    let with_source = store.storage().await.expect("storage").bytes_in_use;
    let entries = u64::from(REQUESTS) * 2;

    let fork = ConversationId::new();
    let started = Instant::now();
    let outcome = store
        .fork_conversation(&ns(), source, entries, fork)
        .await
        .expect("fork");
    let took = started.elapsed();
    let with_fork = store.storage().await.expect("storage").bytes_in_use;
    assert_eq!(outcome.entries, entries);
    assert_eq!(
        store
            .transcript_window(fork, u32::MAX)
            .await
            .expect("read")
            .len() as u64,
        entries
    );

    let source_bytes = with_source - empty;
    let fork_bytes = with_fork - with_source;
    eprintln!(
        "fork of {entries} entries ({} B of text each): {:?}, {} B in use ({} B/entry); \
         the source with its requests: {} B ({} B/entry)",
        text.len() + 4,
        took,
        fork_bytes,
        fork_bytes / entries,
        source_bytes,
        source_bytes / entries
    );
    // One transcript row per entry, nothing else per entry: less than the
    // source, which also keeps a request row per request.
    assert!(fork_bytes <= source_bytes, "{fork_bytes} > {source_bytes}");
}
