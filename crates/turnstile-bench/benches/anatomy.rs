//! Not timed: what each durable step costs in work rather than time.
//!
//! - SQL statements per step (every statement sqlx executes reports one
//!   `sqlx::query` tracing event, counted here; `BEGIN`/`COMMIT` are not
//!   among them, a `SAVEPOINT` is);
//! - round trips to sqlx's connection worker per step: the statements plus
//!   a `BEGIN` and a `COMMIT` per commit (every measured write transaction
//!   writes, so each ends in a commit frame of the WAL), except for a step
//!   the store commits as its statement alone (the writer logs each);
//! - commits and WAL pages per step, read from the WAL file's frame headers
//!   (a commit is a frame with a non-zero "database size" field);
//! - storage after the issue's default workload (200 conversations × 20
//!   turns, two ~500-byte messages per turn), per raw message byte;
//! - the same counts for 64 sessions that write one tool turn each at
//!   once, their steps group-committed (how many share a transaction
//!   depends on timing; statements per step do not, without savepoints);
//! - the in-memory harness at full size (1,000 sessions × 10 turns).
//!
//! ```sh
//! cargo bench --bench anatomy
//! ```
//!
//! The numbers are in docs/performance.md.

use turnstile_bench as support;

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use sqlx::{ConnectOptions, Row};
use tracing::level_filters::LevelFilter;
use tracing::subscriber::Interest;
use tracing::{span, Event, Metadata, Subscriber};
use turnstile::store::{ClaimOutcome, InputHash, NewRequest};
use turnstile::Durability;
use turnstile::{
    ConversationId, Message, RequestId, Revision, RunContext, RunId, SqliteStore, Store,
};

use support::{
    agent, open_store, run_request, runtime, session, temp_dir, text, BareInsert, BareInsertConn,
    TurnWriter, MESSAGE_BYTES,
};

const SQL_TARGET: &str = "sqlx::query";
const WRITER_TARGET: &str = "turnstile_sqlite::writer";
const ALONE: &str = "step committed alone";
static COUNTING: AtomicBool = AtomicBool::new(false);
static STATEMENTS: AtomicU64 = AtomicU64::new(0);
static ALONE_COMMITS: AtomicU64 = AtomicU64::new(0);

/// Counts the statement events sqlx emits, and the steps the store's writer
/// commits with no `BEGIN` or `COMMIT`, while [`COUNTING`] is on.
struct StatementCounter;

/// Whether an event's message is [`ALONE`].
#[derive(Default)]
struct IsAlone(bool);

impl tracing::field::Visit for IsAlone {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}") == ALONE;
        }
    }
}

impl Subscriber for StatementCounter {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if [SQL_TARGET, WRITER_TARGET].contains(&meta.target()) {
            Interest::sometimes()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>) -> bool {
        [SQL_TARGET, WRITER_TARGET].contains(&meta.target()) && COUNTING.load(Ordering::SeqCst)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::TRACE)
    }

    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }

    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}

    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}

    fn event(&self, event: &Event<'_>) {
        match event.metadata().target() {
            SQL_TARGET => {
                STATEMENTS.fetch_add(1, Ordering::SeqCst);
            }
            WRITER_TARGET => {
                let mut alone = IsAlone::default();
                event.record(&mut alone);
                if alone.0 {
                    ALONE_COMMITS.fetch_add(1, Ordering::SeqCst);
                }
            }
            _ => {}
        }
    }

    fn enter(&self, _: &span::Id) {}

    fn exit(&self, _: &span::Id) {}
}

/// The valid frames of a WAL file: how many, how many end a commit.
#[derive(Clone, Copy, PartialEq, Eq)]
struct WalState {
    salts: (u32, u32),
    page_size: u64,
    frames: u64,
    commits: u64,
}

fn be32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// The WAL file's header fields and its valid frames, each as the page it
/// holds and whether it ends a commit.
struct Wal {
    salts: (u32, u32),
    page_size: u64,
    frames: Vec<(u32, bool)>,
}

fn read_wal(db: &Path) -> Option<Wal> {
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    let bytes = std::fs::read(PathBuf::from(wal)).ok()?;
    if bytes.len() < 32 {
        return None;
    }
    let page_size = match be32(&bytes, 8) {
        1 => 65_536,
        n => u64::from(n),
    };
    let salts = (be32(&bytes, 16), be32(&bytes, 20));
    let frame = 24 + page_size as usize;
    let (mut frames, mut at) = (Vec::new(), 32);
    while at + frame <= bytes.len() && (be32(&bytes, at + 8), be32(&bytes, at + 12)) == salts {
        frames.push((be32(&bytes, at), be32(&bytes, at + 4) != 0));
        at += frame;
    }
    Some(Wal {
        salts,
        page_size,
        frames,
    })
}

fn wal_state(db: &Path) -> Option<WalState> {
    let wal = read_wal(db)?;
    Some(WalState {
        salts: wal.salts,
        page_size: wal.page_size,
        frames: wal.frames.len() as u64,
        commits: wal.frames.iter().filter(|(_, commit)| *commit).count() as u64,
    })
}

struct Measured {
    label: String,
    statements: u64,
    /// Commits with no `BEGIN` or `COMMIT` of their own.
    alone: u64,
    /// Context switches of all the process's threads (`None` off Linux).
    switches: Option<u64>,
    /// `None` when the WAL was reset (checkpointed) in between.
    wal: Option<(u64, u64, u64)>,
}

/// Runs `work` and records the statements it executed and the commits and
/// WAL pages it wrote to `db`.
async fn measure<T>(
    rows: &mut Vec<Measured>,
    label: &str,
    db: &Path,
    work: impl Future<Output = T>,
) -> T {
    let before = wal_state(db);
    let switches_before = context_switches();
    STATEMENTS.store(0, Ordering::SeqCst);
    ALONE_COMMITS.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    let out = work.await;
    COUNTING.store(false, Ordering::SeqCst);
    let statements = STATEMENTS.load(Ordering::SeqCst);
    let alone = ALONE_COMMITS.load(Ordering::SeqCst);
    let switches = context_switches()
        .zip(switches_before)
        .map(|(after, before)| after.saturating_sub(before));
    let after = wal_state(db);
    let wal = match (before, after) {
        (Some(b), Some(a)) if a.salts == b.salts => Some((
            a.commits - b.commits,
            a.frames - b.frames,
            (a.frames - b.frames) * a.page_size,
        )),
        (None, Some(a)) => Some((a.commits, a.frames, a.frames * a.page_size)),
        _ => None,
    };
    rows.push(Measured {
        label: label.to_owned(),
        statements,
        alone,
        switches,
        wal,
    });
    out
}

/// Context switches so far of every live thread of this process, summed
/// from `/proc/self/task/*/status` (Linux). A thread hand-off (a statement
/// sent to sqlx's worker thread and its answer back, a task woken on
/// another worker) is at least one; on a VM each costs tens of
/// microseconds, so this counts what the time goes to, without the noise.
fn context_switches() -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let Ok(status) = std::fs::read_to_string(task.ok()?.path().join("status")) else {
            continue; // the thread ended meanwhile
        };
        for line in status.lines() {
            let count = line
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"));
            if let Some(count) = count {
                total += count.trim().parse::<u64>().ok()?;
            }
        }
    }
    Some(total)
}

fn print_rows(rows: &[Measured]) {
    println!(
        "| {:<56} | {:>10} | {:>11} | {:>8} | {:>7} | {:>9} | {:>8} |",
        "operation", "statements", "round trips", "switches", "commits", "WAL pages", "WAL KiB"
    );
    println!(
        "|{:-<58}|{:->12}|{:->13}|{:->10}|{:->9}|{:->11}|{:->10}|",
        "", "", "", "", "", "", ""
    );
    for row in rows {
        let (commits, trips, frames, kib) = match row.wal {
            Some((c, f, b)) => (
                c.to_string(),
                (row.statements + 2 * c.saturating_sub(row.alone)).to_string(),
                f.to_string(),
                format!("{:.1}", b as f64 / 1024.0),
            ),
            None => ("reset".into(), "-".into(), "reset".into(), "reset".into()),
        };
        let switches = row.switches.map_or("-".into(), |n| n.to_string());
        println!(
            "| {:<56} | {:>10} | {:>11} | {:>8} | {:>7} | {:>9} | {:>8} |",
            row.label, row.statements, trips, switches, commits, frames, kib
        );
    }
}

/// Which tables and indexes each step of a request writes: the WAL pages
/// of a one-turn and a two-turn request's steps on a file database that
/// already holds 41 requests. Each step starts on an empty WAL, and its
/// pages are named right after it by the b-tree that owns them (`dbstat`);
/// a page no b-tree owns is the free list's or a pointer map's.
async fn pages_by_table(dir: &Path) {
    let db = dir.join("pages.db");
    let store = open_store(&db, Durability::Full).await;
    let shared: Arc<dyn Store> = Arc::new(store.clone());
    let input = text("user", MESSAGE_BYTES);
    let one_turn: Vec<_> = (0..4).map(|_| session(agent(1), shared.clone())).collect();
    for _ in 0..10 {
        for s in &one_turn {
            run_request(s, &input).await;
        }
    }
    run_request(&session(agent(2), shared), &input).await;
    let conversation = one_turn[0].conversation_id();
    let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&db)
        .connect()
        .await
        .expect("open");
    let mut pages = Pages {
        db: &db,
        conn: &mut conn,
        total: 0,
    };
    println!("\nWAL pages per step, by table (FULL, a file database holding 41 requests):\n");
    let store: &dyn Store = &store;
    let fence = pages.of("claim", support::claim(store, conversation)).await;
    let mut writer = TurnWriter::new(fence);
    pages.of("commit", writer.commit(store)).await;
    pages.total("1-turn request");
    let fence = pages.of("claim", support::claim(store, conversation)).await;
    let mut writer = TurnWriter::new(fence);
    let (call_id, _) = pages.of("model answer", writer.model_response(store)).await;
    let result = pages
        .of("tool result", writer.tool_result(store, &call_id))
        .await;
    pages
        .of("turn end", writer.finish(store, call_id, result))
        .await;
    pages.of("commit", writer.commit(store)).await;
    pages.total("2-turn request (1 tool call)");
}

/// Prints the WAL pages each step writes, by owner.
struct Pages<'a> {
    db: &'a Path,
    conn: &'a mut sqlx::SqliteConnection,
    total: usize,
}

impl Pages<'_> {
    async fn of<T>(&mut self, step: &str, work: impl Future<Output = T>) -> T {
        let (busy, _, _): (i64, i64, i64) = sqlx::query_as("PRAGMA wal_checkpoint(TRUNCATE)")
            .fetch_one(&mut *self.conn)
            .await
            .expect("checkpoint");
        assert_eq!(busy, 0, "the WAL was not emptied before {step}");
        let out = work.await;
        let owners: HashMap<u32, String> = sqlx::query("SELECT pageno, name FROM dbstat")
            .fetch_all(&mut *self.conn)
            .await
            .expect("dbstat")
            .into_iter()
            .map(|row| (row.get::<u32, _>(0), row.get::<String, _>(1)))
            .collect();
        let frames = read_wal(self.db).map(|wal| wal.frames).unwrap_or_default();
        let names: Vec<&str> = frames
            .iter()
            .map(|(page, _)| owners.get(page).map_or("(no b-tree)", String::as_str))
            .collect();
        println!(
            "  {step:<13} {:>2} pages: {}",
            names.len(),
            names.join(", ")
        );
        self.total += names.len();
        out
    }

    fn total(&mut self, request: &str) {
        println!("  = {request}: {} pages\n", self.total);
        self.total = 0;
    }
}

/// 64 sessions with an admitted request each write one tool turn at once
/// (3 steps each), on a fresh file database: their steps meet in the
/// group writer's transactions.
async fn group_commit(dir: &Path) {
    const SESSIONS: usize = 64;
    let db = dir.join("group.db");
    let store = Arc::new(open_store(&db, Durability::Full).await);
    let mut writers = Vec::with_capacity(SESSIONS);
    for _ in 0..SESSIONS {
        writers.push(TurnWriter::new(support::admitted(store.as_ref()).await));
    }
    // An empty WAL, so the turns' frames stay below the auto-checkpoint.
    let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&db)
        .connect()
        .await
        .expect("open");
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(&mut conn)
        .await
        .expect("checkpoint");
    drop(conn);
    let mut rows = Vec::new();
    measure(
        &mut rows,
        "64 sessions x one tool turn, at once (192 steps)",
        &db,
        async {
            let tasks: Vec<_> = writers
                .into_iter()
                .map(|mut writer| {
                    let store = store.clone();
                    tokio::spawn(async move { writer.tool_turn(store.as_ref()).await })
                })
                .collect();
            for task in tasks {
                task.await.expect("session task");
            }
        },
    )
    .await;
    println!("\nGroup commit, FULL durability (fresh file database):\n");
    print_rows(&rows);
    if let Some(row) = rows.first() {
        let steps = (SESSIONS * 3) as f64;
        if let Some((commits, _, _)) = row.wal {
            println!(
                "  per step: {:.2} statements, {:.2} round trips; {:.1} steps per commit",
                row.statements as f64 / steps,
                (row.statements + 2 * commits) as f64 / steps,
                steps / commits.max(1) as f64
            );
        }
    }
}

async fn steps(dir: &Path) {
    let mut rows = Vec::new();
    let bare_db = dir.join("bare.db");
    let bare = BareInsert::open(&bare_db, Durability::Full).await;
    bare.insert_commit().await;
    measure(
        &mut rows,
        "baseline: bare single-row INSERT transaction",
        &bare_db,
        bare.insert_commit(),
    )
    .await;

    let db = dir.join("steps.db");
    let store = open_store(&db, Durability::Full).await;
    let store_dyn: &dyn Store = &store;
    let conversation = ConversationId::new();
    store
        .ensure_conversation(&support::namespace(), conversation)
        .await
        .expect("conversation");
    let input = text("user", MESSAGE_BYTES);
    let request = |revision| {
        let request_id = RequestId::new();
        // The engine's first run: the request's id.
        let run_id = RunId::first_of(request_id);
        NewRequest {
            conversation_id: conversation,
            request_id,
            input_sha256: InputHash::of(&input),
            input: Message::user(input.clone()),
            expected_revision: Revision(revision),
            expected_created_at: None,
            run_id,
            agent_fingerprint: "bench".into(),
            first_turn: Some(support::first_turn(run_id)),
            deadline_at: None,
            budget: Default::default(),
        }
    };

    let claim = request(0);
    let ClaimOutcome::Admitted(fence) = measure(
        &mut rows,
        "Store::claim (with turn 1's write-ahead)",
        &db,
        store.claim(&claim),
    )
    .await
    .expect("claim") else {
        panic!("fresh request id already known");
    };
    let mut writer = TurnWriter::new(fence);
    let (call_id, _) = measure(
        &mut rows,
        "Store::record_model_response (1 tool call)",
        &db,
        writer.model_response(store_dyn),
    )
    .await;
    let result = measure(
        &mut rows,
        "Store::record_tool_result",
        &db,
        writer.tool_result(store_dyn, &call_id),
    )
    .await;
    measure(
        &mut rows,
        "Store::finish_turn (Ready checkpoint + next write-ahead)",
        &db,
        writer.finish(store_dyn, call_id, result),
    )
    .await;
    measure(
        &mut rows,
        "= one turn with one tool call (the 3 above)",
        &db,
        writer.tool_turn(store_dyn),
    )
    .await;
    measure(
        &mut rows,
        "Store::commit (answer, release, outcome)",
        &db,
        writer.commit(store_dyn),
    )
    .await;

    let claim = request(2);
    let ClaimOutcome::Admitted(held) = store.claim(&claim).await.expect("claim") else {
        panic!("fresh request id already known");
    };
    measure(
        &mut rows,
        "Store::abandon",
        &db,
        store.abandon(conversation, held.request_id, held.revision),
    )
    .await
    .expect("abandon");

    // The store opens reader connections on demand: open them all (reads at
    // once) before counting, so the reads below count only their own
    // statements, not a new connection's pragmas.
    for _ in 0..2 {
        let window = || store.transcript_window(conversation, 50);
        let (a, b, c, d) = tokio::join!(window(), window(), window(), window());
        for read in [a, b, c, d] {
            read.expect("window");
        }
    }
    measure(
        &mut rows,
        "Store::latest_checkpoint (read)",
        &db,
        store.latest_checkpoint(fence.run_id),
    )
    .await
    .expect("checkpoint");
    measure(
        &mut rows,
        "Store::transcript_window(50) (read)",
        &db,
        store.transcript_window(conversation, 50),
    )
    .await
    .expect("window");

    let shared: Arc<dyn Store> = Arc::new(store.clone());
    let one_turn = session(agent(1), shared.clone());
    run_request(&one_turn, &input).await;
    measure(
        &mut rows,
        "AgentSession::run, 1-turn request (reads included)",
        &db,
        run_request(&one_turn, &input),
    )
    .await;
    let two_turns = session(agent(2), shared.clone());
    run_request(&two_turns, &input).await;
    measure(
        &mut rows,
        "AgentSession::run, 2-turn request (1 tool call)",
        &db,
        run_request(&two_turns, &input),
    )
    .await;
    let id = RequestId::new();
    two_turns
        .run(id, &input, RunContext::default())
        .await
        .expect("request");
    let replay = measure(
        &mut rows,
        "AgentSession::run, replay of a completed request",
        &db,
        two_turns.run(id, &input, RunContext::default()),
    )
    .await
    .expect("replay");
    assert!(replay.replayed);

    println!("Per step, one session, FULL durability (fresh file database):\n");
    print_rows(&rows);

    // One count of a few dozen switches varies from run to run; the mean of
    // many repetitions does not.
    const REPEATS: u64 = 100;
    let mut conn = BareInsertConn::open(&dir.join("bare-conn.db"), Durability::Full).await;
    let bare_conn = switches_per(REPEATS, async {
        for _ in 0..REPEATS {
            conn.insert_commit().await;
        }
    })
    .await;
    let bare_pooled = switches_per(REPEATS, async {
        for _ in 0..REPEATS {
            bare.insert_commit().await;
        }
    })
    .await;
    let ClaimOutcome::Admitted(fence) = store.claim(&request(4)).await.expect("claim") else {
        panic!("fresh request id already known");
    };
    let mut writer = TurnWriter::new(fence);
    let turn = switches_per(REPEATS, async {
        for _ in 0..REPEATS {
            writer.tool_turn(store_dyn).await;
        }
    })
    .await;
    let latest = switches_per(REPEATS, async {
        for _ in 0..REPEATS {
            store
                .latest_checkpoint(fence.run_id)
                .await
                .expect("checkpoint");
        }
    })
    .await;
    let window = switches_per(REPEATS, async {
        for _ in 0..REPEATS {
            store
                .transcript_window(conversation, 50)
                .await
                .expect("window");
        }
    })
    .await;
    // The read before every new request's claim, on an idle conversation
    // whose window is full: 25 committed requests, 50 entries.
    let filled = session(agent(1), shared.clone());
    for i in 0..25 {
        run_request(&filled, &format!("{input} {i}")).await;
    }
    let claim_context = switches_per(REPEATS, async {
        for _ in 0..REPEATS {
            let context = store
                .claim_context(
                    &support::namespace(),
                    filled.conversation_id(),
                    RequestId::new(),
                    Some(50),
                )
                .await
                .expect("claim context");
            assert_eq!(context.window.len(), 50);
        }
    })
    .await;
    println!("\nContext switches per operation, all threads, mean of {REPEATS}:\n");
    println!("  bare INSERT commit, bare connection   {bare_conn:>6.1}");
    println!("  bare INSERT commit, one-conn pool     {bare_pooled:>6.1}");
    println!(
        "  one turn with one tool call           {turn:>6.1}  ({:.2} x 3 bare-connection commits)",
        turn / (3.0 * bare_conn)
    );
    println!("  Store::latest_checkpoint              {latest:>6.1}");
    println!("  Store::transcript_window(50)          {window:>6.1}");
    println!("  Store::claim_context, 50-entry window {claim_context:>6.1}");
}

/// The mean context switches per repetition of `work`, which repeats an
/// operation `repeats` times (NaN off Linux).
async fn switches_per(repeats: u64, work: impl Future<Output = ()>) -> f64 {
    let before = context_switches();
    work.await;
    match (before, context_switches()) {
        (Some(before), Some(after)) => after.saturating_sub(before) as f64 / repeats as f64,
        _ => f64::NAN,
    }
}

/// The issue's default workload, two ~500-byte messages per turn: 200
/// conversations × 20 one-turn requests (a user input and an answer each).
async fn storage(dir: &Path) {
    const CONVERSATIONS: usize = 200;
    const REQUESTS: usize = 20;
    let db = dir.join("storage.db");
    let store: Arc<dyn Store> = Arc::new(open_store(&db, Durability::Normal).await);
    let input = Arc::new(text("user", MESSAGE_BYTES));
    let start = Instant::now();
    let tasks: Vec<_> = (0..CONVERSATIONS)
        .map(|_| {
            let s = session(agent(1), store.clone());
            let input = input.clone();
            tokio::spawn(async move {
                for _ in 0..REQUESTS {
                    run_request(&s, &input).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("session task");
    }
    let elapsed = start.elapsed();
    let raw = (CONVERSATIONS * REQUESTS * 2 * MESSAGE_BYTES) as u64;
    drop(store);

    let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&db)
        .connect()
        .await
        .expect("open");
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(&mut conn)
        .await
        .expect("checkpoint");
    let page_size = pragma(&mut conn, "page_size").await;
    let pages = pragma(&mut conn, "page_count").await;
    let free = pragma(&mut conn, "freelist_count").await;
    let file = std::fs::metadata(&db).expect("db file").len();
    println!(
        "\nStorage after {CONVERSATIONS} conversations x {REQUESTS} one-turn requests \
         ({MESSAGE_BYTES}-byte input + {MESSAGE_BYTES}-byte answer), NORMAL, written in {:.1} s:",
        elapsed.as_secs_f64()
    );
    println!(
        "  raw message bytes {raw}; database file {file} bytes after a WAL checkpoint \
         ({pages} pages of {page_size}, {free} free) = {:.2} x raw ({:.2} x raw without free pages)",
        file as f64 / raw as f64,
        ((pages - free) * page_size) as f64 / raw as f64
    );
    match sqlx::query(
        "SELECT name, SUM(pgsize) AS bytes FROM dbstat GROUP BY name ORDER BY bytes DESC",
    )
    .fetch_all(&mut conn)
    .await
    {
        Ok(tables) => {
            for t in tables {
                let name: String = t.get(0);
                let bytes: i64 = t.get(1);
                println!(
                    "    {name:<40} {:>10} bytes ({:.2} x raw)",
                    bytes,
                    bytes as f64 / raw as f64
                );
            }
        }
        Err(e) => println!("    (no per-table sizes: {e})"),
    }
}

async fn pragma(conn: &mut sqlx::SqliteConnection, name: &str) -> u64 {
    let value: i64 = sqlx::query(&format!("PRAGMA {name}"))
        .fetch_one(conn)
        .await
        .expect("pragma")
        .get(0);
    value as u64
}

/// The test-harness workload at full size: 1,000 sessions × one 10-turn
/// request on one in-memory store, all concurrent; then the same sessions
/// one after another.
async fn harness() {
    const SESSIONS: usize = 1_000;
    const TURNS: usize = 10;
    let input = Arc::new(text("user", MESSAGE_BYTES));
    for concurrent in [true, false] {
        let store: Arc<dyn Store> =
            Arc::new(SqliteStore::in_memory().await.expect("in-memory store"));
        let sessions: Vec<_> = (0..SESSIONS)
            .map(|_| session(agent(TURNS), store.clone()))
            .collect();
        let start = Instant::now();
        if concurrent {
            let tasks: Vec<_> = sessions
                .into_iter()
                .map(|s| {
                    let input = input.clone();
                    tokio::spawn(async move { run_request(&s, &input).await })
                })
                .collect();
            for task in tasks {
                task.await.expect("session task");
            }
        } else {
            for s in &sessions {
                run_request(s, &input).await;
            }
        }
        let elapsed = start.elapsed().as_secs_f64();
        println!(
            "{}In-memory harness, {}: {SESSIONS} sessions x {TURNS} turns in {elapsed:.2} s = {:.0} turns/s",
            if concurrent { "\n" } else { "" },
            if concurrent { "all sessions concurrent" } else { "one session at a time" },
            (SESSIONS * TURNS) as f64 / elapsed
        );
    }
}

fn main() {
    // `cargo bench -- FILTER` passes the filter to every bench binary: run
    // only when it names this one (or when there is none).
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if !filters.is_empty() && !filters.iter().any(|f| "anatomy".contains(f.as_str())) {
        return;
    }
    tracing::subscriber::set_global_default(StatementCounter).expect("subscriber");
    let rt = runtime();
    let dir = temp_dir();
    rt.block_on(async {
        steps(dir.path()).await;
        pages_by_table(dir.path()).await;
        group_commit(dir.path()).await;
        storage(dir.path()).await;
        harness().await;
    });
}
