//! What a fork costs on PostgreSQL, as `turnstile-sqlite`'s `fork_cost`
//! measures it on SQLite: a conversation of 1,000 committed entries forked
//! whole, five times, on a server of its own with default durability
//! (`fsync` on). Prints each fork's time and bytes and their medians, the
//! figures docs/performance.md quotes; ignored by default (it measures,
//! and starts a server of its own):
//!
//! `cargo test -p turnstile-postgres --test it fork_cost -- --ignored --nocapture`

use std::time::{Duration, Instant};

use turnstile_conformance::support::{complete_request, new_conversation, ns};
use turnstile_core::admin::StoreAdmin;
use turnstile_core::{ConversationId, Store};
use turnstile_postgres::{PostgresOptions, PostgresStore};
use turnstile_test_postgres::Server;

const REQUESTS: u32 = 500;
const FORKS: usize = 5;

fn median<T: Copy + Ord>(values: &mut [T]) -> T {
    values.sort();
    values[values.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run it with --ignored --nocapture"]
async fn a_fork_of_1000_entries_costs_at_most_one_row_per_entry() {
    let server = Server::start_own();
    let store = PostgresStore::connect_with(PostgresOptions::new(server.fresh_database()))
        .await
        .expect("connect");
    let empty = store.storage().await.expect("storage").bytes_in_use;
    let source = new_conversation(&store).await.expect("conversation");
    let text = "x".repeat(200);
    for i in 0..REQUESTS {
        complete_request(&store, source, &format!("{i} {text}"), 0, &text)
            .await
            .expect("request");
    }
    let with_source = store.storage().await.expect("storage").bytes_in_use;
    let source_bytes = with_source - empty;
    let entries = u64::from(REQUESTS) * 2;

    let (mut times, mut sizes): (Vec<Duration>, Vec<u64>) = (Vec::new(), Vec::new());
    let mut before = with_source;
    for _ in 0..FORKS {
        let fork = ConversationId::new();
        let started = Instant::now();
        let outcome = store
            .fork_conversation(&ns(), source, entries, fork)
            .await
            .expect("fork");
        times.push(started.elapsed());
        assert_eq!(outcome.entries, entries);
        let copied = store.transcript_window(fork, u32::MAX).await.expect("read");
        assert_eq!(copied.len() as u64, entries);
        let after = store.storage().await.expect("storage").bytes_in_use;
        sizes.push(after - before);
        before = after;
    }
    eprintln!(
        "{FORKS} forks of {entries} entries ({} B of text each): {times:?}, {sizes:?} B \
         (tables, indexes, TOAST); medians {:?} and {} B ({} B/entry); the source with its \
         requests: {source_bytes} B ({} B/entry)",
        text.len() + 4,
        median(&mut times),
        median(&mut sizes),
        median(&mut sizes) / entries,
        source_bytes / entries
    );
    // One transcript row per entry, nothing else per entry: less than the
    // source, which also keeps request, run and checkpoint rows.
    let fork_bytes = median(&mut sizes);
    assert!(fork_bytes <= source_bytes, "{fork_bytes} > {source_bytes}");
}
