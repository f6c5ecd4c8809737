//! Crash and resume with a real process: a child runs a 4-turn tool-using
//! request on a WAL file database and is killed with SIGKILL; the parent
//! resumes the dead run.
//!
//! The child is this test binary itself, re-run with `--ignored --exact
//! crash_worker` and the scenario in environment variables.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use futures_util::StreamExt;
use turnstile::store::RunStatus;
use turnstile::{
    Agent, AgentSession, CheckpointPhase, ContextPolicy, ConversationId, Error, Event, Message,
    Namespace, ProviderMetadata, Reasoning, RequestId, ResumePolicy, Revision, RunContext,
    ScriptedModel, ScriptedReply, SqliteStore, Store, Tool, ToolCall, ToolContext, ToolError,
    ToolSpec, Usage,
};
use turnstile_testkit::{process, worker_test};

const INPUT: &str = "count the words of three sentences";

/// Appends its idempotency key to a log file (the external side effect),
/// then answers with the word count of its `text` argument. In the child,
/// the call whose key ends with `block_on` blocks forever after its effect.
struct WordCount {
    log: PathBuf,
    block_on: Option<String>,
}

#[turnstile::async_trait]
impl Tool for WordCount {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "word_count".into(),
            description: "Counts the words of a text".into(),
            parameters: serde_json::json!({"type": "object", "properties": {"text": {"type": "string"}}}),
        }
    }

    async fn call(
        &self,
        args: serde_json::Value,
        ctx: ToolContext,
    ) -> Result<turnstile::Content, ToolError> {
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| ToolError::new(e.to_string()))?;
        writeln!(log, "{}", ctx.idempotency_key).map_err(|e| ToolError::new(e.to_string()))?;
        log.sync_all().map_err(|e| ToolError::new(e.to_string()))?;
        if self
            .block_on
            .as_deref()
            .is_some_and(|suffix| ctx.idempotency_key.ends_with(suffix))
        {
            println!("IN TOOL {}", ctx.idempotency_key);
            std::future::pending::<()>().await;
        }
        let text = args["text"].as_str().unwrap_or_default();
        Ok(turnstile::Content::from(
            text.split_whitespace().count().to_string(),
        ))
    }
}

fn usage(turn: u64) -> Usage {
    Usage {
        input_tokens: 100 * turn,
        output_tokens: 10 * turn,
        cache_read_tokens: turn,
        cache_write_tokens: 0,
    }
}

fn count(id: &str, text: &str) -> ToolCall {
    ToolCall::new(id, "word_count", serde_json::json!({ "text": text }))
}

/// Signed reasoning of turn `turn`, and metadata its provider needs back.
fn thinking(turn: u32) -> (Reasoning, ProviderMetadata) {
    let reasoning = Reasoning {
        provider: "anthropic".into(),
        text: Some(format!("turn {turn}: count, then answer \0")),
        signature: Some(format!("sig-{turn}-").repeat(1000)),
        redacted: None,
    };
    let metadata = ProviderMetadata::new(format!(r#"{{"turn": {turn}, "n": 1e999}}"#)).unwrap();
    (reasoning, metadata)
}

/// Turns 1–3 ask for 1, 2 and 1 tool calls, each with signed reasoning the
/// model requires back (it fails a call whose earlier answers come back
/// changed); turn 4 answers.
fn script() -> Vec<ScriptedReply> {
    let thought = |reply: ScriptedReply, turn| {
        let (reasoning, metadata) = thinking(turn);
        reply
            .with_reasoning(reasoning)
            .with_provider_metadata(metadata)
            .with_usage(usage(u64::from(turn)))
    };
    vec![
        thought(ScriptedReply::tool_calls(vec![count("a", "one two")]), 1),
        thought(
            ScriptedReply::tool_calls(vec![count("b", "three four five"), count("c", "six")]),
            2,
        ),
        thought(
            ScriptedReply::tool_calls(vec![count("d", "seven eight")]),
            3,
        ),
        ScriptedReply::text("2, 3, 1 and 2 words").with_usage(usage(4)),
    ]
}

struct Scenario {
    db: PathBuf,
    log: PathBuf,
    conversation: ConversationId,
    request: RequestId,
}

impl Scenario {
    fn new(dir: &Path) -> Self {
        Self {
            db: dir.join("crash.db"),
            log: dir.join("effects.log"),
            conversation: ConversationId::new(),
            request: RequestId::new(),
        }
    }

    fn session(&self, store: Arc<SqliteStore>, block_on: Option<String>) -> AgentSession {
        let tool = WordCount {
            log: self.log.clone(),
            block_on,
        };
        let model = ScriptedModel::new(script()).requiring_answers_back();
        let agent = Agent::new(Arc::new(model))
            .with_system_prompt("count words")
            .with_tool(Arc::new(tool));
        AgentSession::new(
            agent,
            store,
            self.conversation,
            Namespace::new("crash").unwrap(),
            ContextPolicy::default(),
        )
    }

    /// Runs the child until it prints `marker`, then kills it with SIGKILL.
    fn run_child_and_kill(&self, stop: &str, marker: &str) {
        let mut child = process::worker(&worker_test!(crash_worker))
            .env("CRASH_DB", &self.db)
            .env("CRASH_LOG", &self.log)
            .env("CRASH_CONVERSATION", self.conversation.to_string())
            .env("CRASH_REQUEST", self.request.to_string())
            .env("CRASH_STOP", stop)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut seen = Vec::new();
        for line in stdout.lines() {
            let line = line.unwrap();
            // The harness prints `test crash_worker ... ` before the marker.
            if line.contains(marker) {
                child.kill().unwrap(); // SIGKILL on unix
                child.wait().unwrap();
                return;
            }
            seen.push(line);
        }
        let status = child.wait().unwrap();
        panic!("child exited ({status}) before {marker:?}; it printed {seen:#?}");
    }

    fn effects(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for key in std::fs::read_to_string(&self.log).unwrap().lines() {
            *counts.entry(key.to_owned()).or_default() += 1;
        }
        counts
    }
}

/// The child: runs the request and stops being polled at the requested point
/// (`checkpoint:N` after the turn-N checkpoint, `tool:KEY` inside a tool).
#[tokio::test]
#[ignore = "child process of the crash tests"]
async fn crash_worker() {
    let var = |name| std::env::var(name).unwrap();
    let scenario = Scenario {
        db: var("CRASH_DB").into(),
        log: var("CRASH_LOG").into(),
        conversation: var("CRASH_CONVERSATION").parse().unwrap(),
        request: var("CRASH_REQUEST").parse().unwrap(),
    };
    let stop = var("CRASH_STOP");
    let block_on = stop.strip_prefix("tool:").map(str::to_owned);
    let store = Arc::new(SqliteStore::open(&scenario.db).await.unwrap());
    let session = scenario.session(store, block_on);
    let mut events = Box::pin(session.stream(scenario.request, INPUT, RunContext::default()));
    while let Some(event) = events.next().await {
        if let Ok(Event::CheckpointSaved { turn, .. }) = event {
            if stop == format!("checkpoint:{turn}") {
                println!("CHECKPOINT {turn}");
                // Not polling the stream again freezes the run right here.
                std::future::pending::<()>().await;
            }
        }
    }
    panic!("the child was not killed");
}

async fn reopen(
    scenario: &Scenario,
) -> (
    Arc<SqliteStore>,
    turnstile::store::ActiveAdmission,
    Revision,
) {
    let store = Arc::new(SqliteStore::open(&scenario.db).await.unwrap());
    let admission = store.admission(scenario.conversation).await.unwrap();
    let active = admission
        .active
        .expect("the killed run still holds the admission");
    assert_eq!(active.request_id, scenario.request);
    (store, active, admission.revision)
}

/// Every tool call is answered exactly once, right after its call, and no
/// message is repeated.
fn assert_well_formed(transcript: &[Message]) {
    let mut pending: Vec<&str> = Vec::new();
    for message in transcript {
        match message {
            Message::Assistant { tool_calls, .. } => {
                assert!(pending.is_empty(), "calls {pending:?} were never answered");
                pending = tool_calls.iter().map(|c| c.id.as_str()).collect();
            }
            Message::Tool { call_id, .. } => {
                let at = pending.iter().position(|p| p == call_id);
                assert!(at.is_some(), "orphaned or repeated result for {call_id}");
                pending.remove(at.unwrap());
            }
            _ => assert!(pending.is_empty(), "calls {pending:?} were never answered"),
        }
    }
    assert!(pending.is_empty(), "calls {pending:?} were never answered");
}

#[tokio::test]
async fn sigkilled_run_resumes_after_its_turn_two_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = Scenario::new(dir.path());
    scenario.run_child_and_kill("checkpoint:2", "CHECKPOINT 2");

    let (store, active, revision) = reopen(&scenario).await;
    let dead_run = active.run_id;
    let usage_at_crash = store.recovery_usage(scenario.request).await.unwrap();
    assert_eq!(usage_at_crash, usage(1).saturating_add(usage(2)));

    let session = scenario.session(store.clone(), None);
    // The turn-2 checkpoint was committed with turn 3's write-ahead: for all
    // the store knows, turn 3's model call was under way. The default policy
    // refuses and moves nothing; retrying the turn resumes.
    match session
        .resume_run(
            dead_run,
            RunContext::default(),
            revision,
            ResumePolicy::RejectAmbiguous,
        )
        .await
    {
        Err(Error::AmbiguousCheckpoint { run_id, turn }) => {
            assert_eq!((run_id, turn), (dead_run, 3));
        }
        other => panic!("expected AmbiguousCheckpoint, got {other:?}"),
    }
    let admission = store.admission(scenario.conversation).await.unwrap();
    assert_eq!(admission.revision, revision);
    let outcome = session
        .resume_run(
            dead_run,
            RunContext::default(),
            revision,
            ResumePolicy::RetryInterruptedTurn,
        )
        .await
        .unwrap();

    let run = store.run(outcome.run_id).await.unwrap().unwrap();
    assert_eq!(run.resumed_from, Some(dead_run));
    assert_eq!(run.status, RunStatus::Completed);
    let dead = store.run(dead_run).await.unwrap().unwrap();
    assert_eq!(dead.status, RunStatus::Superseded);

    let expected_usage = (1..=4).fold(Usage::default(), |sum, t| sum.saturating_add(usage(t)));
    assert_eq!(outcome.usage, expected_usage);
    assert_eq!(outcome.tool_calls, 4);
    assert_eq!(outcome.turns, 4);

    // The dead run's checkpoints are kept; the new run continues at turn 3.
    let old: Vec<_> = store.checkpoints(dead_run).await.unwrap();
    let phases: Vec<_> = old.iter().map(|c| (c.turn, c.phase)).collect();
    assert_eq!(
        phases,
        [
            (1, CheckpointPhase::Ready),
            (2, CheckpointPhase::Ready),
            (3, CheckpointPhase::TurnInFlight)
        ]
    );
    let new: Vec<_> = store.checkpoints(outcome.run_id).await.unwrap();
    assert_eq!(new.iter().map(|c| c.turn).collect::<Vec<_>>(), [3, 4]);
    assert_eq!(new.last().unwrap().phase, CheckpointPhase::Completed);

    let transcript: Vec<Message> = store
        .transcript_window(scenario.conversation, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.message)
        .collect();
    assert_eq!(transcript, outcome.messages);
    assert_eq!(transcript.len(), 1 + 3 + 4 + 1);
    assert_well_formed(&transcript);
    // The model required every answer back exactly; the transcript holds
    // each turn's reasoning and metadata as the model gave them.
    let answers: Vec<_> = transcript
        .iter()
        .filter_map(|m| match m {
            Message::Assistant {
                content,
                provider_metadata: Some(metadata),
                ..
            } => Some((content.reasoning().next().cloned(), metadata.as_str())),
            _ => None,
        })
        .collect();
    let expected: Vec<_> = (1..=3).map(thinking).collect();
    assert_eq!(
        answers,
        expected
            .iter()
            .map(|(r, m)| (Some(r.clone()), m.as_str()))
            .collect::<Vec<_>>()
    );

    // Every tool ran exactly once, across both processes.
    let effects = scenario.effects();
    assert_eq!(effects.len(), 4);
    assert!(effects.values().all(|&n| n == 1), "{effects:?}");
}

#[tokio::test]
async fn sigkill_inside_a_tool_is_ambiguous_and_retry_skips_journaled_calls() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = Scenario::new(dir.path());
    // Turn 2 has calls b and c: b completes, the child dies inside c.
    scenario.run_child_and_kill("tool:/2/c", "IN TOOL");

    let (store, active, revision) = reopen(&scenario).await;
    let session = scenario.session(store.clone(), None);
    let refused = session
        .resume_run(
            active.run_id,
            RunContext::default(),
            revision,
            ResumePolicy::RejectAmbiguous,
        )
        .await;
    assert!(
        matches!(refused, Err(Error::AmbiguousCheckpoint { turn: 2, .. })),
        "{refused:?}"
    );
    // The refusal changed nothing.
    assert_eq!(
        store
            .admission(scenario.conversation)
            .await
            .unwrap()
            .revision,
        revision
    );

    let outcome = session
        .resume_run(
            active.run_id,
            RunContext::default(),
            revision,
            ResumePolicy::RetryInterruptedTurn,
        )
        .await
        .unwrap();
    assert_eq!(outcome.tool_calls, 4);
    let expected_usage = (1..=4).fold(Usage::default(), |sum, t| sum.saturating_add(usage(t)));
    assert_eq!(
        outcome.usage, expected_usage,
        "the recorded turn-2 answer is reused"
    );
    assert_well_formed(&outcome.messages);

    let effects = scenario.effects();
    let key = |turn: u32, call: &str| format!("{}/{turn}/{call}", scenario.request);
    assert_eq!(effects[&key(1, "a")], 1);
    assert_eq!(effects[&key(2, "b")], 1, "journaled call b ran again");
    // c ran in the child (unjournaled when it died) and again on retry:
    // the documented at-least-once edge of an interrupted tool call.
    assert_eq!(effects[&key(2, "c")], 2);
    assert_eq!(effects[&key(3, "d")], 1);
}
