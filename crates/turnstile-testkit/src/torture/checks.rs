//! The crash-free reference run of a plan, and the checks of what a
//! finished run of it committed, on any [`Store`]: the transcripts, the
//! outcomes, the journal and the replays ([`assert_plan_committed`]), and
//! each request's runs and checkpoints ([`check_request`]).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use turnstile::store::{JournalStatus, RequestStatus, RunRecord, RunStatus, StoredOutcome};
use turnstile::{
    AgentSession, CheckpointPhase, ContextPolicy, ConversationId, Message, RequestId, RunContext,
    RunId, Store,
};

use super::{agent, namespace, ConversationPlan, Plan, RequestPlan, Tracer};

/// A committed transcript entry: (seq, request, message).
pub type Entry = (u64, RequestId, Message);

pub struct Reference {
    pub transcripts: HashMap<ConversationId, Vec<Entry>>,
    pub outcomes: HashMap<RequestId, StoredOutcome>,
    pub messages: HashMap<RequestId, Vec<Message>>,
    pub effects: HashMap<String, usize>,
}

/// The plan, unpaced, with no crash, on `store` (a fresh one; the tests
/// use `SqliteStore::in_memory()`): what every run of it must commit.
pub async fn reference_run(store: Arc<dyn Store>, plan: &Plan, log: &Path) -> Reference {
    let quiet = Tracer { enabled: false };
    let mut reference = Reference {
        transcripts: HashMap::new(),
        outcomes: HashMap::new(),
        messages: HashMap::new(),
        effects: HashMap::new(),
    };
    for conversation in &plan.conversations {
        let (agent, _) = agent(conversation, log, false, quiet);
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

/// Independently of the reference: a conversation's committed transcript
/// holds the plan's messages, each once (its input, one answer per turn,
/// one result per tool call).
pub fn assert_transcript_follows_plan(
    what: &str,
    conversation: &ConversationPlan,
    messages: &[Message],
) {
    let calls = assert_well_formed(what, messages);
    let planned_calls: usize = conversation
        .requests
        .iter()
        .flat_map(|r| &r.turns)
        .map(|t| t.calls.len())
        .sum();
    let planned_turns: usize = conversation.requests.iter().map(|r| r.turns.len()).sum();
    assert_eq!(calls, planned_calls, "{what}: tool calls in the transcript");
    assert_eq!(
        messages.len(),
        conversation.requests.len() + planned_turns + planned_calls,
        "{what}: transcript length"
    );
}

/// The checks every finished run of a plan passes, whatever failed during
/// it: each conversation holds exactly the reference's transcript, every
/// message once, each tool call answered once; every request is completed,
/// its journal holds each planned call once with its result; a retry of
/// every request replays its answer without any model or tool call.
/// Outcomes must equal the reference's, except the usage and tool-call
/// count of the requests in `spent_more`, which may be higher (a model call
/// whose answer a failed step lost still cost tokens). Returns the
/// journaled calls.
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
        assert!(
            admission.active.is_none(),
            "{what}: still held: {admission:?}"
        );
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
            assert_eq!(record.status, RequestStatus::Completed, "{what}");
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
        // A retry of every request replays the stored answer: no model call,
        // no tool call (the log is compared by the caller).
        let (agent, model) = agent(conversation, log, false, Tracer { enabled: false });
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

/// The runs `ids` through the public API, oldest first.
pub async fn runs_of(store: &dyn Store, ids: &[RunId]) -> Vec<RunRecord> {
    let mut runs = Vec::new();
    for &id in ids {
        runs.push(store.run(id).await.expect("read run").expect("listed run"));
    }
    runs.sort_by_key(|r| r.run_id);
    runs
}

/// The committed run, its chain of predecessors among `runs` (every run of
/// the request) and every checkpoint: one recorded model answer per turn,
/// its usage counted once; every journal row by a run of the request
/// (`assert_plan_committed` checks the calls and their statuses).
pub async fn check_request(
    store: &dyn Store,
    request: &RequestPlan,
    stored: &StoredOutcome,
    runs: &[RunRecord],
) {
    let what = format!("request {}", request.id);
    let by_id: HashMap<RunId, &RunRecord> = runs.iter().map(|r| (r.run_id, r)).collect();
    // A single chain from the first run to the committing one.
    let mut chain = vec![stored.run_id];
    while let Some(from) = by_id[chain.last().expect("never empty")].resumed_from {
        assert!(by_id.contains_key(&from), "{what}: unknown predecessor");
        chain.push(from);
    }
    assert_eq!(chain.len(), runs.len(), "{what}: runs outside the chain");
    for run in runs {
        let expected = if run.run_id == stored.run_id {
            RunStatus::Completed
        } else {
            RunStatus::Superseded
        };
        assert_eq!(run.status, expected, "{what}: run {}", run.run_id);
    }

    let usage = request.cumulative_usage();
    let calls = request.cumulative_calls();
    let last = request.turns.len();
    let mut recorded = vec![0usize; last + 1];
    let mut completed = 0;
    for run in runs {
        for checkpoint in store.checkpoints(run.run_id).await.expect("checkpoints") {
            let t = checkpoint.turn as usize;
            assert!((1..=last).contains(&t), "{what}: checkpoint of turn {t}");
            let at = format!("{what}: run {} turn {t} {:?}", run.run_id, checkpoint.phase);
            let (want_usage, want_calls) = match checkpoint.phase {
                CheckpointPhase::TurnInFlight | CheckpointPhase::ModelPending => {
                    (usage[t - 1], calls[t - 1])
                }
                CheckpointPhase::ToolsInFlight | CheckpointPhase::ToolsPending => {
                    recorded[t] += 1;
                    (usage[t], calls[t - 1])
                }
                CheckpointPhase::Ready | CheckpointPhase::Completed => {
                    recorded[t] += 1;
                    (usage[t], calls[t])
                }
            };
            assert_eq!(checkpoint.usage, want_usage, "{at}: usage");
            assert_eq!(checkpoint.tool_calls_count, want_calls, "{at}: tool calls");
            if checkpoint.phase == CheckpointPhase::Completed {
                completed += 1;
                assert_eq!(run.run_id, stored.run_id, "{at}: completed by another run");
                assert_eq!(t, last, "{at}: completed before the last turn");
            }
        }
    }
    assert_eq!(completed, 1, "{what}: completed checkpoints");
    for (t, n) in recorded.iter().enumerate().skip(1) {
        assert!(*n >= 1, "{what}: no checkpoint recorded turn {t}'s answer");
    }
    assert_eq!(stored.usage, usage[last], "{what}: committed usage");
    assert_eq!(
        stored.tool_calls, calls[last],
        "{what}: committed tool calls"
    );
    // The journal: every row by a run of the request, with its result.
    for (i, _) in request.turns.iter().enumerate() {
        let t = u32::try_from(i + 1).expect("small");
        for entry in store.journal(request.id, t).await.expect("journal") {
            assert_eq!(entry.status, JournalStatus::Completed, "{what}: {entry:?}");
            assert!(by_id.contains_key(&entry.run_id), "{what}: {entry:?}");
        }
    }
}

/// Executions per idempotency key in a side-effect log (none if there is
/// no log yet); a torn last line fails.
pub fn effects_in(log: &Path) -> HashMap<String, usize> {
    let mut effects = HashMap::new();
    let text = match std::fs::read_to_string(log) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return effects,
        Err(e) => panic!("read the side-effect log: {e}"),
    };
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "torn side-effect log line"
    );
    for key in text.lines() {
        *effects.entry(key.to_owned()).or_default() += 1;
    }
    effects
}
