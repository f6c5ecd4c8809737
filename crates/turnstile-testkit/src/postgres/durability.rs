//! Shared by the PostgreSQL durability tests (`crash_torture`,
//! `server_crash`, `terminate_backends`, `races`): a counter of the
//! store's own retries (its `tracing` events), an inspection pool outside
//! turnstile and the schema's consistency rules, a tool that proves a
//! journaled call never runs again, and the crash-free reference run of a
//! plan on SQLite.
//!
//! What is not PostgreSQL's — the plan, the scripted model, the effect
//! tools, the store wrapper with hooks, the reference run and the checks
//! of what a run committed, the torture itself — is [`crate::torture`].

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use turnstile::store::{JournalEntry, JournalStatus};
use turnstile::{
    Agent, Error, RequestId, SqliteStore, Store, Tool, ToolContext, ToolError, ToolSpec,
};

use crate::torture::checks::{self, Reference};
use crate::torture::{ConversationPlan, EffectTool, Plan, PlanModel, Tracer};

// ---------------------------------------------------------------------------
// The store's own retries, from its tracing events
// ---------------------------------------------------------------------------

/// What the store logged as `retrying a store step`, by cause.
#[derive(Default)]
pub struct Retries {
    pub count: AtomicU64,
    causes: Mutex<BTreeMap<String, u64>>,
    /// Retries by their attempt number (1 for a step's first retry).
    attempts: Mutex<BTreeMap<u64, u64>>,
}

impl Retries {
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    /// Causes, most frequent first, at most `n`.
    pub fn causes(&self, n: usize) -> Vec<(String, u64)> {
        let causes = self.causes.lock().expect("causes");
        let mut all: Vec<(String, u64)> = causes.iter().map(|(k, v)| (k.clone(), *v)).collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        all.truncate(n);
        all
    }

    /// How many retries were a step's first, second, … retry.
    pub fn by_attempt(&self) -> BTreeMap<u64, u64> {
        self.attempts.lock().expect("attempts").clone()
    }
}

/// A `tracing` subscriber that only counts the store's retries.
pub struct RetryCounter(pub Arc<Retries>);

impl tracing::Subscriber for RetryCounter {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.target().starts_with("turnstile_postgres")
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        #[derive(Default)]
        struct Fields {
            message: String,
            error: String,
            attempt: u64,
        }
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
                match field.name() {
                    "message" => self.message = format!("{value:?}"),
                    "error" => self.error = format!("{value:?}"),
                    _ => {}
                }
            }

            fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
                if field.name() == "attempt" {
                    self.attempt = value;
                }
            }
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        if fields.message == "retrying a store step" {
            self.0.count.fetch_add(1, Ordering::SeqCst);
            let cause: String = fields.error.chars().take(90).collect();
            *self
                .0
                .causes
                .lock()
                .expect("causes")
                .entry(cause)
                .or_default() += 1;
            *self
                .0
                .attempts
                .lock()
                .expect("attempts")
                .entry(fields.attempt)
                .or_default() += 1;
        }
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

/// Counts the store's retries on this thread (a current-thread runtime
/// polls every task here) until the guard drops.
pub fn count_retries_here() -> (Arc<Retries>, tracing::subscriber::DefaultGuard) {
    let retries = Arc::new(Retries::default());
    let guard = tracing::subscriber::set_default(RetryCounter(retries.clone()));
    (retries, guard)
}

/// Counts the store's retries in the whole process (once per process).
pub fn count_retries_everywhere() -> Arc<Retries> {
    static GLOBAL: std::sync::OnceLock<Arc<Retries>> = std::sync::OnceLock::new();
    GLOBAL
        .get_or_init(|| {
            let retries = Arc::new(Retries::default());
            tracing::subscriber::set_global_default(RetryCounter(retries.clone()))
                .expect("no other global tracing subscriber");
            retries
        })
        .clone()
}

// ---------------------------------------------------------------------------
// Outside turnstile: inspection
// ---------------------------------------------------------------------------

/// The application name of inspection connections (turnstile's own say
/// `turnstile`).
pub const INSPECTOR: &str = "turnstile-inspect";

/// A plain sqlx pool on `schema` of the database at `url`, for assertions.
pub fn inspect_pool(url: &str, schema: &str) -> PgPool {
    let options = PgConnectOptions::from_str(url)
        .expect("a PostgreSQL URL")
        .application_name(INSPECTOR)
        .options([("search_path", schema)]);
    PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(60))
        .connect_lazy_with(options)
}

/// Rows per turnstile table in the schema (runs and checkpoints wherever
/// they are kept, through their views): two runs of the same work must
/// have the same counts, or one of them wrote something twice (or lost it).
pub async fn row_counts(pool: &PgPool) -> BTreeMap<&'static str, i64> {
    let mut counts = BTreeMap::new();
    for table in [
        "conversations",
        "admissions",
        "request_ids",
        "requests",
        "all_runs",
        "run_messages",
        "transcript",
        "all_checkpoints",
        "verification_reports",
        "tool_calls",
        "approvals",
        "summaries",
        "events",
    ] {
        let n: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
            .fetch_one(pool)
            .await
            .unwrap_or_else(|e| panic!("count {table}: {e}"));
        counts.insert(table, n);
    }
    counts
}

/// Consistency rules every committed state of the schema keeps, whatever
/// crashed when (the PostgreSQL stand-in for SQLite's integrity check): a
/// description of each rule broken, none when all hold.
pub async fn consistency_violations(conn: &mut sqlx::PgConnection) -> Vec<String> {
    let rules: [(&str, &str); 17] = [
        (
            "no event is numbered past its admission's counter",
            "SELECT e.conversation_id::text FROM events e
             JOIN admissions a ON a.conversation_id = e.conversation_id
             WHERE e.seq > a.event_seq",
        ),
        (
            "no event kept in a request's row is numbered past its admission's counter",
            "SELECT r.conversation_id::text FROM requests r
             JOIN admissions a ON a.conversation_id = r.conversation_id
             WHERE r.admitted_event > a.event_seq OR r.settled_event > a.event_seq",
        ),
        (
            "no event number is taken twice, in the log or in the requests' rows",
            "SELECT conversation_id::text FROM (
                 SELECT conversation_id, seq FROM events
                 UNION ALL
                 SELECT conversation_id, admitted_event FROM requests
                 WHERE admitted_event IS NOT NULL
                 UNION ALL
                 SELECT conversation_id, settled_event FROM requests
                 WHERE settled_event IS NOT NULL
             ) numbered GROUP BY conversation_id, seq HAVING COUNT(*) > 1",
        ),
        (
            "every event is of a request of its conversation",
            "SELECT e.conversation_id::text FROM events e WHERE NOT EXISTS (
                 SELECT 1 FROM requests r
                 WHERE r.conversation_id = e.conversation_id AND r.request_id = e.request_id)",
        ),
        (
            "transcript seqs are 0.. without gaps",
            "SELECT conversation_id::text FROM transcript GROUP BY conversation_id
             HAVING MIN(seq) <> 0 OR MAX(seq) + 1 <> COUNT(*)",
        ),
        (
            "the entries after a transcript's length are its held request's messages",
            "SELECT t.conversation_id::text FROM transcript t
             JOIN conversations c ON c.conversation_id = t.conversation_id
             JOIN admissions a ON a.conversation_id = t.conversation_id
             WHERE t.seq >= c.transcript_length
               AND t.request_id IS DISTINCT FROM a.active_request_id",
        ),
        (
            "conversation version = completed requests",
            "SELECT c.conversation_id::text FROM conversations c
             WHERE c.version <> (SELECT COUNT(*) FROM requests r
                 WHERE r.conversation_id = c.conversation_id AND r.status = 'completed')",
        ),
        (
            "an active request holds its conversation's admission",
            "SELECT r.request_id::text FROM requests r WHERE r.status = 'active'
             AND NOT EXISTS (SELECT 1 FROM admissions a WHERE a.conversation_id = r.conversation_id
                 AND a.active_request_id = r.request_id)",
        ),
        (
            "an admission is held by an active request",
            "SELECT a.conversation_id::text FROM admissions a WHERE a.active_request_id IS NOT NULL
             AND NOT EXISTS (SELECT 1 FROM requests r WHERE r.conversation_id = a.conversation_id
                 AND r.request_id = a.active_request_id AND r.status = 'active')",
        ),
        (
            "a completed request has no pending messages",
            "SELECT DISTINCT m.request_id::text FROM run_messages m JOIN requests r
                 ON r.conversation_id = m.conversation_id AND r.request_id = m.request_id
             WHERE r.status = 'completed'",
        ),
        (
            "a completed request's transcript entries are first_seq..end_seq",
            "SELECT r.request_id::text FROM requests r WHERE r.status = 'completed'
             AND (r.end_seq - r.first_seq) <> (SELECT COUNT(*) FROM transcript t
                 WHERE t.conversation_id = r.conversation_id AND t.request_id = r.request_id
                   AND t.seq >= r.first_seq AND t.seq < r.end_seq)
             OR EXISTS (SELECT 1 FROM transcript t WHERE t.conversation_id = r.conversation_id
                 AND t.request_id = r.request_id AND (t.seq < r.first_seq OR t.seq >= r.end_seq))",
        ),
        (
            "every request id is reserved in its conversation",
            "SELECT r.request_id::text FROM requests r LEFT JOIN request_ids k
                 ON k.request_id = r.request_id
             WHERE k.conversation_id IS DISTINCT FROM r.conversation_id",
        ),
        (
            "a run has one checkpoint per turn, wherever it is kept",
            "SELECT run_id::text FROM all_checkpoints
             GROUP BY conversation_id, run_id, turn HAVING COUNT(*) > 1",
        ),
        (
            "a first run's earlier checkpoints are of turns before the one in its request's row",
            "SELECT f.request_id::text FROM first_run_checkpoints f JOIN requests r
                 ON r.conversation_id = f.conversation_id AND r.request_id = f.request_id
             WHERE r.phase IS NULL OR f.turn >= r.turn",
        ),
        (
            "a request has at most one running run",
            "SELECT request_id::text FROM all_runs WHERE status = 'running'
             GROUP BY request_id HAVING COUNT(*) > 1",
        ),
        (
            "a finished request has no running run",
            "SELECT DISTINCT u.request_id::text FROM all_runs u JOIN requests r
                 ON r.conversation_id = u.conversation_id AND r.request_id = u.request_id
             WHERE u.status = 'running' AND r.status <> 'active'",
        ),
        (
            "a completed request's tool calls all have results",
            "SELECT DISTINCT t.request_id::text FROM tool_calls t JOIN requests r
                 ON r.conversation_id = t.conversation_id AND r.request_id = t.request_id
             WHERE r.status = 'completed' AND t.status = 'requested'",
        ),
    ];
    let mut broken = Vec::new();
    for (rule, sql) in rules {
        let keys: Vec<String> = sqlx::query_scalar(sql)
            .fetch_all(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("consistency rule {rule:?}: {e}"));
        if !keys.is_empty() {
            broken.push(format!("{rule}: broken for {keys:?}"));
        }
    }
    broken
}

/// `url` with its host and port replaced by `127.0.0.1:port` (the rest,
/// user, password, database and query, kept) and `sslmode=disable`.
pub fn url_via(url: &str, port: u16) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL with a scheme");
    let (authority, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let userinfo = authority
        .rsplit_once('@')
        .map(|(user, _)| format!("{user}@"))
        .unwrap_or_default();
    let separator = if tail.contains('?') { '&' } else { '?' };
    format!("{scheme}://{userinfo}127.0.0.1:{port}{tail}{separator}sslmode=disable")
}

// ---------------------------------------------------------------------------
// Tools that check the journal before their effect
// ---------------------------------------------------------------------------

/// Something a tool does (blocking: it runs on a blocking thread) before
/// its effect, e.g. terminating every backend of the database.
pub type BeforeEffect = Arc<dyn Fn() + Send + Sync>;

/// What [`CheckedTool`]s observed.
#[derive(Default)]
pub struct ToolWatch {
    /// Calls that started although the journal already held their result.
    pub reruns_of_journaled_calls: Mutex<Vec<String>>,
    pub executions: AtomicU64,
}

/// An [`EffectTool`] that first reads the journal through a store of its
/// own: a call whose result is journaled must never start again.
pub struct CheckedTool {
    pub effect: EffectTool,
    pub journal: Arc<dyn Store>,
    pub watch: Arc<ToolWatch>,
    pub before: Option<BeforeEffect>,
}

#[turnstile::async_trait]
impl Tool for CheckedTool {
    fn spec(&self) -> ToolSpec {
        self.effect.spec()
    }

    async fn call(&self, args: Value, ctx: ToolContext) -> Result<turnstile::Content, ToolError> {
        let journal = read_journal_patiently(&*self.journal, ctx.request_id, ctx.turn).await;
        if let Some(entry) = journal
            .iter()
            .find(|e| e.call_id == ctx.call_id && e.status != JournalStatus::Requested)
        {
            self.watch
                .reruns_of_journaled_calls
                .lock()
                .expect("watch")
                .push(format!(
                    "{} started again, journaled {:?} by run {}",
                    ctx.idempotency_key, entry.status, entry.run_id
                ));
        }
        self.watch.executions.fetch_add(1, Ordering::SeqCst);
        if let Some(before) = &self.before {
            let before = before.clone();
            tokio::task::spawn_blocking(move || before())
                .await
                .expect("the tool's action before its effect");
        }
        self.effect.call(args, ctx).await
    }
}

/// The journal of a turn, read again and again while the store fails (the
/// server may be down): a minute at most.
async fn read_journal_patiently(
    store: &dyn Store,
    request: RequestId,
    turn: u32,
) -> Vec<JournalEntry> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match store.journal(request, turn).await {
            Ok(journal) => return journal,
            Err(Error::Store(e)) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("a tool could not read its journal: {e}"),
        }
    }
}

/// The agent of one conversation, as [`crate::torture::agent`] builds it,
/// with checked tools.
pub fn checked_agent(
    conversation: &ConversationPlan,
    log: &Path,
    paced: bool,
    journal: Arc<dyn Store>,
    watch: Arc<ToolWatch>,
    before: Option<BeforeEffect>,
) -> (Agent, Arc<PlanModel>) {
    let tracer = Tracer { enabled: false };
    let model = Arc::new(PlanModel::new(conversation, paced, tracer));
    let agent = crate::torture::TOOLS.iter().fold(
        Agent::new(model.clone()).with_system_prompt("do the planned work"),
        |agent, name| {
            agent.with_tool(Arc::new(CheckedTool {
                effect: EffectTool {
                    name,
                    conversation: conversation.index,
                    log: log.to_owned(),
                    paced,
                    tracer,
                },
                journal: journal.clone(),
                watch: watch.clone(),
                before: before.clone(),
            }))
        },
    );
    (agent, model)
}

// ---------------------------------------------------------------------------
// The crash-free reference
// ---------------------------------------------------------------------------

/// A fresh `SqliteStore::in_memory()`: where the crash-free reference of a
/// plan runs, what every PostgreSQL run of it must commit.
pub async fn reference_store() -> Arc<dyn Store> {
    Arc::new(SqliteStore::in_memory().await.expect("in-memory store"))
}

/// The plan, unpaced, on [`reference_store`], with no crash.
pub async fn reference_run(plan: &Plan, log: &Path) -> Reference {
    checks::reference_run(reference_store().await, plan, log).await
}

/// The first `n` conversations of a plan.
pub fn first_conversations(plan: &Plan, n: usize) -> Plan {
    Plan {
        conversations: plan.conversations[..n].to_vec(),
    }
}
