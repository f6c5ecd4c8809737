//! MCP calls in doubt after a real SIGKILL of the agent's process. A child
//! process (this test binary, re-run with `--ignored --exact
//! mcp_crash_worker`) runs a request on a WAL file database whose one call
//! goes to a real MCP server (its own child over stdio, or one on loopback
//! over streamable HTTP, which this process runs); the call needs approval (its tool does not
//! say it is read-only), which this process gives; a second child
//! continues the request and is killed while the server holds the call,
//! after its effect. This process then recovers under the default policy,
//! with a new server process. What ran is counted from the server's own
//! record.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use turnstile::{
    Agent, AgentSession, ContextPolicy, ConversationId, Error, McpPolicy, McpServer, Namespace,
    Outcome, RequestId, ResumePolicy, Revision, RunContext, ScriptedModel, ScriptedReply,
    SqliteStore, Store, ToolCall,
};
use turnstile_testkit::mcp::{calls_of, stdio_command, HttpServer};
use turnstile_testkit::session::tool_results;
use turnstile_testkit::{process, worker_test};

const INPUT: &str = "do it once";
const HOLD: u32 = 5;

struct Scenario {
    db: PathBuf,
    effects: PathBuf,
    conversation: ConversationId,
    request: RequestId,
    /// `delete_file` (destructive) or `set_flag` (idempotent).
    tool: String,
    /// Whether the server offers the reconcile convention.
    reconcile: bool,
    /// The streamable-HTTP endpoint; over stdio when `None`.
    url: Option<String>,
}

impl Scenario {
    fn new(dir: &Path, tool: &str, reconcile: bool) -> Self {
        Self {
            db: dir.join("mcp.db"),
            effects: dir.join("effects.log"),
            conversation: ConversationId::new(),
            request: RequestId::new(),
            tool: tool.to_owned(),
            reconcile,
            url: None,
        }
    }

    /// The same over streamable HTTP, to a server this process runs.
    fn over_http(dir: &Path, tool: &str, reconcile: bool) -> (Self, HttpServer) {
        let scenario = Self::new(dir, tool, reconcile);
        let http = HttpServer::start(&scenario.effects, None, reconcile);
        let url = Some(http.url.clone());
        (Self { url, ..scenario }, http)
    }

    /// The call, held by the server for [`HOLD`] seconds after its effect
    /// (the child is killed in that time; a call run again waits it too).
    fn call(&self) -> ToolCall {
        let arguments = match self.tool.as_str() {
            "delete_file" => json!({ "path": "/tmp/x", "hold": HOLD }),
            _ => json!({ "name": "lights", "value": true, "hold": HOLD }),
        };
        ToolCall::new("c1", &self.tool, arguments)
    }

    async fn session(&self) -> (Arc<SqliteStore>, AgentSession) {
        let server = match &self.url {
            Some(url) => McpServer::http("test-server", url, &[]).await.unwrap(),
            None => {
                let mut command = stdio_command(&self.effects);
                if self.reconcile {
                    command.arg("--reconcile");
                }
                McpServer::stdio("test-server", command).await.unwrap()
            }
        };
        let model = Arc::new(ScriptedModel::new(vec![
            ScriptedReply::tool_calls(vec![self.call()]),
            ScriptedReply::text("done"),
        ]));
        let agent = server
            .add_to(Agent::new(model), &McpPolicy::default())
            .unwrap();
        let store = Arc::new(SqliteStore::open(&self.db).await.unwrap());
        let session = AgentSession::new(
            agent,
            store.clone(),
            self.conversation,
            Namespace::new("mcp-crash").unwrap(),
            ContextPolicy::default(),
        );
        (store, session)
    }

    fn worker(&self, mode: &str, revision: Revision) -> std::process::Child {
        process::worker(&worker_test!(mcp_crash_worker))
            .env("MCP_CRASH_DB", &self.db)
            .env("MCP_CRASH_EFFECTS", &self.effects)
            .env("MCP_CRASH_CONVERSATION", self.conversation.to_string())
            .env("MCP_CRASH_REQUEST", self.request.to_string())
            .env("MCP_CRASH_TOOL", &self.tool)
            .env("MCP_CRASH_RECONCILE", self.reconcile.to_string())
            .env("MCP_CRASH_URL", self.url.as_deref().unwrap_or_default())
            .env("MCP_CRASH_MODE", mode)
            .env("MCP_CRASH_REVISION", revision.0.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap()
    }

    fn calls(&self) -> Vec<(String, String)> {
        calls_of(&self.effects, &self.tool)
    }

    /// A child runs the request to its stop for approval; this process
    /// approves; a second child continues it and is killed with SIGKILL
    /// once the server has recorded the call's effect.
    async fn approved_then_killed_mid_call(&self) {
        let status = self.worker("run", Revision(0)).wait().unwrap();
        assert!(status.success(), "the first child failed: {status}");
        assert!(self.calls().is_empty(), "nothing ran before the approval");
        let (store, session) = self.session().await;
        let pending = store.pending_approvals(None).await.unwrap();
        assert_eq!(pending.len(), 1, "{pending:?}");
        let revision = session
            .approve(self.request, "c1", pending[0].revision)
            .await
            .unwrap();
        drop(session);
        store.close().await.unwrap();

        let mut child = self.worker("continue", revision);
        let waited = Instant::now();
        while self.calls().is_empty() {
            assert!(
                waited.elapsed() < Duration::from_secs(60),
                "the call never reached the server"
            );
            assert!(child.try_wait().unwrap().is_none(), "the child exited");
            std::thread::sleep(Duration::from_millis(20));
        }
        child.kill().unwrap(); // SIGKILL on unix
        child.wait().unwrap();
    }

    /// Recovers in this process under the default policy, with a new
    /// server process.
    async fn recovered(&self) -> (Arc<SqliteStore>, Result<Outcome, Error>) {
        let (store, session) = self.session().await;
        let revision = store.admission(self.conversation).await.unwrap().revision;
        let recovered = session
            .recover_after_owner_exit(
                self.request,
                INPUT,
                RunContext::default(),
                revision,
                ResumePolicy::RejectAmbiguous,
            )
            .await;
        (store, recovered)
    }

    fn key(&self) -> String {
        format!("{}/1/c1", self.request)
    }
}

/// The child: `run` runs the request to its stop for approval and exits;
/// `continue` continues it after the approval (and is killed in the call).
#[tokio::test]
#[ignore = "child process of the MCP crash tests"]
async fn mcp_crash_worker() {
    let var = |name| std::env::var(name).unwrap();
    let scenario = Scenario {
        db: var("MCP_CRASH_DB").into(),
        effects: var("MCP_CRASH_EFFECTS").into(),
        conversation: var("MCP_CRASH_CONVERSATION").parse().unwrap(),
        request: var("MCP_CRASH_REQUEST").parse().unwrap(),
        tool: var("MCP_CRASH_TOOL"),
        reconcile: var("MCP_CRASH_RECONCILE") == "true",
        url: Some(var("MCP_CRASH_URL")).filter(|url| !url.is_empty()),
    };
    let revision = Revision(var("MCP_CRASH_REVISION").parse().unwrap());
    let (_store, session) = scenario.session().await;
    match var("MCP_CRASH_MODE").as_str() {
        "run" => {
            let stopped = session
                .run(scenario.request, INPUT, RunContext::default())
                .await;
            assert!(
                matches!(stopped, Err(Error::AwaitingApproval { .. })),
                "{stopped:?}"
            );
        }
        _ => {
            let result = session
                .continue_after_approval(scenario.request, RunContext::default(), revision)
                .await;
            panic!("the child was not killed: {result:?}");
        }
    }
}

fn tool_answer(outcome: &Outcome) -> String {
    tool_results(&outcome.messages).remove(0).1
}

#[tokio::test]
async fn a_destructive_call_in_doubt_is_ambiguous_by_default_and_never_runs_again() {
    let dir = tempfile::tempdir().unwrap();
    ambiguous(Scenario::new(dir.path(), "delete_file", false)).await;
}

#[tokio::test]
async fn over_http_a_destructive_call_in_doubt_is_ambiguous_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let (scenario, _http) = Scenario::over_http(dir.path(), "delete_file", false);
    ambiguous(scenario).await;
}

async fn ambiguous(scenario: Scenario) {
    scenario.approved_then_killed_mid_call().await;
    let (store, recovered) = scenario.recovered().await;
    assert!(
        matches!(recovered, Err(Error::AmbiguousCheckpoint { turn: 1, .. })),
        "{recovered:?}"
    );
    let admission = store.admission(scenario.conversation).await.unwrap();
    assert_eq!(
        admission.active.map(|a| a.request_id),
        Some(scenario.request),
        "still held, for the host to decide"
    );
    assert_eq!(scenario.calls().len(), 1, "it never ran again");
}

#[tokio::test]
async fn a_call_the_server_reconciles_as_done_is_journaled_without_running_again() {
    let dir = tempfile::tempdir().unwrap();
    reconciled(Scenario::new(dir.path(), "delete_file", true)).await;
}

#[tokio::test]
async fn over_http_a_call_the_server_reconciles_as_done_is_journaled_without_running_again() {
    let dir = tempfile::tempdir().unwrap();
    let (scenario, _http) = Scenario::over_http(dir.path(), "delete_file", true);
    reconciled(scenario).await;
}

async fn reconciled(scenario: Scenario) {
    scenario.approved_then_killed_mid_call().await;
    let (_store, recovered) = scenario.recovered().await;
    let outcome = recovered.unwrap();
    assert_eq!(outcome.final_text, "done");
    assert_eq!(
        tool_answer(&outcome),
        "deleted /tmp/x",
        "the server's answer"
    );
    assert_eq!(
        scenario.calls(),
        [(scenario.key(), r#"{"path":"/tmp/x"}"#.to_owned())],
        "it ran once"
    );
}

#[tokio::test]
async fn an_idempotent_call_in_doubt_runs_again_once_with_the_same_key() {
    let dir = tempfile::tempdir().unwrap();
    idempotent(Scenario::new(dir.path(), "set_flag", false)).await;
}

#[tokio::test]
async fn over_http_an_idempotent_call_in_doubt_runs_again_once_with_the_same_key() {
    let dir = tempfile::tempdir().unwrap();
    let (scenario, _http) = Scenario::over_http(dir.path(), "set_flag", false);
    idempotent(scenario).await;
}

async fn idempotent(scenario: Scenario) {
    scenario.approved_then_killed_mid_call().await;
    let (_store, recovered) = scenario.recovered().await;
    let outcome = recovered.unwrap();
    let answer = tool_answer(&outcome);
    assert!(answer.starts_with("flag lights=true"), "{answer}");
    let calls = scenario.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(
        calls.iter().all(|(key, _)| *key == scenario.key()),
        "{calls:?}"
    );
}
