//! How long a new store takes to open: `SqliteStore::in_memory()` and
//! `SqliteStore::open` of a new file, against what SQLite alone takes for
//! the same (a bare sqlx connection to a new in-memory database, and to a
//! new WAL file), measured in the same run: five interleaved rounds of 40
//! opens each, medians per round; the opens are timed, the closes not.
//!
//! ```sh
//! cargo bench --bench open
//! ```
//!
//! The numbers are in docs/performance.md.

use turnstile_bench as support;

use std::future::Future;
use std::str::FromStr;
use std::time::{Duration, Instant};

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};
use sqlx::{ConnectOptions, Connection};
use turnstile::SqliteStore;

const ROUNDS: usize = 5;
const OPENS: usize = 40;

/// The median of `OPENS` runs of `open`, in milliseconds: each returns
/// how long its open took (closing is not timed).
async fn median<F: Future<Output = Duration>>(mut open: impl FnMut(usize) -> F) -> f64 {
    let mut times = Vec::with_capacity(OPENS);
    for i in 0..OPENS {
        times.push(open(i).await.as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    times[OPENS / 2]
}

fn main() {
    let runtime = support::runtime();
    let dir = support::temp_dir();
    runtime.block_on(async {
        // The first open of each kind builds this process's template.
        SqliteStore::in_memory().await.expect("in memory");
        let first = dir.path().join("first.db");
        SqliteStore::open(&first).await.expect("file").close().await.expect("close");
        println!("round | in_memory ms | bare :memory: ms | ratio | new file ms | bare new WAL file ms | ratio");
        for round in 0..ROUNDS {
            let memory = median(|_| async {
                let started = Instant::now();
                let store = SqliteStore::in_memory().await.expect("in memory");
                let took = started.elapsed();
                drop(store);
                took
            })
            .await;
            let bare_memory = median(|_| async {
                let started = Instant::now();
                let conn = SqliteConnectOptions::from_str("sqlite::memory:")
                    .expect("options")
                    .connect()
                    .await
                    .expect("bare in memory");
                let took = started.elapsed();
                conn.close().await.expect("close");
                took
            })
            .await;
            let file = median(|i| {
                let path = dir.path().join(format!("store-{round}-{i}.db"));
                async move {
                    let started = Instant::now();
                    let store = SqliteStore::open(&path).await.expect("file");
                    let took = started.elapsed();
                    store.close().await.expect("close");
                    took
                }
            })
            .await;
            let bare_file = median(|i| {
                let path = dir.path().join(format!("bare-{round}-{i}.db"));
                async move {
                    let started = Instant::now();
                    let conn = SqliteConnectOptions::new()
                        .filename(&path)
                        .create_if_missing(true)
                        .journal_mode(SqliteJournalMode::Wal)
                        .connect()
                        .await
                        .expect("bare file");
                    let took = started.elapsed();
                    conn.close().await.expect("close");
                    took
                }
            })
            .await;
            println!(
                "{round} | {memory:.2} | {bare_memory:.2} | {:.1}x | {file:.2} | {bare_file:.2} | {:.1}x",
                memory / bare_memory,
                file / bare_file
            );
        }
    });
}
