//! Shared by the PostgreSQL durability tests (`crash_torture`,
//! `server_crash`, `terminate_backends`, `races`): a store wrapper that
//! lets a test watch or steer every store call, a counter of the store's
//! own retries (its `tracing` events), an inspection pool outside
//! turnstile, a tool that proves a journaled call never runs again, the
//! crash-free reference run of a `torture_support` plan, and the checks
//! of a committed transcript.
//!
//! The plan, the scripted model and the effect tools come from the SQLite
//! torture's `torture_support` (included by path by the test files).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use turnstile::store::{
    Admission, ClaimOutcome, Conversation, Fence, JournalEntry, JournalStatus, NewRequest,
    RecoveryClaim, RequestRecord, RunRecord, StoredOutcome, StoredSummary, SummaryCommit,
    SummaryPass, ToolResult, TranscriptEntry,
};
use turnstile::{
    Agent, AgentSession, ContextPolicy, ConversationId, Error, LoopCheckpoint, Message, Namespace,
    RequestId, Revision, RunContext, RunId, SqliteStore, Store, Tool, ToolContext, ToolError,
    ToolSpec, Usage,
};

use super::torture_support::{namespace, ConversationPlan, EffectTool, Plan, PlanModel, Tracer};

// ---------------------------------------------------------------------------
// A store wrapper with hooks
// ---------------------------------------------------------------------------

/// One store call, as a [`Hook`] sees it.
#[derive(Clone, Debug)]
pub struct Call {
    pub op: &'static str,
    pub write: bool,
    /// What the SQLite torture traces: the request id of a write (the
    /// conversation id for `ensure_conversation`), nothing for a read.
    pub detail: String,
    pub request: Option<RequestId>,
    pub run: Option<RunId>,
    pub turn: Option<u32>,
    pub call_id: Option<String>,
}

impl Call {
    fn read(op: &'static str) -> Self {
        Self {
            op,
            write: false,
            detail: String::new(),
            request: None,
            run: None,
            turn: None,
            call_id: None,
        }
    }

    fn write(op: &'static str, request: RequestId) -> Self {
        Self {
            op,
            write: true,
            detail: request.to_string(),
            request: Some(request),
            run: None,
            turn: None,
            call_id: None,
        }
    }

    fn fenced(op: &'static str, fence: &Fence) -> Self {
        Self {
            run: Some(fence.run_id),
            ..Self::write(op, fence.request_id)
        }
    }

    fn at_turn(self, turn: u32) -> Self {
        Self {
            turn: Some(turn),
            ..self
        }
    }
}

/// Sees every call of a [`Hooked`] store: `enter` before it starts (and may
/// hold it there), `leave` once it returned, with the token `enter` gave.
#[turnstile::async_trait]
pub trait Hook: Send + Sync + 'static {
    async fn enter(&self, call: &Call) -> u64;
    fn leave(&self, call: &Call, token: u64, ok: bool);
}

/// Delegates every call, unchanged, to `inner`, between the hook's `enter`
/// and `leave`.
pub struct Hooked {
    pub inner: Arc<dyn Store>,
    pub hook: Arc<dyn Hook>,
}

impl Hooked {
    async fn wrap<T>(
        &self,
        call: Call,
        f: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let token = self.hook.enter(&call).await;
        let result = f.await;
        self.hook.leave(&call, token, result.is_ok());
        result
    }
}

#[turnstile::async_trait]
impl Store for Hooked {
    async fn ensure_conversation(
        &self,
        namespace: &Namespace,
        id: ConversationId,
    ) -> Result<Conversation, Error> {
        let call = Call {
            op: "ensure_conversation",
            write: true,
            detail: id.to_string(),
            ..Call::read("ensure_conversation")
        };
        self.wrap(call, self.inner.ensure_conversation(namespace, id))
            .await
    }

    async fn conversation(
        &self,
        namespace: &Namespace,
        id: ConversationId,
    ) -> Result<Conversation, Error> {
        self.wrap(
            Call::read("conversation"),
            self.inner.conversation(namespace, id),
        )
        .await
    }

    async fn admission(&self, conversation_id: ConversationId) -> Result<Admission, Error> {
        self.wrap(
            Call::read("admission"),
            self.inner.admission(conversation_id),
        )
        .await
    }

    async fn claim(&self, claim: &NewRequest) -> Result<ClaimOutcome, Error> {
        let call = Call {
            run: Some(claim.run_id),
            ..Call::write("claim", claim.request_id)
        };
        self.wrap(call, self.inner.claim(claim)).await
    }

    async fn claim_recovery(&self, claim: &RecoveryClaim) -> Result<Fence, Error> {
        let call = Call {
            run: Some(claim.new_run),
            ..Call::write("claim_recovery", claim.request_id)
        };
        self.wrap(call, self.inner.claim_recovery(claim)).await
    }

    async fn request(&self, request_id: RequestId) -> Result<Option<RequestRecord>, Error> {
        self.wrap(Call::read("request"), self.inner.request(request_id))
            .await
    }

    async fn run(&self, run_id: RunId) -> Result<Option<RunRecord>, Error> {
        self.wrap(Call::read("run"), self.inner.run(run_id)).await
    }

    async fn begin_turn(&self, fence: &Fence, checkpoint: &LoopCheckpoint) -> Result<(), Error> {
        let call = Call::fenced("begin_turn", fence).at_turn(checkpoint.turn);
        self.wrap(call, self.inner.begin_turn(fence, checkpoint))
            .await
    }

    async fn record_model_response(
        &self,
        fence: &Fence,
        checkpoint: &LoopCheckpoint,
        assistant: &Message,
    ) -> Result<(), Error> {
        let call = Call::fenced("record_model_response", fence).at_turn(checkpoint.turn);
        self.wrap(
            call,
            self.inner
                .record_model_response(fence, checkpoint, assistant),
        )
        .await
    }

    async fn record_tool_result(
        &self,
        fence: &Fence,
        turn: u32,
        call_id: &str,
        result: &ToolResult,
    ) -> Result<(), Error> {
        let call = Call {
            call_id: Some(call_id.to_owned()),
            ..Call::fenced("record_tool_result", fence).at_turn(turn)
        };
        self.wrap(
            call,
            self.inner.record_tool_result(fence, turn, call_id, result),
        )
        .await
    }

    async fn finish_turn(
        &self,
        fence: &Fence,
        checkpoint: &LoopCheckpoint,
        messages: &[Message],
        next: Option<&LoopCheckpoint>,
    ) -> Result<(), Error> {
        let call = Call::fenced("finish_turn", fence).at_turn(checkpoint.turn);
        self.wrap(
            call,
            self.inner.finish_turn(fence, checkpoint, messages, next),
        )
        .await
    }

    async fn commit(
        &self,
        fence: &Fence,
        checkpoint: &LoopCheckpoint,
        final_message: &Message,
    ) -> Result<StoredOutcome, Error> {
        let call = Call::fenced("commit", fence).at_turn(checkpoint.turn);
        self.wrap(call, self.inner.commit(fence, checkpoint, final_message))
            .await
    }

    async fn fail_run(
        &self,
        fence: &Fence,
        error: &str,
        settled: Option<&LoopCheckpoint>,
    ) -> Result<(), Error> {
        self.wrap(
            Call::fenced("fail_run", fence),
            self.inner.fail_run(fence, error, settled),
        )
        .await
    }

    async fn abandon(
        &self,
        conversation_id: ConversationId,
        request_id: RequestId,
        expected_revision: Revision,
    ) -> Result<Revision, Error> {
        self.wrap(
            Call::write("abandon", request_id),
            self.inner
                .abandon(conversation_id, request_id, expected_revision),
        )
        .await
    }

    async fn transcript_window(
        &self,
        conversation_id: ConversationId,
        limit: u32,
    ) -> Result<Vec<TranscriptEntry>, Error> {
        self.wrap(
            Call::read("transcript_window"),
            self.inner.transcript_window(conversation_id, limit),
        )
        .await
    }

    async fn transcript_range(
        &self,
        conversation_id: ConversationId,
        from: u64,
        to: u64,
    ) -> Result<Vec<TranscriptEntry>, Error> {
        self.wrap(
            Call::read("transcript_range"),
            self.inner.transcript_range(conversation_id, from, to),
        )
        .await
    }

    async fn latest_checkpoint(&self, run_id: RunId) -> Result<Option<LoopCheckpoint>, Error> {
        self.wrap(
            Call::read("latest_checkpoint"),
            self.inner.latest_checkpoint(run_id),
        )
        .await
    }

    async fn checkpoints(&self, run_id: RunId) -> Result<Vec<LoopCheckpoint>, Error> {
        self.wrap(Call::read("checkpoints"), self.inner.checkpoints(run_id))
            .await
    }

    async fn request_messages(
        &self,
        request_id: RequestId,
        count: u64,
    ) -> Result<Vec<Message>, Error> {
        self.wrap(
            Call::read("request_messages"),
            self.inner.request_messages(request_id, count),
        )
        .await
    }

    async fn journal(&self, request_id: RequestId, turn: u32) -> Result<Vec<JournalEntry>, Error> {
        self.wrap(Call::read("journal"), self.inner.journal(request_id, turn))
            .await
    }

    async fn recovery_usage(&self, request_id: RequestId) -> Result<Usage, Error> {
        self.wrap(
            Call::read("recovery_usage"),
            self.inner.recovery_usage(request_id),
        )
        .await
    }

    async fn latest_summary(
        &self,
        conversation_id: ConversationId,
    ) -> Result<Option<StoredSummary>, Error> {
        self.wrap(
            Call::read("latest_summary"),
            self.inner.latest_summary(conversation_id),
        )
        .await
    }

    async fn record_summary_pass(&self, fence: &Fence, pass: &SummaryPass) -> Result<(), Error> {
        self.wrap(
            Call::fenced("record_summary_pass", fence),
            self.inner.record_summary_pass(fence, pass),
        )
        .await
    }

    async fn commit_summary(
        &self,
        fence: &Fence,
        summary: &SummaryCommit,
    ) -> Result<StoredSummary, Error> {
        self.wrap(
            Call::fenced("commit_summary", fence),
            self.inner.commit_summary(fence, summary),
        )
        .await
    }
}

/// The hook of the SQLite torture's `TracedStore`: `@C + KIND DETAIL` on
/// entering a store call and `@C - KIND` on leaving it, `KIND` being
/// `write:OP` or `read:OP`.
pub struct TraceHook {
    pub conversation: usize,
    pub tracer: Tracer,
}

#[turnstile::async_trait]
impl Hook for TraceHook {
    async fn enter(&self, call: &Call) -> u64 {
        let kind = if call.write { "write" } else { "read" };
        self.tracer.event(
            self.conversation,
            &format!("+ {kind}:{} {}", call.op, call.detail),
        );
        0
    }

    fn leave(&self, call: &Call, _token: u64, _ok: bool) {
        let kind = if call.write { "write" } else { "read" };
        self.tracer
            .event(self.conversation, &format!("- {kind}:{}", call.op));
    }
}

// ---------------------------------------------------------------------------
// The store's own retries, from its tracing events
// ---------------------------------------------------------------------------

/// What the store logged as `retrying a store step`, by cause.
#[derive(Default)]
pub struct Retries {
    pub count: AtomicU64,
    causes: Mutex<BTreeMap<String, u64>>,
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
        }
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
                match field.name() {
                    "message" => self.message = format!("{value:?}"),
                    "error" => self.error = format!("{value:?}"),
                    _ => {}
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

/// Rows per turnstile table in the schema: two runs of the same work must
/// have the same counts, or one of them wrote something twice (or lost it).
pub async fn row_counts(pool: &PgPool) -> BTreeMap<&'static str, i64> {
    let mut counts = BTreeMap::new();
    for table in [
        "conversations",
        "admissions",
        "request_ids",
        "requests",
        "runs",
        "run_messages",
        "transcript",
        "loop_checkpoints",
        "verification_reports",
        "tool_calls",
        "summaries",
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
    let rules: [(&str, &str); 10] = [
        (
            "transcript seqs are 0.. without gaps",
            "SELECT conversation_id::text FROM transcript GROUP BY conversation_id
             HAVING MIN(seq) <> 0 OR MAX(seq) + 1 <> COUNT(*)",
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
            "a request has at most one running run",
            "SELECT request_id::text FROM runs WHERE status = 'running'
             GROUP BY request_id HAVING COUNT(*) > 1",
        ),
        (
            "a finished request has no running run",
            "SELECT DISTINCT u.request_id::text FROM runs u JOIN requests r
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

    async fn call(&self, args: Value, ctx: ToolContext) -> Result<String, ToolError> {
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

/// The agent of one conversation, as `torture_support::agent` builds it,
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
    let agent = super::torture_support::TOOLS.iter().fold(
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
// The crash-free reference and the final checks
// ---------------------------------------------------------------------------

/// A committed transcript entry: (seq, request, message).
pub type Entry = (u64, RequestId, Message);

pub struct Reference {
    pub transcripts: HashMap<ConversationId, Vec<Entry>>,
    pub outcomes: HashMap<RequestId, StoredOutcome>,
    pub messages: HashMap<RequestId, Vec<Message>>,
    pub effects: HashMap<String, usize>,
}

/// The plan, unpaced, on `SqliteStore::in_memory()`, with no crash: what
/// every PostgreSQL run of it must commit.
pub async fn reference_run(plan: &Plan, log: &Path) -> Reference {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::in_memory().await.expect("in-memory store"));
    let quiet = Tracer { enabled: false };
    let mut reference = Reference {
        transcripts: HashMap::new(),
        outcomes: HashMap::new(),
        messages: HashMap::new(),
        effects: HashMap::new(),
    };
    for conversation in &plan.conversations {
        let (agent, _) = super::torture_support::agent(conversation, log, false, quiet);
        let session = AgentSession::new(
            agent,
            store.clone(),
            conversation.id,
            namespace(),
            ContextPolicy::default(),
        );
        for request in &conversation.requests {
            let outcome = session
                .run(request.id, &request.input, RunContext::default())
                .await
                .expect("the crash-free reference run");
            reference.messages.insert(request.id, outcome.messages);
            let stored = store
                .request(request.id)
                .await
                .expect("read a reference request")
                .and_then(|r| r.outcome)
                .expect("a committed reference request");
            reference.outcomes.insert(request.id, stored);
        }
        reference.transcripts.insert(
            conversation.id,
            transcript_of(&*store, conversation.id).await,
        );
    }
    for key in std::fs::read_to_string(log)
        .expect("reference side-effect log")
        .lines()
    {
        *reference.effects.entry(key.to_owned()).or_default() += 1;
    }
    reference
}

/// A conversation's whole committed transcript.
pub async fn transcript_of(store: &dyn Store, conversation: ConversationId) -> Vec<Entry> {
    store
        .transcript_range(conversation, 0, u64::MAX)
        .await
        .expect("read the transcript")
        .into_iter()
        .map(|e| (e.seq, e.request_id, e.message))
        .collect()
}

/// Every tool call is answered exactly once, right after its call; returns
/// the number of calls.
pub fn assert_well_formed(what: &str, transcript: &[Message]) -> usize {
    let mut calls = 0;
    let mut pending: Vec<&str> = Vec::new();
    for message in transcript {
        match message {
            Message::Assistant { tool_calls, .. } => {
                assert!(pending.is_empty(), "{what}: calls {pending:?} unanswered");
                pending = tool_calls.iter().map(|c| c.id.as_str()).collect();
                calls += pending.len();
            }
            Message::Tool { call_id, .. } => {
                let at = pending.iter().position(|p| p == call_id);
                let at = at.unwrap_or_else(|| panic!("{what}: orphaned or repeated {call_id}"));
                pending.remove(at);
            }
            _ => assert!(pending.is_empty(), "{what}: calls {pending:?} unanswered"),
        }
    }
    assert!(pending.is_empty(), "{what}: calls {pending:?} unanswered");
    calls
}

/// The checks every finished PostgreSQL run of a plan passes, whatever
/// failed during it: each conversation holds exactly the reference's
/// transcript, every message once, each tool call answered once; every
/// request is completed, its journal holds each planned call once with
/// its result; a retry of every request replays its answer without any
/// model or tool call. Outcomes must equal the reference's, except the
/// usage and tool-call count of the requests in `spent_more`, which may be
/// higher (a model call whose answer a failed step lost still cost
/// tokens). Returns the journaled calls.
pub async fn assert_plan_committed(
    store: Arc<dyn Store>,
    plan: &Plan,
    reference: &Reference,
    spent_more: &HashSet<RequestId>,
    log: &Path,
) -> usize {
    let mut journaled = 0;
    for conversation in &plan.conversations {
        let what = format!("conversation {}", conversation.index);
        let header = store
            .conversation(&namespace(), conversation.id)
            .await
            .expect("conversation");
        assert_eq!(
            header.version,
            conversation.requests.len() as u64,
            "{what}: version"
        );
        let admission = store.admission(conversation.id).await.expect("admission");
        assert!(admission.active.is_none(), "{what}: still held");
        let transcript = transcript_of(&*store, conversation.id).await;
        let messages: Vec<Message> = transcript.iter().map(|e| e.2.clone()).collect();
        assert_well_formed(&what, &messages);
        let mut seen = HashSet::new();
        for message in &messages {
            let text = serde_json::to_string(message).expect("serialize");
            assert!(seen.insert(text), "{what}: duplicated message {message:?}");
        }
        assert_eq!(
            transcript, reference.transcripts[&conversation.id],
            "{what}: the committed transcript differs from the crash-free run's"
        );
        for request in &conversation.requests {
            let record = store
                .request(request.id)
                .await
                .expect("request")
                .expect("the request exists");
            assert_eq!(
                record.status,
                turnstile::store::RequestStatus::Completed,
                "{what}"
            );
            let stored = record.outcome.expect("a completed request has an outcome");
            let expected = &reference.outcomes[&request.id];
            if spent_more.contains(&request.id) {
                assert!(
                    stored.usage.total() >= expected.usage.total(),
                    "{what}: request {} cost less than the crash-free run",
                    request.index
                );
                assert!(stored.tool_calls >= expected.tool_calls);
                let normalized = StoredOutcome {
                    run_id: expected.run_id,
                    usage: expected.usage,
                    tool_calls: expected.tool_calls,
                    ..stored.clone()
                };
                assert_eq!(normalized, *expected, "{what}: request {}", request.index);
            } else {
                let normalized = StoredOutcome {
                    run_id: expected.run_id,
                    ..stored.clone()
                };
                assert_eq!(
                    normalized, *expected,
                    "{what}: the outcome of request {} differs from the crash-free run's",
                    request.index
                );
            }
            for (i, turn) in request.turns.iter().enumerate() {
                let t = u32::try_from(i + 1).expect("small");
                let journal = store.journal(request.id, t).await.expect("journal");
                let mut ids: Vec<&str> = journal.iter().map(|e| e.call_id.as_str()).collect();
                ids.sort_unstable();
                let mut planned: Vec<&str> = turn.calls.iter().map(|c| c.id.as_str()).collect();
                planned.sort_unstable();
                assert_eq!(ids, planned, "{what}: journal of turn {t}");
                for entry in &journal {
                    assert_eq!(entry.status, JournalStatus::Completed, "{what}: {entry:?}");
                }
                journaled += journal.len();
            }
        }
        // A retry of every request replays the stored answer.
        let (agent, model) =
            super::torture_support::agent(conversation, log, false, Tracer { enabled: false });
        let session = AgentSession::new(
            agent,
            store.clone(),
            conversation.id,
            namespace(),
            ContextPolicy::default(),
        );
        for request in &conversation.requests {
            let replay = session
                .run(request.id, &request.input, RunContext::default())
                .await
                .expect("replay");
            assert!(
                replay.replayed,
                "{what}: request {} ran again",
                request.index
            );
            assert_eq!(replay.messages, reference.messages[&request.id]);
        }
        assert_eq!(model.calls(), 0, "{what}: a replay called the model");
    }
    journaled
}

/// Executions per idempotency key in a side-effect log.
pub fn effects_in(log: &Path) -> HashMap<String, usize> {
    let mut effects = HashMap::new();
    if let Ok(text) = std::fs::read_to_string(log) {
        assert!(
            text.is_empty() || text.ends_with('\n'),
            "torn side-effect log line"
        );
        for key in text.lines() {
            *effects.entry(key.to_owned()).or_default() += 1;
        }
    }
    effects
}

/// The first `n` conversations of a plan.
pub fn first_conversations(plan: &Plan, n: usize) -> Plan {
    Plan {
        conversations: plan.conversations[..n].to_vec(),
    }
}
