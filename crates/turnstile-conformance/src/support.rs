//! Helpers shared by the suite and by backends' own tests: driving a
//! request through the public `Store` API and snapshotting everything the
//! read API can see.

use std::sync::Arc;

use turnstile_core::store::InputHash;
use turnstile_core::store::{
    Admission, ClaimOutcome, Conversation, Fence, JournalEntry, LoggedEvent, NewRequest,
    RecoveryClaim, RequestRecord, RunRecord, StoredOutcome, ToolResult, TranscriptEntry,
};
use turnstile_core::{
    CheckpointPhase, ConversationId, Error, LoopCheckpoint, Message, Namespace, RequestId,
    Revision, RunId, Store, ToolCall, Usage, VerificationReport,
};

pub type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// The namespace every test conversation lives in.
pub fn ns() -> Namespace {
    Namespace::new("conformance").expect("valid namespace")
}

/// A fresh conversation in [`ns`].
pub async fn new_conversation(store: &dyn Store) -> Result<ConversationId, Error> {
    let id = ConversationId::new();
    store.ensure_conversation(&ns(), id).await?;
    Ok(id)
}

/// A claim of `conversation_id` at `expected_revision` by a new request.
pub fn new_request(
    conversation_id: ConversationId,
    expected_revision: Revision,
    input: &str,
) -> NewRequest {
    // A first run with the request's id, as the engine's; a few claims
    // elsewhere give theirs an id of its own.
    let request_id = RequestId::new();
    NewRequest {
        conversation_id,
        request_id,
        input_sha256: InputHash::of(input),
        input: Message::user(input),
        expected_revision,
        expected_created_at: None,
        run_id: RunId::first_of(request_id),
        agent_fingerprint: "fp".into(),
        first_turn: None,
        deadline_at: None,
        budget: Default::default(),
    }
}

/// The fence of a claim that must be admitted; panics otherwise.
pub async fn admitted(store: &dyn Store, claim: &NewRequest) -> Result<Fence, Error> {
    match store.claim(claim).await? {
        ClaimOutcome::Admitted(fence) => Ok(fence),
        other => panic!("expected an admission, got {other:?}"),
    }
}

/// Claims the conversation at its current revision; panics unless admitted.
pub async fn admit(
    store: &dyn Store,
    conversation_id: ConversationId,
    input: &str,
) -> Result<Fence, Error> {
    let revision = store.admission(conversation_id).await?.revision;
    let claim = new_request(conversation_id, revision, input);
    match store.claim(&claim).await? {
        ClaimOutcome::Admitted(fence) => Ok(fence),
        ClaimOutcome::Existing(record) => panic!("fresh request id already known: {record:?}"),
    }
}

/// A checkpoint of `run_id` after `turn` turns of one tool call and one
/// verification report each.
pub fn checkpoint(
    run_id: RunId,
    turn: u32,
    phase: CheckpointPhase,
    message_count: u64,
) -> LoopCheckpoint {
    LoopCheckpoint {
        run_id,
        turn,
        phase,
        usage: usage_after(turn),
        tool_calls_count: u64::from(turn),
        verification_reports: (1..=turn)
            .map(|t| VerificationReport {
                turn: t,
                passed: t % 2 == 0,
                detail: format!("report {t}"),
            })
            .collect(),
        message_count,
        created_at: 0,
    }
}

/// The cumulative usage the helpers record after `turn` turns.
pub fn usage_after(turn: u32) -> Usage {
    let t = u64::from(turn);
    Usage {
        input_tokens: 100 * t,
        output_tokens: 10 * t,
        cache_read_tokens: t,
        cache_write_tokens: 2 * t,
    }
}

/// One tool call as the helpers' model asks for it.
pub fn tool_call(call_id: &str, arguments: &str) -> ToolCall {
    ToolCall {
        id: call_id.into(),
        name: "lookup".into(),
        arguments: arguments.into(),
        provider_metadata: None,
    }
}

/// Runs turn `turn` of a request whose pending transcript holds `count`
/// messages: write-ahead, a model answer with one tool call, its journaled
/// result and the tool message. Returns the new message count.
pub async fn tool_turn(
    store: &dyn Store,
    fence: &Fence,
    turn: u32,
    count: u64,
    call: ToolCall,
    result: &str,
) -> Result<u64, Error> {
    let run = fence.run_id;
    let mut start = checkpoint(run, turn - 1, CheckpointPhase::TurnInFlight, count);
    start.turn = turn;
    store.begin_turn(fence, &start).await?;
    let assistant =
        Message::assistant_with_calls(format!("calling {}", call.name), vec![call.clone()]);
    let answered = checkpoint(run, turn, CheckpointPhase::ToolsInFlight, count);
    store
        .record_model_response(fence, &answered, &assistant)
        .await?;
    let tool_result = ToolResult {
        content: result.into(),
        is_error: false,
    };
    store
        .record_tool_result(fence, turn, &call.id, &tool_result)
        .await?;
    let tool_message = Message::tool(call.id, result, false);
    let done = checkpoint(run, turn, CheckpointPhase::Ready, count + 2);
    store
        .finish_turn(fence, &done, &[tool_message], None)
        .await?;
    Ok(count + 2)
}

/// Commits `answer` as the final message of turn `turn` of a request whose
/// pending transcript holds `count` messages.
pub async fn commit_answer(
    store: &dyn Store,
    fence: &Fence,
    turn: u32,
    count: u64,
    answer: &str,
) -> Result<StoredOutcome, Error> {
    let last = checkpoint(fence.run_id, turn, CheckpointPhase::Ready, count + 1);
    store
        .commit(fence, &last, &Message::assistant(answer))
        .await
}

/// Claims, runs `turns` tool turns and commits one request.
pub async fn complete_request(
    store: &dyn Store,
    conversation_id: ConversationId,
    input: &str,
    turns: u32,
    answer: &str,
) -> Result<(Fence, StoredOutcome), Error> {
    let fence = admit(store, conversation_id, input).await?;
    let mut count = 1;
    for turn in 1..=turns {
        let call = tool_call(&format!("call-{turn}"), r#"{"q":1}"#);
        count = tool_turn(store, &fence, turn, count, call, "result").await?;
    }
    let outcome = commit_answer(store, &fence, turns + 1, count, answer).await?;
    Ok((fence, outcome))
}

/// Everything the read API shows about one conversation and the given
/// requests and runs; equal snapshots mean nothing observable changed.
#[derive(Debug, PartialEq)]
pub struct Snapshot {
    pub conversation: Conversation,
    pub admission: Admission,
    pub transcript: Vec<TranscriptEntry>,
    pub requests: Vec<Option<RequestRecord>>,
    pub pending: Vec<Vec<Message>>,
    pub journal: Vec<Vec<JournalEntry>>,
    pub runs: Vec<Option<RunRecord>>,
    pub checkpoints: Vec<Vec<LoopCheckpoint>>,
    /// The conversation's events of the given requests.
    pub events: Vec<LoggedEvent>,
}

impl Snapshot {
    /// Reads journal turns `0..=max_turn` of every request.
    pub async fn take(
        store: &dyn Store,
        conversation_id: ConversationId,
        requests: &[RequestId],
        runs: &[RunId],
        max_turn: u32,
    ) -> Result<Self, Error> {
        let mut snapshot = Snapshot {
            conversation: store.conversation(&ns(), conversation_id).await?,
            admission: store.admission(conversation_id).await?,
            transcript: store.transcript_window(conversation_id, u32::MAX).await?,
            requests: Vec::new(),
            pending: Vec::new(),
            journal: Vec::new(),
            runs: Vec::new(),
            checkpoints: Vec::new(),
            events: store.events_after(conversation_id, 0, u32::MAX).await?,
        };
        // The log's events of these requests (a prune takes other
        // requests' events from the same conversation).
        snapshot.events.retain(|e| requests.contains(&e.request_id));
        for &request in requests {
            snapshot.requests.push(store.request(request).await?);
            snapshot
                .pending
                .push(store.request_messages(request, u64::MAX).await?);
            for turn in 0..=max_turn {
                snapshot.journal.push(store.journal(request, turn).await?);
            }
        }
        for &run in runs {
            snapshot.runs.push(store.run(run).await?);
            snapshot.checkpoints.push(store.checkpoints(run).await?);
        }
        Ok(snapshot)
    }
}

/// The plain claim moving `fence`'s request to a new run: no check of a
/// turn in flight, the same agent and budget. Tests change a field or two.
pub fn recovery_of(fence: &Fence) -> RecoveryClaim {
    RecoveryClaim {
        conversation_id: fence.conversation_id,
        request_id: fence.request_id,
        expected_revision: fence.revision,
        from_run: fence.run_id,
        new_run: RunId::new(),
        reject_in_flight: false,
        resolved: None,
        retry_model_call: false,
        agent_fingerprint: None,
        budget_change: None,
    }
}

/// Moves an active request to a new run, as a recovering process would.
pub async fn recover(store: &dyn Store, fence: &Fence) -> Result<Fence, Error> {
    store.claim_recovery(&recovery_of(fence)).await
}

/// A store handle for tasks.
pub type SharedStore = Arc<dyn Store>;
