//! Disk-full fault injection at every write site of a request. The store is
//! opened with a size quota ([`SqliteOptions::max_database_bytes`], SQLite's
//! `max_page_count`); right before the targeted write, a second connection
//! without a quota fills the database past it and takes every free page, so
//! the store's next write that needs a page fails with `SQLITE_FULL`. Each
//! time: the caller gets a typed `StoreError` that says so
//! (`is_full()`), the failed step changed no row (the whole database is
//! compared), the admission is held (or, for the claim, unchanged), the rows
//! that do exist show which step failed, and once the space is given back
//! the same store (quota still on) recovers the request and commits every
//! byte of it.
//!
//! A step whose rows are large needs new pages by itself (the payloads are
//! 64 KiB). A step that writes only small rows (the turn write-ahead, an
//! abandon, the commit's bookkeeping in the "release" case) needs a page
//! only when its table's page is full: those cases also pack that page
//! first (see [`Disk::crowd`]). The tables of these tests are one page each,
//! so the packed page is where the step writes.
//!
//! Recovering on the same store also checks that its writer survives the
//! fault: SQLite answers `SQLITE_FULL` in a single-row write by rolling the
//! whole transaction back, which once left the writer connection refusing
//! every later `BEGIN`.
//!
//! Faults are placed by the events of [`AgentSession::stream`]: the run waits
//! while the consumer holds an event, so a fault injected on an event comes
//! before the write that follows it. Which site a case hits is stated by the
//! event it waits for and the rows it expects; if the write protocol changes
//! (say, the write-ahead is folded into the previous step), adjust the case's
//! row in [`in_run_sites`].

use std::pin::pin;
use std::sync::Arc;

use futures_util::StreamExt;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{SqliteConnection, SqlitePool};
use turnstile::store::{JournalStatus, RequestStatus, RunStatus};

/// Every row of every table, as text, table by table.
type Snapshot = Vec<(String, Vec<String>)>;
use turnstile::{
    Agent, AgentSession, Budget, CheckpointPhase, ContextPolicy, ConversationId, Error, Event,
    MaxPasses, Message, Namespace, RequestId, ResumePolicy, RunContext, ScriptedModel,
    ScriptedReply, SqliteOptions, SqliteStore, Store, ToolCall,
};
use turnstile_testkit::tools::Echo;

/// The stored columns of `requests` that hold its folded first run and that
/// run's latest checkpoint.
const FOLDED_RUN: [&str; 13] = [
    "run_state",
    "run_error",
    "run_ended_early_at",
    "turn",
    "checkpoint_phase",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "tool_calls_count",
    "reports_count",
    "message_count",
    "checkpoint_early_at",
];

/// The store's quota. Small, so filling past it is quick.
const QUOTA_BYTES: u64 = 2 << 20;

/// A payload that needs about 16 new pages wherever it is written.
const BIG: usize = 64 << 10;

/// `SQLITE_FULL`.
const SQLITE_FULL: i32 = 13;

// ---------------------------------------------------------------------------
// The agent: one tool call per turn for two turns, then an answer.

/// The sizes of what a request writes. Each case makes one of them large:
/// the one its targeted step writes.
#[derive(Clone, Copy)]
struct Payloads {
    input: usize,
    /// The second turn's call arguments.
    arguments: usize,
    /// The second turn's tool output.
    output: usize,
    /// The final answer.
    answer: usize,
}

const SMALL: Payloads = Payloads {
    input: 16,
    arguments: 8,
    output: 8,
    answer: 8,
};

impl Payloads {
    fn input(&self) -> String {
        "i".repeat(self.input)
    }

    fn calls(&self) -> [ToolCall; 2] {
        let arguments = "a".repeat(self.arguments);
        [
            ToolCall::new("a", "echo", serde_json::json!({"text": "first"})),
            ToolCall::new(
                "b",
                "echo",
                serde_json::json!({"text": arguments, "repeat": self.output.div_ceil(arguments.len())}),
            ),
        ]
    }

    fn answer(&self) -> String {
        "z".repeat(self.answer)
    }

    fn script(&self) -> Vec<ScriptedReply> {
        let [a, b] = self.calls();
        vec![
            ScriptedReply::tool_calls(vec![a]),
            ScriptedReply::tool_calls(vec![b]),
            ScriptedReply::text(self.answer()),
        ]
    }

    /// Every message the committed request must hold, byte for byte.
    fn committed(&self) -> Vec<Message> {
        let [a, b] = self.calls();
        let output = "a"
            .repeat(self.arguments)
            .repeat(self.output.div_ceil(self.arguments));
        vec![
            Message::user(self.input()),
            Message::assistant_with_calls("", vec![a]),
            Message::tool("a", "first", false),
            Message::assistant_with_calls("", vec![b]),
            Message::tool("b", output, false),
            Message::assistant(self.answer()),
        ]
    }
}

// ---------------------------------------------------------------------------
// The fault: a full database.

/// The database seen through a second connection that has no quota.
#[derive(Clone)]
struct Disk {
    raw: SqlitePool,
    page_size: i64,
    quota_pages: i64,
}

/// A table whose single page [`Disk::crowd`] packs with rows of its own:
/// how to add a padding row, grow it, and remove them all. Padding keys
/// start with twelve 0xff bytes; nothing else in these tests has such a key.
struct Pad {
    table: &'static str,
    insert: &'static str,
    grow: &'static str,
    remove: &'static str,
}

/// Padding checkpoints of a request that does not exist (the raw connection
/// does not enforce foreign keys); no store query reads another request's
/// rows. The table holds the earlier turns of a request's first run, where
/// a turn's write-ahead moves the turn before it.
const CHECKPOINTS: Pad = Pad {
    table: "first_run_checkpoints",
    insert: "INSERT INTO first_run_checkpoints (request_id, turn, phase, input_tokens,
                 output_tokens, cache_read_tokens, cache_write_tokens, tool_calls_count,
                 reports_count, message_count, created_at)
             VALUES (?1, 0, '', 0, 0, 0, 0, 0, 0, 0, 0)",
    grow: "UPDATE first_run_checkpoints SET phase = zeroblob(?2) WHERE request_id = ?1",
    remove: "DELETE FROM first_run_checkpoints
             WHERE substr(request_id, 1, 12) = X'ffffffffffffffffffffffff'",
};

/// Padding requests of the same conversation, abandoned long ago.
const REQUESTS: Pad = Pad {
    table: "requests",
    insert: "INSERT INTO requests (request_id, conversation_id, input_sha256, state, created_at)
             VALUES (?1, (SELECT id FROM conversations LIMIT 1), X'', 2, 0)",
    grow: "UPDATE requests SET input_sha256 = zeroblob(?2) WHERE request_id = ?1",
    remove: "DELETE FROM requests WHERE substr(request_id, 1, 12) = X'ffffffffffffffffffffffff'",
};

impl Disk {
    async fn open(path: &std::path::Path) -> Self {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .foreign_keys(false)
            .synchronous(SqliteSynchronous::Off);
        let raw = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .unwrap();
        sqlx::query("CREATE TABLE filler (data BLOB NOT NULL)")
            .execute(&raw)
            .await
            .unwrap();
        let page_size = pragma(&raw, "page_size").await;
        // The test's premise: free pages go back to the file system.
        assert_eq!(pragma(&raw, "auto_vacuum").await, 2, "incremental");
        let quota_pages = i64::try_from(QUOTA_BYTES).unwrap() / page_size;
        Self {
            raw,
            page_size,
            quota_pages,
        }
    }

    /// Grows the database past the quota and uses up every free page, so
    /// the store's next write that needs a page fails.
    async fn fill(&self) {
        loop {
            let pages = pragma(&self.raw, "page_count").await;
            let free = pragma(&self.raw, "freelist_count").await;
            if pages >= self.quota_pages && free == 0 {
                return;
            }
            let missing = (self.quota_pages - pages).max(0) + free + 1;
            sqlx::query("INSERT INTO filler (data) VALUES (zeroblob(?1))")
                .bind(missing * self.page_size)
                .execute(&self.raw)
                .await
                .unwrap();
        }
    }

    /// Packs the page of a one-page table: padding rows are added until no
    /// other row fits, and the last one grown until not a byte more fits,
    /// with this connection allowed no new page either. Then a store write
    /// that adds a row to that table, or grows one of its rows, must split
    /// the page, which needs a new one.
    async fn crowd(&self, pad: &Pad) {
        let mut conn = self.raw.acquire().await.unwrap();
        assert_eq!(leaf(&mut conn, pad.table).await.0, 1, "{}", pad.table);
        // No quota below the current size is possible: this pins it.
        sqlx::query("PRAGMA max_page_count = 1")
            .execute(&mut *conn)
            .await
            .unwrap();
        let mut rows = 0u32;
        let mut last = None;
        loop {
            let mut key = vec![0xff; 12];
            key.extend_from_slice(&rows.to_be_bytes());
            if !fits(&mut conn, sqlx::query(pad.insert).bind(&key[..])).await {
                break;
            }
            rows += 1;
            // Rows of a few hundred bytes: far from the largest cell a page
            // keeps whole, so the last one can still take what is left.
            grow_to_fit(&mut conn, pad, &key, 256).await;
            last = Some(key);
        }
        let last = last.unwrap_or_else(|| panic!("{}: the page was full already", pad.table));
        grow_to_fit(&mut conn, pad, &last, 4096).await;
        let (pages, unused) = leaf(&mut conn, pad.table).await;
        assert_eq!(pages, 1, "{}: padding split the page", pad.table);
        assert!(unused <= 2, "{}: {unused} bytes left", pad.table);
        sqlx::query("PRAGMA max_page_count = 4294967294")
            .execute(&mut *conn)
            .await
            .unwrap();
    }

    /// Removes the fault: the filler and any padding are deleted and the
    /// freed pages given back to the file system, so the database is below
    /// the quota again.
    async fn heal(&self) {
        for statement in [
            "DELETE FROM filler",
            CHECKPOINTS.remove,
            REQUESTS.remove,
            "PRAGMA incremental_vacuum",
        ] {
            sqlx::query(statement).execute(&self.raw).await.unwrap();
        }
        let pages = pragma(&self.raw, "page_count").await;
        assert!(
            pages < self.quota_pages,
            "still {pages} pages after healing"
        );
    }

    /// Every row of every table of the store, in a stable order.
    async fn snapshot(&self) -> Snapshot {
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM sqlite_master WHERE type = 'table'
               AND name NOT LIKE 'sqlite_%' AND name NOT IN ('_sqlx_migrations', 'filler')
             ORDER BY name",
        )
        .fetch_all(&self.raw)
        .await
        .unwrap();
        let mut snapshot = Vec::new();
        for table in tables {
            let columns: Vec<String> =
                sqlx::query_scalar("SELECT name FROM pragma_table_info(?1) ORDER BY cid")
                    .bind(&table)
                    .fetch_all(&self.raw)
                    .await
                    .unwrap();
            // A request's row holds its folded first run and that run's
            // latest checkpoint: those columns are a part of their own, as
            // `runs` and `loop_checkpoints` rows are.
            let (folded, own): (Vec<String>, Vec<String>) = columns
                .into_iter()
                .partition(|c| table == "requests" && FOLDED_RUN.contains(&c.as_str()));
            snapshot.push((table.clone(), self.rows(&table, &own).await));
            if !folded.is_empty() {
                let keyed = [vec!["request_id".to_owned()], folded].concat();
                snapshot.push(("folded runs".to_owned(), self.rows(&table, &keyed).await));
            }
        }
        snapshot
    }

    /// `columns` of every row of `table`, each row as one string.
    async fn rows(&self, table: &str, columns: &[String]) -> Vec<String> {
        let row = columns
            .iter()
            .map(|c| format!("quote(\"{c}\")"))
            .collect::<Vec<_>>()
            .join(" || ',' || ");
        // Names come from the schema, never from input.
        sqlx::query_scalar(&format!("SELECT {row} FROM \"{table}\" ORDER BY 1"))
            .fetch_all(&self.raw)
            .await
            .unwrap()
    }
}

/// Grows a padding row as far as it fits, up to `limit` bytes, by
/// bisection (a failed update leaves the row as it was).
async fn grow_to_fit(conn: &mut SqliteConnection, pad: &Pad, key: &[u8], limit: i64) {
    let (mut fit, mut too_big) = (0i64, limit + 1);
    while too_big - fit > 1 {
        let size = (fit + too_big) / 2;
        if fits(&mut *conn, sqlx::query(pad.grow).bind(key).bind(size)).await {
            fit = size;
        } else {
            too_big = size;
        }
    }
    // The row is left at `fit` bytes: its last update that succeeded.
}

/// A table's pages and its unused bytes (the `dbstat` table).
async fn leaf(conn: &mut SqliteConnection, table: &str) -> (i64, i64) {
    sqlx::query_as("SELECT COUNT(*), SUM(unused) FROM dbstat WHERE name = ?1")
        .bind(table)
        .fetch_one(&mut *conn)
        .await
        .unwrap()
}

async fn pragma(raw: &SqlitePool, name: &str) -> i64 {
    sqlx::query_scalar(&format!("PRAGMA {name}"))
        .fetch_one(raw)
        .await
        .unwrap()
}

/// Runs a write in its own transaction: `true` if it fit, `false` if the
/// database was full (then it changed nothing). Any other failure panics.
async fn fits<'q>(
    conn: &mut SqliteConnection,
    query: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
) -> bool {
    match query.execute(&mut *conn).await {
        Ok(done) => {
            assert_eq!(done.rows_affected(), 1);
            true
        }
        Err(e) => {
            let code = e
                .as_database_error()
                .and_then(|d| d.code())
                .and_then(|c| c.parse::<i32>().ok());
            assert_eq!(code, Some(SQLITE_FULL), "padding failed otherwise: {e}");
            false
        }
    }
}

// ---------------------------------------------------------------------------
// The fixture.

struct Fixture {
    _dir: tempfile::TempDir,
    store: Arc<SqliteStore>,
    disk: Disk,
    conversation: ConversationId,
    namespace: Namespace,
}

impl Fixture {
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("full.db");
        let options = SqliteOptions {
            max_database_bytes: Some(QUOTA_BYTES),
            ..SqliteOptions::default()
        };
        let store = Arc::new(SqliteStore::open_with(&path, options).await.unwrap());
        let disk = Disk::open(&path).await;
        let conversation = ConversationId::new();
        let namespace = Namespace::new("full").unwrap();
        // The conversation exists before any fault: creating it is not a
        // site of these tests.
        store
            .ensure_conversation(&namespace, conversation)
            .await
            .unwrap();
        Self {
            _dir: dir,
            store,
            disk,
            conversation,
            namespace,
        }
    }

    fn session(&self, payloads: Payloads) -> AgentSession {
        let agent =
            Agent::new(Arc::new(ScriptedModel::new(payloads.script()))).with_tool(Echo::new());
        AgentSession::new(
            agent,
            self.store.clone(),
            self.conversation,
            self.namespace.clone(),
            ContextPolicy::default(),
        )
    }

    /// Fills the disk (and packs `crowd`'s page), and returns the database
    /// as it is then.
    async fn inject(&self, crowd: Option<&Pad>) -> Vec<(String, Vec<String>)> {
        self.disk.fill().await;
        if let Some(pad) = crowd {
            self.disk.crowd(pad).await;
        }
        self.disk.snapshot().await
    }

    /// Streams a request and injects the fault when `at` matches an event,
    /// before the write that follows it. Returns the request's error and the
    /// database as it was when the fault was injected.
    async fn stream_into_fault(
        &self,
        session: &AgentSession,
        request: RequestId,
        input: &str,
        at: fn(&Event) -> bool,
        crowd: Option<&Pad>,
        site: &str,
    ) -> (Error, Vec<(String, Vec<String>)>) {
        let mut stream = pin!(session.stream(request, input, RunContext::default()));
        let mut injected = None;
        while let Some(item) = stream.next().await {
            match item {
                Ok(Event::ConversationCommitted { .. }) => {
                    panic!("{site}: committed despite the fault")
                }
                Ok(event) if injected.is_none() && at(&event) => {
                    injected = Some(self.inject(crowd).await);
                }
                Ok(_) => {}
                Err(error) => {
                    let snapshot =
                        injected.unwrap_or_else(|| panic!("{site}: failed before the fault"));
                    return (error, snapshot);
                }
            }
        }
        panic!("{site}: the stream ended without a result");
    }
}

/// The failed step wrote nothing: the only change is the stop recorded
/// after it, in the run's row, its latest checkpoint's phase and the
/// admission's activity time.
fn assert_only_the_stop_changed(site: &str, before: Snapshot, after: Snapshot) {
    let stop_record = [
        "runs",
        "folded runs",
        "loop_checkpoints",
        "first_run_checkpoints",
        "admissions",
        "events",
    ];
    let without_stop = |rows: &Snapshot| {
        rows.iter()
            .filter(|(table, _)| !stop_record.contains(&table.as_str()))
            .cloned()
            .collect::<Vec<_>>()
    };
    let checkpoint_rows = |rows: &Snapshot| {
        rows.iter()
            .find(|(table, _)| *table == "loop_checkpoints")
            .map(|(_, rows)| rows.len())
    };
    assert_eq!(
        checkpoint_rows(&after),
        checkpoint_rows(&before),
        "{site}: checkpoint rows"
    );
    assert_eq!(
        without_stop(&after),
        without_stop(&before),
        "{site}: the failed step changed rows"
    );
    // The log keeps what it had and tells the stop, at most once (`kind`
    // 6, the third column): the failed step logged nothing.
    let events = |rows: &Snapshot| {
        rows.iter()
            .find(|(table, _)| *table == "events")
            .map(|(_, rows)| rows.clone())
            .unwrap_or_default()
    };
    let (before, after) = (events(&before), events(&after));
    let added: Vec<_> = after.iter().filter(|row| !before.contains(row)).collect();
    assert!(
        before.iter().all(|row| after.contains(row)),
        "{site}: events lost"
    );
    assert!(
        added.len() <= 1 && added.iter().all(|row| row.split(',').nth(2) == Some("6")),
        "{site}: the failed step logged {added:?}"
    );
}

/// The error is the store's, and says the disk is full.
fn assert_full<T: std::fmt::Debug>(site: &str, result: Result<T, Error>) {
    match result {
        Err(Error::Store(e)) => {
            assert!(e.is_full(), "{site}: not marked full: {e}");
            assert!(!e.is_busy(), "{site}: marked busy: {e}");
        }
        other => panic!("{site}: expected a storage-full error, got {other:?}"),
    }
}

/// Every tool call answered once, right after its call.
fn assert_well_formed(site: &str, messages: &[Message]) {
    let mut open: Vec<&str> = Vec::new();
    for message in messages {
        match message {
            Message::Tool { call_id, .. } => {
                let at = open
                    .iter()
                    .position(|c| c == call_id)
                    .unwrap_or_else(|| panic!("{site}: orphan result {call_id}"));
                open.remove(at);
            }
            other => {
                assert!(open.is_empty(), "{site}: unanswered {open:?}");
                open = other.tool_calls().iter().map(|c| c.id.as_str()).collect();
            }
        }
    }
    assert!(open.is_empty(), "{site}: unanswered {open:?}");
}

// ---------------------------------------------------------------------------
// The sites.

/// One write site inside a run: where the fault goes, what is large, and the
/// rows that must exist after the failure (they say which step failed).
struct Site {
    name: &'static str,
    /// The fault is injected on the first event that matches.
    at: fn(&Event) -> bool,
    payloads: Payloads,
    crowd: Option<&'static Pad>,
    /// The run's latest checkpoint after the failure, as the failed step
    /// left it and then as the recorded stop settled it (a pending phase
    /// when nothing was ambiguous; unchanged when a tool's effect may be
    /// unjournaled).
    checkpoint: (u32, CheckpointPhase),
    /// The request's pending (uncommitted) messages after the failure.
    pending: usize,
    /// The journal of turn 2 after the failure: call b's status, if any.
    journal: Option<JournalStatus>,
    /// Whether the stop could be recorded: not when the page the case
    /// packed is the one the stop writes.
    stop_recorded: bool,
}

fn in_run_sites() -> Vec<Site> {
    vec![
        Site {
            // Turn 2's write-ahead is a new checkpoint row committed with
            // turn 1's `Ready` checkpoint (an update in place): small rows,
            // so the checkpoints page is packed.
            name: "turn write-ahead",
            at: |e| matches!(e, Event::ToolFinished { turn: 1, .. }),
            payloads: SMALL,
            crowd: Some(&CHECKPOINTS),
            checkpoint: (1, CheckpointPhase::ToolsPending),
            pending: 2,
            journal: None,
            stop_recorded: true,
        },
        Site {
            name: "model answer and journal",
            at: |e| matches!(e, Event::TurnStarted { turn: 2 }),
            payloads: Payloads {
                arguments: BIG,
                ..SMALL
            },
            crowd: None,
            checkpoint: (2, CheckpointPhase::ModelPending),
            pending: 3,
            journal: None,
            stop_recorded: true,
        },
        Site {
            name: "tool result",
            at: |e| matches!(e, Event::ToolStarted { turn: 2, .. }),
            payloads: Payloads {
                output: BIG,
                ..SMALL
            },
            crowd: None,
            checkpoint: (2, CheckpointPhase::ToolsInFlight),
            pending: 4,
            journal: Some(JournalStatus::Requested),
            stop_recorded: true,
        },
        Site {
            name: "turn checkpoint",
            at: |e| matches!(e, Event::ToolFinished { turn: 2, .. }),
            payloads: Payloads {
                output: BIG,
                ..SMALL
            },
            crowd: None,
            checkpoint: (2, CheckpointPhase::ToolsPending),
            pending: 4,
            journal: Some(JournalStatus::Completed),
            stop_recorded: true,
        },
        Site {
            name: "commit",
            at: |e| matches!(e, Event::ModelResponded { turn: 3, .. }),
            payloads: Payloads {
                answer: BIG,
                ..SMALL
            },
            crowd: None,
            checkpoint: (3, CheckpointPhase::ModelPending),
            pending: 5,
            journal: Some(JournalStatus::Completed),
            stop_recorded: true,
        },
        Site {
            // The admission's release only shrinks its row: it can never
            // be the statement that runs out of space. This case fails the
            // release's transaction after the release statement, at its
            // smallest write (the request's completion, its page packed),
            // so the release must be undone with everything else.
            name: "release",
            at: |e| matches!(e, Event::ModelResponded { turn: 3, .. }),
            payloads: SMALL,
            crowd: Some(&REQUESTS),
            // The stop goes into the request's row (its folded run), on
            // the page this case packed: it finds no room either, and the
            // run stays as its last write left it.
            checkpoint: (3, CheckpointPhase::TurnInFlight),
            pending: 5,
            journal: Some(JournalStatus::Completed),
            stop_recorded: false,
        },
    ]
}

/// The claim: a large input, the database full before the request starts.
/// Nothing changes (no request, no run, the admission idle at its revision),
/// and the same request runs once there is room.
#[tokio::test]
async fn a_claim_on_a_full_disk_changes_nothing_and_the_retry_commits() {
    let f = Fixture::new().await;
    let payloads = Payloads {
        input: BIG,
        ..SMALL
    };
    let session = f.session(payloads);
    let request = RequestId::new();
    let before = f.store.admission(f.conversation).await.unwrap();

    let snapshot = f.inject(None).await;
    assert_full(
        "claim",
        session
            .run(request, &payloads.input(), RunContext::default())
            .await,
    );
    assert_eq!(f.disk.snapshot().await, snapshot, "claim: rows changed");
    assert!(f.store.request(request).await.unwrap().is_none());
    assert_eq!(f.store.admission(f.conversation).await.unwrap(), before);

    f.disk.heal().await;
    let outcome = session
        .run(request, &payloads.input(), RunContext::default())
        .await
        .unwrap();
    assert_eq!(outcome.messages, payloads.committed());
    assert_committed(&f, request, &payloads, "claim").await;
}

/// Every site inside a run: the run fails with the storage-full error, the
/// failed step wrote nothing, the admission stays held by the request, and
/// once there is room recovery finishes the request with every byte.
#[tokio::test]
async fn every_write_site_of_a_run_fails_cleanly_on_a_full_disk_and_recovers() {
    for site in in_run_sites() {
        let f = Fixture::new().await;
        let name = site.name;
        let session = f.session(site.payloads);
        let request = RequestId::new();
        let input = site.payloads.input();
        let (error, snapshot) = f
            .stream_into_fault(&session, request, &input, site.at, site.crowd, name)
            .await;
        assert_full(name, Err::<(), _>(error));
        // The failed step wrote nothing; the stop recorded after it is
        // checked below.
        assert_only_the_stop_changed(name, snapshot, f.disk.snapshot().await);

        // Held by the request, nothing committed.
        let admission = f.store.admission(f.conversation).await.unwrap();
        let active = admission
            .active
            .clone()
            .unwrap_or_else(|| panic!("{name}: admission released"));
        assert_eq!(active.request_id, request, "{name}");
        let record = f.store.request(request).await.unwrap().unwrap();
        assert_eq!(record.status, RequestStatus::Active, "{name}");
        assert_eq!(
            f.store
                .transcript_window(f.conversation, 100)
                .await
                .unwrap()
                .len(),
            0
        );
        let conversation = f
            .store
            .conversation(&f.namespace, f.conversation)
            .await
            .unwrap();
        assert_eq!(conversation.version, 0, "{name}");

        // Which step failed: the rows before it exist, its own do not.
        let checkpoint = f
            .store
            .latest_checkpoint(active.run_id)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{name}: no checkpoint"));
        assert_eq!(
            (checkpoint.turn, checkpoint.phase),
            site.checkpoint,
            "{name}: latest checkpoint"
        );
        let run = f.store.run(active.run_id).await.unwrap().unwrap();
        if site.stop_recorded {
            assert_eq!(
                run.status,
                RunStatus::Failed,
                "{name}: the stop is recorded"
            );
            assert!(
                run.error.as_deref().is_some_and(|e| e.contains("full")),
                "{name}: {:?}",
                run.error
            );
        } else {
            assert_eq!(
                (run.status, run.error),
                (RunStatus::Running, None),
                "{name}"
            );
        }
        let pending = f.store.request_messages(request, 1 << 20).await.unwrap();
        assert_eq!(pending.len(), site.pending, "{name}: pending messages");
        assert_eq!(
            &pending[..],
            &site.payloads.committed()[..site.pending],
            "{name}: pending messages differ"
        );
        let journal = f.store.journal(request, 2).await.unwrap();
        assert_eq!(
            journal.iter().map(|e| e.status).collect::<Vec<_>>(),
            site.journal.into_iter().collect::<Vec<_>>(),
            "{name}: journal of turn 2"
        );

        f.disk.heal().await;
        let outcome = session
            .recover_after_owner_exit(
                request,
                &input,
                RunContext::default(),
                admission.revision,
                ResumePolicy::RetryInterruptedTurn,
            )
            .await
            .unwrap_or_else(|e| panic!("{name}: recovery failed: {e:?}"));
        assert_eq!(outcome.messages, site.payloads.committed(), "{name}");
        assert_eq!((outcome.turns, outcome.tool_calls), (3, 2), "{name}");
        assert_committed(&f, request, &site.payloads, name).await;
    }
}

/// An abandon on a full disk (the requests page packed: an abandon only
/// grows two small rows) keeps the request active at its revision, and can
/// be repeated once there is room.
#[tokio::test]
async fn an_abandon_on_a_full_disk_keeps_the_request_and_can_be_repeated() {
    let f = Fixture::new().await;
    let session = f.session(SMALL);
    let request = RequestId::new();
    // Stopped after its first turn by a turn budget: the admission is held.
    let ctx = RunContext::default().with_budget(Budget {
        max_turns: Some(1),
        ..Default::default()
    });
    let stopped = session.run(request, &SMALL.input(), ctx).await.unwrap_err();
    let (run, revision) = stopped.stopped_run().expect("a stopped run");

    let snapshot = f.inject(Some(&REQUESTS)).await;
    assert_full("abandon", session.abandon(request, revision).await);
    assert_eq!(f.disk.snapshot().await, snapshot, "abandon: rows changed");
    let admission = f.store.admission(f.conversation).await.unwrap();
    assert_eq!(admission.revision, revision, "the admission moved");
    assert_eq!(admission.active.unwrap().request_id, request);
    let record = f.store.request(request).await.unwrap().unwrap();
    assert_eq!(record.status, RequestStatus::Active);

    f.disk.heal().await;
    let released = session.abandon(request, revision).await.unwrap();
    assert_eq!(released.0, revision.0 + 1);
    let record = f.store.request(request).await.unwrap().unwrap();
    assert_eq!(record.status, RequestStatus::Abandoned);
    assert!(f
        .store
        .admission(f.conversation)
        .await
        .unwrap()
        .active
        .is_none());
    // Its run stays inspectable, its turn intact.
    let checkpoint = f.store.latest_checkpoint(run).await.unwrap().unwrap();
    assert_eq!(checkpoint.turn, 1);
}

/// Answers with a summary of `BIG` bytes.
struct BigSummary;

#[turnstile::async_trait]
impl turnstile::Model for BigSummary {
    fn name(&self) -> &str {
        "big-summary"
    }

    async fn respond(
        &self,
        _: turnstile::agent::ModelRequest<'_>,
    ) -> Result<turnstile::agent::ModelResponse, turnstile::ModelError> {
        Ok(turnstile::agent::ModelResponse {
            content: "s".repeat(BIG).into(),
            ..Default::default()
        })
    }
}

/// A summary commit on a full disk: the pass stays recorded in the
/// admission, no summary row exists, and recovery commits the summary and
/// the request once there is room.
#[tokio::test]
async fn a_summary_commit_on_a_full_disk_keeps_the_pass_and_recovers() {
    let f = Fixture::new().await;
    let answer = |text: &str| {
        Agent::new(Arc::new(ScriptedModel::new(vec![ScriptedReply::text(
            text,
        )])))
    };
    // Three committed requests (six entries) with a window of two: the
    // first four entries call for one summary pass.
    let policy = ContextPolicy::new(2)
        .unwrap()
        .with_summary_batch(4)
        .unwrap();
    let plain = AgentSession::new(
        answer("ok"),
        f.store.clone(),
        f.conversation,
        f.namespace.clone(),
        policy,
    );
    for i in 0..3 {
        plain
            .run(RequestId::new(), &format!("q{i}"), RunContext::default())
            .await
            .unwrap();
    }
    let session = AgentSession::new(
        answer("done"),
        f.store.clone(),
        f.conversation,
        f.namespace.clone(),
        policy,
    )
    .with_summary_agent(Agent::new(Arc::new(BigSummary)), MaxPasses::new(4).unwrap());
    let request = RequestId::new();
    let (error, snapshot) = f
        .stream_into_fault(
            &session,
            request,
            "q3",
            |e| matches!(e, Event::SummaryStarted { .. }),
            None,
            "summary commit",
        )
        .await;
    assert_full("summary commit", Err::<(), _>(error));
    assert_only_the_stop_changed("summary commit", snapshot, f.disk.snapshot().await);
    assert!(f
        .store
        .latest_summary(f.conversation)
        .await
        .unwrap()
        .is_none());
    let admission = f.store.admission(f.conversation).await.unwrap();
    let active = admission.active.clone().expect("admission held");
    assert_eq!(active.request_id, request);
    assert_eq!(active.summary.passes, 0);
    let run = f.store.run(active.run_id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Failed, "the stop is recorded");
    let pass = active.summary.pending.expect("the pass stays recorded");
    assert_eq!((pass.from_seq, pass.through_seq), (0, 3));

    f.disk.heal().await;
    let outcome = session
        .recover_after_owner_exit(
            request,
            "q3",
            RunContext::default(),
            admission.revision,
            ResumePolicy::RejectAmbiguous,
        )
        .await
        .unwrap_or_else(|e| panic!("summary: recovery failed: {e:?}"));
    assert_eq!(outcome.final_text, "done");
    let summary = f
        .store
        .latest_summary(f.conversation)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((summary.from_seq, summary.through_seq), (0, 3));
    assert_eq!(summary.content.len(), BIG);
    assert!(f
        .store
        .admission(f.conversation)
        .await
        .unwrap()
        .active
        .is_none());
}

/// The committed request holds every message byte for byte, the admission
/// is idle and the request completed.
async fn assert_committed(f: &Fixture, request: RequestId, payloads: &Payloads, site: &str) {
    let record = f.store.request(request).await.unwrap().unwrap();
    assert_eq!(record.status, RequestStatus::Completed, "{site}");
    assert!(
        f.store
            .admission(f.conversation)
            .await
            .unwrap()
            .active
            .is_none(),
        "{site}: admission still held"
    );
    let transcript: Vec<Message> = f
        .store
        .transcript_window(f.conversation, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.message)
        .collect();
    assert_well_formed(site, &transcript);
    assert_eq!(transcript, payloads.committed(), "{site}: transcript");
}

// ---------------------------------------------------------------------------
// The quota as a user meets it.

/// A store that fills its own quota refuses the write that does not fit
/// with the storage-full error and keeps every committed request; reopened
/// past its quota it is still readable; reopened with a larger quota, the
/// refused request goes on and commits.
#[tokio::test]
async fn a_store_at_its_quota_keeps_everything_and_goes_on_with_a_larger_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("quota.db");
    let quota = |bytes: u64| SqliteOptions {
        max_database_bytes: Some(bytes),
        ..SqliteOptions::default()
    };
    let conversation = ConversationId::new();
    let namespace = Namespace::new("quota").unwrap();
    let session = |store: SqliteStore| {
        let model = ScriptedModel::new(vec![ScriptedReply::text("ok")]);
        AgentSession::new(
            Agent::new(Arc::new(model)),
            Arc::new(store),
            conversation,
            namespace.clone(),
            ContextPolicy::default(),
        )
    };
    let input = |i: usize| format!("{i:04}").repeat(BIG / 4);

    let store = SqliteStore::open_with(&path, quota(1 << 20)).await.unwrap();
    let first = session(store);
    let mut committed = 0;
    let refused = loop {
        assert!(committed < 64, "the quota never stopped a write");
        let request = RequestId::new();
        match first
            .run(request, &input(committed), RunContext::default())
            .await
        {
            Ok(_) => committed += 1,
            Err(e) => {
                assert_full("quota", Err::<(), _>(e));
                break request;
            }
        }
    };
    assert!(committed > 0, "not even one request fitted");
    let transcript = |store: &Arc<dyn Store>| {
        let store = store.clone();
        async move {
            store
                .transcript_window(conversation, 1000)
                .await
                .unwrap()
                .into_iter()
                .map(|e| e.message)
                .collect::<Vec<_>>()
        }
    };
    let expected = |requests: usize| {
        (0..requests)
            .flat_map(|i| [Message::user(input(i)), Message::assistant("ok")])
            .collect::<Vec<_>>()
    };
    assert_eq!(transcript(first.store()).await, expected(committed));
    drop(first);

    // Past a smaller quota: opens, and reads.
    let store = SqliteStore::open_with(&path, quota(64 << 10))
        .await
        .unwrap();
    let small = session(store);
    assert_eq!(transcript(small.store()).await, expected(committed));
    drop(small);

    let store = SqliteStore::open_with(&path, quota(8 << 20)).await.unwrap();
    let larger = session(store);
    let admission = larger.store().admission(conversation).await.unwrap();
    match admission.active {
        // Refused at its commit: recovered.
        Some(active) => {
            assert_eq!(active.request_id, refused);
            larger
                .recover_after_owner_exit(
                    refused,
                    &input(committed),
                    RunContext::default(),
                    admission.revision,
                    // The answer was not committed: the model is asked again.
                    ResumePolicy::RetryInterruptedTurn,
                )
                .await
                .unwrap();
        }
        // Refused at its claim: run again.
        None => {
            assert!(larger.store().request(refused).await.unwrap().is_none());
            larger
                .run(refused, &input(committed), RunContext::default())
                .await
                .unwrap();
        }
    }
    assert_eq!(transcript(larger.store()).await, expected(committed + 1));
}

/// A quota too small for the schema: a new database cannot be created, and
/// the error says why (full, not busy: it is no race with another opener,
/// and opening does not retry it).
#[tokio::test]
async fn a_quota_below_the_empty_schema_fails_the_open_with_a_full_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.db");
    let options = SqliteOptions {
        max_database_bytes: Some(8 << 10),
        ..SqliteOptions::default()
    };
    assert_full("open", SqliteStore::open_with(&path, options.clone()).await);
    // Nothing half-made stops a later open with room.
    let store = SqliteStore::open_with(
        &path,
        SqliteOptions {
            max_database_bytes: Some(1 << 20),
            ..options
        },
    )
    .await
    .unwrap();
    let id = ConversationId::new();
    store
        .ensure_conversation(&Namespace::new("tiny").unwrap(), id)
        .await
        .unwrap();
}

/// Only a full database is reported full: another store error is not.
#[tokio::test]
async fn other_store_errors_are_not_reported_full() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("not-a-database.db");
    std::fs::write(&path, vec![0x5a; 64 << 10]).unwrap();
    match SqliteStore::open(&path).await {
        Err(Error::Store(e)) => assert!(!e.is_full(), "{e}"),
        other => panic!("expected a store error, got {other:?}"),
    }
}
