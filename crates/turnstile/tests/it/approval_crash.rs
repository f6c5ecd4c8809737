//! Approval across real process deaths: a child process runs or continues
//! a request on a WAL file database and is killed with SIGKILL at a chosen
//! point; the parent (another process's view of the same file) decides and
//! continues. Tool effects are appended to a log file, so "ran once" is
//! counted outside the database.
//!
//! The child is this test binary itself, re-run with `--ignored --exact
//! approval_worker` and the scenario in environment variables.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use turnstile::{
    Agent, AgentSession, ContextPolicy, ConversationId, Error, Event, Namespace, RequestId,
    ResumePolicy, Revision, RunContext, ScriptedModel, ScriptedReply, SqliteStore, Store, ToolCall,
};
use turnstile_testkit::tools::{self, Effect, Hold};
use turnstile_testkit::{process, worker_test};

const INPUT: &str = "deploy after a lookup";

struct Scenario {
    db: PathBuf,
    log: PathBuf,
    conversation: ConversationId,
    request: RequestId,
}

impl Scenario {
    fn new(dir: &Path) -> Self {
        Self {
            db: dir.join("approvals.db"),
            log: dir.join("effects.log"),
            conversation: ConversationId::new(),
            request: RequestId::new(),
        }
    }

    /// `deploy` (call `d1`) needs approval, `lookup` (`l1`) does not.
    fn session(
        &self,
        store: Arc<SqliteStore>,
        block_on: Option<&str>,
        sleep: Duration,
    ) -> AgentSession {
        // The blocked call never ends: the child is killed there.
        let tool = |name| {
            Arc::new(
                Effect::new(name, &self.log)
                    .holding(block_on, Hold::Forever)
                    .sleeping(sleep),
            )
        };
        let script = vec![
            ScriptedReply::tool_calls(vec![
                ToolCall::new("d1", "deploy", serde_json::json!({"env": "prod"})),
                ToolCall::new("l1", "lookup", serde_json::json!({})),
            ]),
            ScriptedReply::text("deployed"),
        ];
        let agent = Agent::new(Arc::new(ScriptedModel::new(script)))
            .with_tool_requiring_approval(tool("deploy"))
            .with_tool(tool("lookup"));
        AgentSession::new(
            agent,
            store,
            self.conversation,
            Namespace::new("approvals").unwrap(),
            ContextPolicy::default(),
        )
    }

    async fn open(&self) -> (Arc<SqliteStore>, AgentSession) {
        let store = Arc::new(SqliteStore::open(&self.db).await.unwrap());
        let session = self.session(store.clone(), None, Duration::ZERO);
        (store, session)
    }

    /// Runs the child in `mode` until it prints `marker`, then kills it
    /// with SIGKILL. Returns the rest of the marker line.
    fn run_child_and_kill(
        &self,
        mode: &str,
        revision: Revision,
        deadline: Option<i64>,
        marker: &str,
    ) -> String {
        let mut child = process::worker(&worker_test!(approval_worker))
            .env("APPROVAL_DB", &self.db)
            .env("APPROVAL_LOG", &self.log)
            .env("APPROVAL_CONVERSATION", self.conversation.to_string())
            .env("APPROVAL_REQUEST", self.request.to_string())
            .env("APPROVAL_MODE", mode)
            .env("APPROVAL_REVISION", revision.0.to_string())
            .env(
                "APPROVAL_DEADLINE",
                deadline.map(|d| d.to_string()).unwrap_or_default(),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut seen = Vec::new();
        for line in stdout.lines() {
            let line = line.unwrap();
            if let Some(at) = line.find(marker) {
                child.kill().unwrap(); // SIGKILL on unix
                child.wait().unwrap();
                return line[at + marker.len()..].trim().to_owned();
            }
            seen.push(line);
        }
        let status = child.wait().unwrap();
        panic!("child exited ({status}) before {marker:?}; it printed {seen:#?}");
    }

    /// How often each call's effect happened.
    fn effects(&self, call_id: &str) -> usize {
        tools::effects(&self.log, call_id)
    }

    /// [`Scenario::stopped_and_killed`], then `d1` approved from this
    /// process, whose store is closed again. Returns the new revision.
    async fn approved_after_the_kill(&self) -> Revision {
        let revision = self.stopped_and_killed().await;
        let (store, session) = self.open().await;
        let revision = session.approve(self.request, "d1", revision).await.unwrap();
        drop(session);
        store.close().await.unwrap();
        revision
    }

    /// A child runs the request to its stop for approval and is killed
    /// while it waits. Returns the revision a decision must name.
    async fn stopped_and_killed(&self) -> Revision {
        let line = self.run_child_and_kill("run", Revision(0), None, "AWAITING");
        Revision(line.parse().unwrap())
    }
}

/// The child: `run` runs the request and waits once it awaits approval;
/// `continue:started` / `continue:journaled` continue it and freeze after
/// the new run starts / after `d1`'s result is journaled; `continue:in-tool`
/// blocks inside `d1`; `deadline` runs the request with a wall-clock
/// deadline and blocks inside `l1`.
#[tokio::test]
#[ignore = "child process of the approval crash tests"]
async fn approval_worker() {
    let var = |name| std::env::var(name).unwrap();
    let scenario = Scenario {
        db: var("APPROVAL_DB").into(),
        log: var("APPROVAL_LOG").into(),
        conversation: var("APPROVAL_CONVERSATION").parse().unwrap(),
        request: var("APPROVAL_REQUEST").parse().unwrap(),
    };
    let mode = var("APPROVAL_MODE");
    let revision = Revision(var("APPROVAL_REVISION").parse().unwrap());
    let block_on = match mode.as_str() {
        "continue:in-tool" => Some("d1"),
        "deadline" => Some("l1"),
        _ => None,
    };
    let store = Arc::new(SqliteStore::open(&scenario.db).await.unwrap());
    let session = scenario.session(store, block_on, Duration::ZERO);
    let mut ctx = RunContext::default();
    if let Ok(ms) = var("APPROVAL_DEADLINE").parse::<u64>() {
        ctx = ctx.with_deadline_at(UNIX_EPOCH + Duration::from_millis(ms));
    }
    let mut events = match mode.as_str() {
        "run" | "deadline" => session.stream(scenario.request, INPUT, ctx),
        _ => session.recover_stream(
            scenario.request,
            INPUT,
            ctx,
            revision,
            ResumePolicy::RejectAmbiguous,
        ),
    };
    while let Some(event) = events.next().await {
        let freeze = match (&event, mode.as_str()) {
            (Err(Error::AwaitingApproval { revision, .. }), "run") => {
                println!("AWAITING {}", revision.0);
                true
            }
            (Ok(Event::RunStarted { .. }), "continue:started") => {
                println!("STARTED");
                true
            }
            (Ok(Event::ToolFinished { call_id, .. }), "continue:journaled") if call_id == "d1" => {
                println!("JOURNALED");
                true
            }
            _ => false,
        };
        if freeze {
            // Not polling the stream again freezes the run right here.
            std::future::pending::<()>().await;
        }
    }
    panic!("the child was not killed");
}

#[tokio::test]
async fn a_stop_for_approval_survives_the_kill_of_the_waiting_process() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = Scenario::new(dir.path());
    let revision = scenario.stopped_and_killed().await;
    assert_eq!((scenario.effects("l1"), scenario.effects("d1")), (1, 0));

    let (store, session) = scenario.open().await;
    let pending = store.pending_approvals(None).await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(
        (pending[0].call_id.as_str(), pending[0].revision),
        ("d1", revision)
    );
    let revision = session
        .approve(scenario.request, "d1", revision)
        .await
        .unwrap();
    let outcome = session
        .continue_after_approval(scenario.request, RunContext::default(), revision)
        .await
        .unwrap();
    assert_eq!(outcome.final_text, "deployed");
    assert_eq!((scenario.effects("l1"), scenario.effects("d1")), (1, 1));
}

#[tokio::test]
async fn killed_after_the_approval_and_before_the_tool_the_call_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = Scenario::new(dir.path());
    let revision = scenario.approved_after_the_kill().await;

    // The continuing process dies right after it took the request over.
    scenario.run_child_and_kill("continue:started", revision, None, "STARTED");
    assert_eq!(scenario.effects("d1"), 0);
    let (store, session) = scenario.open().await;
    let revision = store
        .admission(scenario.conversation)
        .await
        .unwrap()
        .revision;
    // Nothing was in flight: the default policy continues.
    let outcome = session
        .recover_after_owner_exit(
            scenario.request,
            INPUT,
            RunContext::default(),
            revision,
            ResumePolicy::RejectAmbiguous,
        )
        .await
        .unwrap();
    assert_eq!(outcome.final_text, "deployed");
    assert_eq!((scenario.effects("l1"), scenario.effects("d1")), (1, 1));
}

#[tokio::test]
async fn killed_after_the_approved_call_is_journaled_it_never_runs_again() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = Scenario::new(dir.path());
    let revision = scenario.approved_after_the_kill().await;

    scenario.run_child_and_kill("continue:journaled", revision, None, "JOURNALED");
    assert_eq!(scenario.effects("d1"), 1);
    let (store, session) = scenario.open().await;
    let revision = store
        .admission(scenario.conversation)
        .await
        .unwrap()
        .revision;
    // The tool round was in flight when the process died, but every call
    // of it is journaled: nothing is in doubt, so the default policy goes
    // on and reuses the journaled result.
    let outcome = session
        .recover_after_owner_exit(
            scenario.request,
            INPUT,
            RunContext::default(),
            revision,
            ResumePolicy::RejectAmbiguous,
        )
        .await
        .unwrap();
    assert_eq!(outcome.final_text, "deployed");
    assert_eq!((scenario.effects("l1"), scenario.effects("d1")), (1, 1));
}

#[tokio::test]
async fn killed_inside_the_approved_call_is_ambiguous_by_the_usual_rules() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = Scenario::new(dir.path());
    let revision = scenario.approved_after_the_kill().await;

    scenario.run_child_and_kill("continue:in-tool", revision, None, "IN TOOL d1");
    let (store, session) = scenario.open().await;
    let before = store.admission(scenario.conversation).await.unwrap();
    match session
        .recover_after_owner_exit(
            scenario.request,
            INPUT,
            RunContext::default(),
            before.revision,
            ResumePolicy::RejectAmbiguous,
        )
        .await
    {
        Err(Error::AmbiguousCheckpoint { turn, .. }) => assert_eq!(turn, 1),
        other => panic!("expected AmbiguousCheckpoint, got {other:?}"),
    }
    assert_eq!(
        store.admission(scenario.conversation).await.unwrap(),
        before
    );
    assert_eq!(scenario.effects("d1"), 1, "nothing ran twice");
}

#[tokio::test]
async fn a_recovering_process_stops_at_the_stored_wall_clock_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = Scenario::new(dir.path());
    let started = SystemTime::now();
    let deadline = started + Duration::from_secs(8);
    let ms = deadline.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
    scenario.run_child_and_kill("deadline", Revision(0), Some(ms), "IN TOOL l1");

    // This process was given no deadline; its lookup would take 60 s.
    let store = Arc::new(SqliteStore::open(&scenario.db).await.unwrap());
    let session = scenario.session(store.clone(), None, Duration::from_secs(60));
    assert_eq!(
        store
            .request(scenario.request)
            .await
            .unwrap()
            .unwrap()
            .deadline_at,
        Some(ms)
    );
    let revision = store
        .admission(scenario.conversation)
        .await
        .unwrap()
        .revision;
    let result = session
        .recover_after_owner_exit(
            scenario.request,
            INPUT,
            RunContext::default(),
            revision,
            ResumePolicy::RetryInterruptedTurn,
        )
        .await;
    assert!(
        matches!(result, Err(Error::DeadlineExceeded { .. })),
        "{result:?}"
    );
    let stopped = SystemTime::now();
    assert!(stopped >= deadline, "stopped before the deadline");
    assert!(
        stopped.duration_since(started).unwrap() < Duration::from_secs(45),
        "the recovery ran to its tool's end instead of the stored deadline"
    );
}
