//! Calls in doubt after a real SIGKILL: a child process runs a request
//! whose one tool call (`charge`, call `c1`) has its effect appended to a
//! log file, and is killed inside it; this process recovers the request
//! under the default policy with a tool that reconciles, is idempotent, or
//! neither. Effects are counted from the log, outside the database.
//!
//! The child is this test binary itself, re-run with `--ignored --exact
//! reconcile_worker` and the scenario in environment variables.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use turnstile::store::JournalStatus;
use turnstile::{
    Agent, AgentSession, ContextPolicy, ConversationId, Error, Namespace, Outcome, RequestId,
    ResumePolicy, RunContext, ScriptedModel, ScriptedReply, SqliteStore, Store, ToolCall,
};
use turnstile_testkit::session::tool_results;
use turnstile_testkit::tools::{self, Effect, Hold};
use turnstile_testkit::{process, worker_test};

const INPUT: &str = "charge the card once";

/// What the tool does when the child is killed in it, and what the
/// recovering process's tool says of the call.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// Killed after the effect; the tool reconciles from its log.
    ReconciledDone,
    /// Killed before the effect; the tool reconciles from its log.
    ReconciledNotDone,
    /// Killed after the effect; the tool is idempotent, reconciles nothing.
    Idempotent,
    /// Killed after the effect; the tool can tell nothing.
    Unknown,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::ReconciledDone => "done",
            Kind::ReconciledNotDone => "not-done",
            Kind::Idempotent => "idempotent",
            Kind::Unknown => "unknown",
        }
    }

    fn parse(name: &str) -> Self {
        [
            Kind::ReconciledDone,
            Kind::ReconciledNotDone,
            Kind::Idempotent,
            Kind::Unknown,
        ]
        .into_iter()
        .find(|k| k.name() == name)
        .expect("a kind")
    }

    /// The tool of this kind, held forever in `c1` when `in_child`.
    fn tool(self, log: &Path, in_child: bool) -> Effect {
        let held = in_child.then_some("c1");
        let tool = Effect::new("charge", log).logging_keys();
        let tool = match self {
            Kind::ReconciledNotDone => tool.holding_before(held, Hold::Forever),
            _ => tool.holding(held, Hold::Forever),
        };
        match self {
            Kind::ReconciledDone | Kind::ReconciledNotDone => tool.reconciling(),
            Kind::Idempotent => tool.idempotent(),
            Kind::Unknown => tool,
        }
    }
}

struct Scenario {
    db: PathBuf,
    log: PathBuf,
    conversation: ConversationId,
    request: RequestId,
    kind: Kind,
}

impl Scenario {
    fn new(dir: &Path, kind: Kind) -> Self {
        Self {
            db: dir.join("reconcile.db"),
            log: dir.join("effects.log"),
            conversation: ConversationId::new(),
            request: RequestId::new(),
            kind,
        }
    }

    fn session(&self, store: Arc<SqliteStore>, in_child: bool) -> AgentSession {
        let script = vec![
            ScriptedReply::tool_calls(vec![ToolCall::new(
                "c1",
                "charge",
                serde_json::json!({"cents": 500}),
            )]),
            ScriptedReply::text("charged"),
        ];
        let agent = Agent::new(Arc::new(ScriptedModel::new(script)))
            .with_tool(Arc::new(self.kind.tool(&self.log, in_child)));
        AgentSession::new(
            agent,
            store,
            self.conversation,
            Namespace::new("reconcile").unwrap(),
            ContextPolicy::default(),
        )
    }

    /// The child runs the request and is killed with SIGKILL inside `c1`.
    fn run_child_and_kill(&self) {
        let mut child = process::worker(&worker_test!(reconcile_worker))
            .env("RECONCILE_DB", &self.db)
            .env("RECONCILE_LOG", &self.log)
            .env("RECONCILE_CONVERSATION", self.conversation.to_string())
            .env("RECONCILE_REQUEST", self.request.to_string())
            .env("RECONCILE_KIND", self.kind.name())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut seen = Vec::new();
        for line in stdout.lines() {
            let line = line.unwrap();
            if line.contains("IN TOOL c1") {
                child.kill().unwrap(); // SIGKILL on unix
                child.wait().unwrap();
                return;
            }
            seen.push(line);
        }
        let status = child.wait().unwrap();
        panic!("child exited ({status}) before its tool; it printed {seen:#?}");
    }

    /// How often `c1`'s effect happened (its key, the same in every run).
    fn effects(&self) -> usize {
        tools::effects(&self.log, &format!("{}/1/c1", self.request))
    }

    /// Kills a child inside `c1`, then recovers in this process under the
    /// default policy.
    async fn killed_and_recovered(&self) -> (Arc<SqliteStore>, Result<Outcome, Error>) {
        self.run_child_and_kill();
        let store = Arc::new(SqliteStore::open(&self.db).await.unwrap());
        let session = self.session(store.clone(), false);
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
}

#[tokio::test]
#[ignore = "child process of the reconcile crash tests"]
async fn reconcile_worker() {
    let var = |name| std::env::var(name).unwrap();
    let scenario = Scenario {
        db: var("RECONCILE_DB").into(),
        log: var("RECONCILE_LOG").into(),
        conversation: var("RECONCILE_CONVERSATION").parse().unwrap(),
        request: var("RECONCILE_REQUEST").parse().unwrap(),
        kind: Kind::parse(&var("RECONCILE_KIND")),
    };
    let store = Arc::new(SqliteStore::open(&scenario.db).await.unwrap());
    let session = scenario.session(store, true);
    let result = session
        .run(scenario.request, INPUT, RunContext::default())
        .await;
    panic!("the child was not killed: {result:?}");
}

/// The text of the tool message the request committed for `c1`.
fn tool_answer(outcome: &Outcome) -> String {
    tool_results(&outcome.messages).remove(0).1
}

#[tokio::test]
async fn a_call_its_tool_reconciles_as_done_is_journaled_and_never_runs_again() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = Scenario::new(dir.path(), Kind::ReconciledDone);
    let (store, recovered) = scenario.killed_and_recovered().await;
    let outcome = recovered.unwrap();
    assert_eq!(outcome.final_text, "charged");
    assert_eq!(tool_answer(&outcome), "charge done");
    assert_eq!(scenario.effects(), 1, "the reconciled call ran again");
    let journal = store.journal(scenario.request, 1).await.unwrap();
    assert_eq!(journal.len(), 1);
    assert_eq!(journal[0].status, JournalStatus::Completed);
}

#[tokio::test]
async fn a_call_its_tool_reconciles_as_not_done_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = Scenario::new(dir.path(), Kind::ReconciledNotDone);
    let (_store, recovered) = scenario.killed_and_recovered().await;
    assert_eq!(scenario.effects(), 1, "it ran once, in the recovery");
    let outcome = recovered.unwrap();
    assert_eq!(outcome.final_text, "charged");
    assert_eq!(tool_answer(&outcome), "charge done");
}

#[tokio::test]
async fn an_idempotent_call_in_doubt_runs_again_with_the_same_key() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = Scenario::new(dir.path(), Kind::Idempotent);
    let (_store, recovered) = scenario.killed_and_recovered().await;
    assert_eq!(recovered.unwrap().final_text, "charged");
    // Both executions logged the same key: a service that deduplicates by
    // it applies the charge once.
    assert_eq!(scenario.effects(), 2);
}

#[tokio::test]
async fn a_call_nobody_can_reconcile_is_ambiguous_and_the_refusal_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = Scenario::new(dir.path(), Kind::Unknown);
    scenario.run_child_and_kill();
    let store = Arc::new(SqliteStore::open(&scenario.db).await.unwrap());
    let session = scenario.session(store.clone(), false);
    let before = store.admission(scenario.conversation).await.unwrap();
    let refused = session
        .recover_after_owner_exit(
            scenario.request,
            INPUT,
            RunContext::default(),
            before.revision,
            ResumePolicy::RejectAmbiguous,
        )
        .await;
    assert!(
        matches!(refused, Err(Error::AmbiguousCheckpoint { turn: 1, .. })),
        "{refused:?}"
    );
    assert_eq!(
        store.admission(scenario.conversation).await.unwrap(),
        before
    );
    assert_eq!(scenario.effects(), 1, "nothing ran again");
}
