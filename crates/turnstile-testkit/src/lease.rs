//! The lease takeover scenario across real processes, for any backend: a
//! child process runs a request with a short lease and is frozen with
//! SIGSTOP inside a tool; once its lease expired the parent (another
//! process) takes the request over with `recover_expired` and commits it;
//! then the child is woken with SIGCONT and is fenced on its next write.
//! Tool effects are appended to a log file, so "ran once" is counted
//! outside the database.
//!
//! The child is the calling test binary itself, re-run to execute an
//! ignored test whose body is [`worker`] (named with
//! [`worker_test!`](crate::worker_test)); the store's location (opaque
//! here: a file path, a URL and a schema) and the scenario travel in
//! environment variables.

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::Duration;

use turnstile::admin::ListFilter;
use turnstile::store::RequestStatus;
use turnstile::{
    recover_expired, Agent, AgentSession, ContextPolicy, ConversationId, LeasePolicy, Message,
    Namespace, RequestId, ResumePolicy, RunContext, ScriptedModel, ScriptedReply, Store,
    StoreAdmin, ToolCall,
};

use crate::process;
use crate::tools::{self, Effect, Hold};

const INPUT: &str = "look up, then act";

/// Short, so the test waits little: the lease lapses 600 ms after the last
/// renewal.
fn lease() -> LeasePolicy {
    LeasePolicy::new(Duration::from_millis(200), Duration::from_millis(600)).unwrap()
}

struct Scenario {
    /// Where the store is, as the test's opener takes it.
    location: String,
    log: PathBuf,
    conversation: ConversationId,
    request: RequestId,
}

impl Scenario {
    /// Turn 1 calls `lookup` (`l1`), turn 2 `act` (`a1`), turn 3 answers.
    fn session(&self, store: Arc<dyn Store>, slow_call: Option<&'static str>) -> AgentSession {
        // The slow call announces itself and sleeps a second.
        let tool = |name| {
            Arc::new(
                Effect::new(name, &self.log).holding(slow_call, Hold::For(Duration::from_secs(1))),
            )
        };
        let script = vec![
            ScriptedReply::tool_calls(vec![ToolCall::new("l1", "lookup", serde_json::json!({}))]),
            ScriptedReply::tool_calls(vec![ToolCall::new("a1", "act", serde_json::json!({}))]),
            ScriptedReply::text("done"),
        ];
        let agent = Agent::new(Arc::new(ScriptedModel::new(script)))
            .with_tool(tool("lookup"))
            .with_tool(tool("act"));
        AgentSession::new(
            agent,
            store,
            self.conversation,
            Namespace::new("leases").unwrap(),
            ContextPolicy::default(),
        )
        .with_lease(lease())
    }

    fn spawn_child(&self, worker: &str) -> Child {
        process::worker(worker)
            .env("LEASE_LOCATION", &self.location)
            .env("LEASE_LOG", &self.log)
            .env("LEASE_CONVERSATION", self.conversation.to_string())
            .env("LEASE_REQUEST", self.request.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap()
    }

    /// How often each call's effect happened.
    fn effects(&self, call_id: &str) -> usize {
        tools::effects(&self.log, call_id)
    }
}

/// The child: runs the request with its lease and prints how the run
/// ended. `open` opens the store at a location.
pub async fn worker<F, Fut>(open: F)
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = Arc<dyn StoreAdmin>>,
{
    let var = |name| std::env::var(name).unwrap();
    let scenario = Scenario {
        location: var("LEASE_LOCATION"),
        log: var("LEASE_LOG").into(),
        conversation: var("LEASE_CONVERSATION").parse().unwrap(),
        request: var("LEASE_REQUEST").parse().unwrap(),
    };
    let store: Arc<dyn Store> = open(scenario.location.clone()).await;
    let session = scenario.session(store, Some("a1"));
    let result = session
        .run(scenario.request, INPUT, RunContext::default())
        .await;
    println!("RESULT {result:?}");
}

/// The parent: a worker (the test named `worker`, whose body is
/// [`worker`]) frozen past its lease is taken over by this process and
/// fenced when it wakes. `dir` holds the effect log.
pub async fn frozen_worker_is_taken_over_and_fenced<F, Fut>(
    worker: &str,
    location: String,
    dir: &Path,
    open: F,
) where
    F: Fn(String) -> Fut,
    Fut: Future<Output = Arc<dyn StoreAdmin>>,
{
    let scenario = Scenario {
        location,
        log: dir.join("effects.log"),
        conversation: ConversationId::new(),
        request: RequestId::new(),
    };
    let mut child = scenario.spawn_child(worker);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let inside = line.contains("IN TOOL a1");
        seen.push(line);
        if inside {
            break;
        }
    }
    assert!(seen.iter().any(|l| l.contains("IN TOOL a1")), "{seen:#?}");
    process::signal(&child, "-STOP");
    // Past the lease of the last renewal before the freeze.
    tokio::time::sleep(Duration::from_millis(1_200)).await;

    let store = open(scenario.location.clone()).await;
    // Its activity is fresh, but the lease lapsed: the admission is stuck.
    let stuck = store
        .list_requests(&ListFilter {
            stuck_only: true,
            ..ListFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(
        stuck.iter().map(|r| r.request_id).collect::<Vec<_>>(),
        [scenario.request]
    );
    let recoveries = recover_expired(
        store.as_ref(),
        |_| Some(scenario.session(store.clone(), None)),
        RunContext::default(),
        ResumePolicy::RetryInterruptedTurn,
        10,
    )
    .await
    .unwrap();
    assert_eq!(recoveries.len(), 1);
    assert_eq!(recoveries[0].lease.request_id, scenario.request);
    let outcome = recoveries[0].result.as_ref().unwrap();
    assert_eq!(outcome.final_text, "done");

    process::signal(&child, "-CONT");
    let mut result = None;
    for line in lines {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("RESULT ") {
            result = Some(rest.to_owned());
        }
    }
    assert!(child.wait().unwrap().success());
    let result = result.expect("the child printed its result");
    assert!(result.starts_with("Err(Fenced"), "{result}");

    // The journaled lookup ran once; the act the frozen worker was inside
    // ran again in the takeover (it was not journaled) and never a third
    // time: the woken worker's write was refused.
    assert_eq!((scenario.effects("l1"), scenario.effects("a1")), (1, 2));
    let record = store.request(scenario.request).await.unwrap().unwrap();
    assert_eq!(record.status, RequestStatus::Completed);
    let conversation = store
        .conversation(&Namespace::new("leases").unwrap(), scenario.conversation)
        .await
        .unwrap();
    assert_eq!(conversation.version, 1);
    let transcript = store
        .transcript_range(scenario.conversation, 0, u64::MAX)
        .await
        .unwrap();
    let inputs = transcript
        .iter()
        .filter(|e| e.message == Message::user(INPUT))
        .count();
    assert_eq!(inputs, 1);
    assert_eq!(
        transcript.last().map(|e| &e.message),
        Some(&Message::assistant("done"))
    );
    // Released, so no lease is left to expire.
    assert_eq!(
        store.admission(scenario.conversation).await.unwrap().active,
        None
    );
    assert!(store.expired_leases(10).await.unwrap().is_empty());
}
