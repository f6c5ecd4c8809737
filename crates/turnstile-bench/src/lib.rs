//! Helpers shared by the benches (`durability`, `anatomy`): stores on
//! temp-file WAL databases, the bare-insert floor, one agent turn written
//! through the `Store` trait, a scripted agent with one tool, and seeding of
//! long conversations; and the floors `turnstile bench` measures against
//! ([`baseline`]).

pub mod baseline;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteAutoVacuum, SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{ConnectOptions, Connection, SqliteConnection};
use turnstile::store::{ClaimOutcome, Fence, InputHash, NewRequest, ToolResult};
use turnstile::Durability;
use turnstile::{
    Agent, AgentSession, CheckpointPhase, ContextPolicy, ConversationId, LoopCheckpoint, Message,
    Namespace, RequestId, RunContext, RunId, ScriptedModel, ScriptedReply, SqliteOptions,
    SqliteStore, Store, Tool, ToolCall, ToolContext, ToolError, ToolSpec, Usage,
};

/// Both durability modes, with the name used in bench ids.
pub const MODES: [(Durability, &str); 2] =
    [(Durability::Full, "full"), (Durability::Normal, "normal")];

/// Size of the messages the benches write: the issue's workload has two
/// ~500-byte messages per turn.
pub const MESSAGE_BYTES: usize = 500;

/// `bytes` of deterministic, plain text.
pub fn text(tag: &str, bytes: usize) -> String {
    let mut s = format!("{tag}: ");
    let words = [
        "durable",
        "agent",
        "turn",
        "sqlite",
        "checkpoint",
        "admission",
    ];
    let mut i = 0;
    while s.len() < bytes {
        s.push_str(words[i % words.len()]);
        s.push(' ');
        i += 1;
    }
    s.truncate(bytes);
    s
}

pub fn namespace() -> Namespace {
    Namespace::new("bench").expect("valid namespace")
}

/// A multi-thread runtime, as an application would run turnstile in.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A directory for bench databases (`$TMPDIR`, a real disk here).
pub fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("turnstile-bench-")
        .tempdir()
        .expect("temp dir")
}

pub async fn open_store(path: &Path, durability: Durability) -> SqliteStore {
    SqliteStore::open_with(
        path,
        SqliteOptions {
            durability,
            ..SqliteOptions::default()
        },
    )
    .await
    .expect("open store")
}

/// The connect options `SqliteStore::open_with` uses: WAL, the synchronous
/// level of `durability`, a 30 s busy timeout, foreign keys on.
fn store_like_options(path: &Path, durability: Durability) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .auto_vacuum(SqliteAutoVacuum::Incremental)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(match durability {
            Durability::Full => SqliteSynchronous::Full,
            Durability::Normal => SqliteSynchronous::Normal,
        })
        .busy_timeout(Duration::from_secs(30))
        .foreign_keys(true)
}

const BARE_TABLE: &str = "CREATE TABLE IF NOT EXISTS steps (
    id INTEGER PRIMARY KEY, created_at INTEGER NOT NULL, body TEXT NOT NULL)";
const BARE_INSERT: &str = "INSERT INTO steps (created_at, body) VALUES (?1, ?2)";

/// The floor for one durable step: a single-row INSERT transaction through
/// sqlx, on a database opened like the store's (same pragmas) and through a
/// pool like the store's writer (one pinned connection, no ping before it is
/// handed out, `BEGIN IMMEDIATE`).
pub struct BareInsert {
    pool: SqlitePool,
    body: String,
}

impl BareInsert {
    pub async fn open(path: &Path, durability: Durability) -> Self {
        Self::with_pool(store_like_options(path, durability)).await
    }

    /// The same on a private in-memory database with an in-memory journal,
    /// shared-cache so that the pool's connections see one database.
    /// `SqliteStore::in_memory` holds its database in its one connection
    /// (a `memdb` copy): the in-memory floors are SQLite's plain memory
    /// database, not the store's.
    pub async fn in_memory() -> Self {
        let uri = format!(
            "sqlite:file:bench-{}?mode=memory&cache=shared",
            uuid::Uuid::new_v4()
        );
        let connect = uri
            .parse::<SqliteConnectOptions>()
            .expect("in-memory uri")
            .journal_mode(SqliteJournalMode::Memory)
            .foreign_keys(true);
        Self::with_pool(connect).await
    }

    async fn with_pool(connect: SqliteConnectOptions) -> Self {
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .test_before_acquire(false)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(connect)
            .await
            .expect("open bare database");
        sqlx::query(BARE_TABLE)
            .execute(&pool)
            .await
            .expect("create table");
        Self {
            pool,
            body: text("step", MESSAGE_BYTES),
        }
    }

    /// One committed single-row INSERT transaction.
    pub async fn insert_commit(&self) {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .expect("begin");
        sqlx::query(BARE_INSERT)
            .bind(now_ms())
            .bind(&self.body)
            .execute(&mut *tx)
            .await
            .expect("insert");
        tx.commit().await.expect("commit");
    }
}

/// The same floor on one `SqliteConnection` with no pool: what a commit
/// costs without the pool's acquire and release.
pub struct BareInsertConn {
    conn: SqliteConnection,
    body: String,
}

impl BareInsertConn {
    pub async fn open(path: &Path, durability: Durability) -> Self {
        let mut conn = store_like_options(path, durability)
            .connect()
            .await
            .expect("open bare connection");
        sqlx::query(BARE_TABLE)
            .execute(&mut conn)
            .await
            .expect("create table");
        Self {
            conn,
            body: text("step", MESSAGE_BYTES),
        }
    }

    /// One empty round trip to the connection's worker thread.
    pub async fn ping(&mut self) {
        self.conn.ping().await.expect("ping");
    }

    pub async fn insert_commit(&mut self) {
        let mut tx = self
            .conn
            .begin_with("BEGIN IMMEDIATE")
            .await
            .expect("begin");
        sqlx::query(BARE_INSERT)
            .bind(now_ms())
            .bind(&self.body)
            .execute(&mut *tx)
            .await
            .expect("insert");
        tx.commit().await.expect("commit");
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A new conversation with an admitted request: the fence of its run.
pub async fn admitted(store: &dyn Store) -> Fence {
    let conversation = ConversationId::new();
    store
        .ensure_conversation(&namespace(), conversation)
        .await
        .expect("conversation");
    claim(store, conversation).await
}

/// Claims an idle conversation for a new request.
pub async fn claim(store: &dyn Store, conversation: ConversationId) -> Fence {
    let revision = store
        .admission(conversation)
        .await
        .expect("admission")
        .revision;
    let input = text("user", MESSAGE_BYTES);
    let request_id = RequestId::new();
    // The engine's first run: the request's id.
    let run_id = RunId::first_of(request_id);
    let claim = NewRequest {
        conversation_id: conversation,
        request_id,
        input_sha256: InputHash::of(&input),
        input: Message::user(input),
        expected_revision: revision,
        expected_created_at: None,
        run_id,
        agent_fingerprint: "bench".into(),
        first_turn: Some(first_turn(run_id)),
        deadline_at: None,
        budget: Default::default(),
    };
    match store.claim(&claim).await.expect("claim") {
        ClaimOutcome::Admitted(fence) => fence,
        ClaimOutcome::Existing(_) => panic!("a fresh request id is already known"),
    }
}

/// The write-ahead of a request's first turn, as the session saves it
/// with the claim.
pub fn first_turn(run_id: RunId) -> LoopCheckpoint {
    LoopCheckpoint {
        run_id,
        turn: 1,
        phase: CheckpointPhase::TurnInFlight,
        usage: Usage::default(),
        tool_calls_count: 0,
        verification_reports: Vec::new(),
        message_count: 1,
        created_at: 0,
    }
}

/// The loop state of an admitted request, as the turn loop keeps it.
pub struct TurnWriter {
    pub fence: Fence,
    pub checkpoint: LoopCheckpoint,
    assistant_text: String,
    tool_output: String,
}

impl TurnWriter {
    /// Starts after a claim that saved the first turn's write-ahead: the
    /// user input is the only message.
    pub fn new(fence: Fence) -> Self {
        Self {
            checkpoint: first_turn(fence.run_id),
            fence,
            assistant_text: text("assistant", MESSAGE_BYTES),
            tool_output: text("tool", MESSAGE_BYTES),
        }
    }

    /// The full per-turn protocol of a turn with one tool call, through the
    /// `Store` trait, as the turn loop runs it: the model's answer with its
    /// call journaled, the tool result journaled, the `Ready` checkpoint with
    /// the tool message and the next turn's write-ahead. Three transactions
    /// (2 + tool calls).
    pub async fn tool_turn(&mut self, store: &dyn Store) {
        let (call_id, _) = self.model_response(store).await;
        let result = self.tool_result(store, &call_id).await;
        self.finish(store, call_id, result).await;
    }

    /// Step 1: the model's answer with one tool call. Returns the call id.
    pub async fn model_response(&mut self, store: &dyn Store) -> (String, Message) {
        let cp = &mut self.checkpoint;
        let call_id = format!("call-{}", cp.turn);
        let assistant = Message::assistant_with_calls(
            self.assistant_text.clone(),
            vec![ToolCall {
                id: call_id.clone(),
                name: "lookup".into(),
                arguments: format!(r#"{{"query":"item {}"}}"#, cp.turn),
                provider_metadata: None,
            }],
        );
        cp.usage += Usage {
            input_tokens: 500,
            output_tokens: 120,
            ..Usage::default()
        };
        cp.phase = CheckpointPhase::ToolsInFlight;
        store
            .record_model_response(&self.fence, cp, &assistant)
            .await
            .expect("record_model_response");
        (call_id, assistant)
    }

    /// Step 2: the tool's result journaled.
    pub async fn tool_result(&mut self, store: &dyn Store, call_id: &str) -> ToolResult {
        let result = ToolResult {
            content: self.tool_output.clone().into(),
            is_error: false,
        };
        store
            .record_tool_result(&self.fence, self.checkpoint.turn, call_id, &result)
            .await
            .expect("record_tool_result");
        result
    }

    /// Step 3: the `Ready` checkpoint with the tool message, and the next
    /// turn's write-ahead in the same transaction.
    pub async fn finish(&mut self, store: &dyn Store, call_id: String, result: ToolResult) {
        let cp = &mut self.checkpoint;
        cp.phase = CheckpointPhase::Ready;
        cp.tool_calls_count += 1;
        cp.message_count += 2;
        let tool_message = Message::tool(call_id, result.content, false);
        let next = LoopCheckpoint {
            turn: cp.turn + 1,
            phase: CheckpointPhase::TurnInFlight,
            ..cp.clone()
        };
        store
            .finish_turn(
                &self.fence,
                cp,
                std::slice::from_ref(&tool_message),
                Some(&next),
            )
            .await
            .expect("finish_turn");
        self.checkpoint = next;
    }

    /// At a turn's write-ahead: the final answer, committed with the
    /// release of the admission.
    pub async fn commit(&mut self, store: &dyn Store) {
        let cp = &mut self.checkpoint;
        cp.usage += Usage {
            input_tokens: 500,
            output_tokens: 120,
            ..Usage::default()
        };
        cp.phase = CheckpointPhase::Completed;
        cp.message_count += 1;
        let answer = Message::assistant(self.assistant_text.clone());
        store
            .commit(&self.fence, cp, &answer)
            .await
            .expect("commit");
    }
}

/// A tool that answers with ~500 bytes at once.
pub struct Lookup {
    output: String,
}

impl Default for Lookup {
    fn default() -> Self {
        Self {
            output: text("tool", MESSAGE_BYTES),
        }
    }
}

#[turnstile::async_trait]
impl Tool for Lookup {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "lookup".into(),
            description: "Looks something up".into(),
            parameters: serde_json::json!({
                "type": "object",
                "properties": { "query": { "type": "string" } },
                "required": ["query"]
            }),
        }
    }

    async fn call(
        &self,
        _: serde_json::Value,
        _: ToolContext,
    ) -> Result<turnstile::Content, ToolError> {
        Ok(self.output.clone().into())
    }
}

/// A scripted agent (zero latency) whose requests take `turns` turns: a
/// `lookup` call in each turn but the last, then a ~500-byte answer. Each
/// request of a conversation adds `2 * turns` messages to its transcript
/// (the user input, the answer, and a call and result per tool turn).
pub fn agent(turns: usize) -> Agent {
    let usage = Usage {
        input_tokens: 500,
        output_tokens: 120,
        ..Usage::default()
    };
    let mut script: Vec<ScriptedReply> = (1..turns)
        .map(|t| {
            ScriptedReply::tool_calls(vec![ToolCall::new(
                format!("call-{t}"),
                "lookup",
                serde_json::json!({ "query": format!("item {t}") }),
            )])
            .with_usage(usage)
        })
        .collect();
    script.push(ScriptedReply::text(text("answer", MESSAGE_BYTES)).with_usage(usage));
    Agent::new(Arc::new(ScriptedModel::new(script))).with_tool(Arc::new(Lookup::default()))
}

/// A session on a new conversation.
pub fn session(agent: Agent, store: Arc<dyn Store>) -> AgentSession {
    AgentSession::new(
        agent,
        store,
        ConversationId::new(),
        namespace(),
        ContextPolicy::default(),
    )
}

/// Runs one new request to its commit.
pub async fn run_request(session: &AgentSession, input: &str) {
    session
        .run(RequestId::new(), input, RunContext::default())
        .await
        .expect("request");
}

/// A conversation with `messages` committed transcript messages (2-turn
/// requests of four messages each: input, tool call, tool result, answer)
/// and an active request stopped after its first turn, as a resume finds
/// it. Returns the conversation and the fence of the active run.
pub async fn seeded_conversation(
    store: Arc<dyn Store>,
    messages: usize,
) -> (ConversationId, Fence) {
    assert_eq!(messages % 4, 0, "whole 4-message requests");
    let session = session(agent(2), store.clone());
    let input = text("user", MESSAGE_BYTES);
    for _ in 0..messages / 4 {
        run_request(&session, &input).await;
    }
    let conversation = session.conversation_id();
    let fence = claim(store.as_ref(), conversation).await;
    let mut writer = TurnWriter::new(fence);
    writer.tool_turn(store.as_ref()).await;
    let window = store
        .transcript_window(conversation, u32::MAX)
        .await
        .expect("transcript");
    assert_eq!(window.len(), messages);
    (conversation, fence)
}
