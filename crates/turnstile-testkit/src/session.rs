//! Store and conversation fixtures: scripted agents and models, stores on
//! a fresh SQLite file in a temporary directory or in memory, sessions on
//! them, and assertions on what a run left.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use tempfile::TempDir;
use tokio::sync::Notify;
use turnstile::agent::{ModelRequest, ModelResponse};
use turnstile::store::{Admission, RequestRecord};
use turnstile::{
    Agent, AgentSession, Budget, ContextPolicy, ConversationId, Error, Message, Model, ModelError,
    Namespace, RequestId, RunContext, ScriptedModel, ScriptedReply, SqliteStore, Store, Tool,
    ToolCall, Usage,
};

/// Fails a test that waits longer than this for something that must happen.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// The namespace of every test conversation.
pub fn ns() -> Namespace {
    Namespace::new("session-tests").expect("valid namespace")
}

/// The text of the last user message of a model's context: the input a
/// test model answers.
pub fn last_input(messages: &[Message]) -> Option<&str> {
    messages.iter().rev().find_map(|m| match m {
        Message::User { content } => content.as_plain_text(),
        _ => None,
    })
}

/// Input and output tokens; no cache tokens.
pub fn usage(input_tokens: u64, output_tokens: u64) -> Usage {
    Usage {
        input_tokens,
        output_tokens,
        ..Usage::default()
    }
}

/// The context of a resume or recovery that lifts a turn budget the
/// request was stopped by (a budget is stored with the request, so a
/// continuing call without one keeps it): the agent's own limit decides.
pub fn more_turns() -> RunContext {
    RunContext::default().with_budget(Budget {
        max_turns: Some(u32::MAX),
        ..Budget::default()
    })
}

/// A tool call with empty JSON arguments.
pub fn call(id: &str, name: &str) -> ToolCall {
    ToolCall::new(id, name, json!({}))
}

/// A model answer asking for `calls`, costing `cost`.
pub fn tools_reply(calls: Vec<ToolCall>, cost: Usage) -> ScriptedReply {
    ScriptedReply::tool_calls(calls).with_usage(cost)
}

/// A final answer costing `cost`.
pub fn text_reply(text: &str, cost: Usage) -> ScriptedReply {
    ScriptedReply::text(text).with_usage(cost)
}

/// A scripted model shared between the agent and the test (for `calls()`).
pub fn scripted(replies: Vec<ScriptedReply>) -> Arc<ScriptedModel> {
    Arc::new(ScriptedModel::new(replies))
}

/// An agent on `model` with `tools`.
pub fn agent(model: Arc<dyn Model>, tools: Vec<Arc<dyn Tool>>) -> Agent {
    tools
        .into_iter()
        .fold(Agent::new(model), |agent, tool| agent.with_tool(tool))
}

/// A private in-memory store.
pub async fn memory_store() -> Arc<dyn Store> {
    Arc::new(
        SqliteStore::in_memory()
            .await
            .expect("open in-memory store"),
    )
}

/// A database file in a fresh temporary directory (kept alive by the
/// returned `TempDir`).
pub fn temp_db() -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("session.db");
    (dir, path)
}

/// One more store on a database file, as another process would open it.
pub async fn file_store(path: &PathBuf) -> Arc<dyn Store> {
    Arc::new(SqliteStore::open(path).await.expect("open file store"))
}

/// A session on `conversation_id` in [`ns`] with the default context policy.
pub fn session(
    agent: Agent,
    store: &Arc<dyn Store>,
    conversation_id: ConversationId,
) -> Arc<AgentSession> {
    Arc::new(AgentSession::new(
        agent,
        store.clone(),
        conversation_id,
        ns(),
        ContextPolicy::default(),
    ))
}

/// What a refusal must leave untouched: the admission and the request row.
pub async fn state(
    store: &Arc<dyn Store>,
    conversation_id: ConversationId,
    request_id: RequestId,
) -> (Admission, Option<RequestRecord>) {
    (
        store.admission(conversation_id).await.expect("admission"),
        store.request(request_id).await.expect("request"),
    )
}

/// Asserts that every tool call of `messages` is answered by exactly one
/// tool result, and that no result answers an unknown call.
pub fn assert_one_result_per_call(messages: &[Message]) {
    let calls: Vec<&str> = messages
        .iter()
        .flat_map(|m| m.tool_calls())
        .map(|c| c.id.as_str())
        .collect();
    for id in &calls {
        let results = messages
            .iter()
            .filter(|m| matches!(m, Message::Tool { call_id, .. } if call_id == id))
            .count();
        assert_eq!(results, 1, "tool call {id} has {results} results");
    }
    for m in messages {
        if let Message::Tool { call_id, .. } = m {
            assert!(
                calls.contains(&call_id.as_str()),
                "orphaned result {call_id}"
            );
        }
    }
}

/// The tool results of `messages`: (call id, content, is_error).
pub fn tool_results(messages: &[Message]) -> Vec<(String, String, bool)> {
    messages
        .iter()
        .filter_map(|m| match m {
            Message::Tool {
                call_id,
                content,
                is_error,
            } => Some((call_id.clone(), content.text().into_owned(), *is_error)),
            _ => None,
        })
        .collect()
}

/// A [`ScriptedModel`] that records every context it is given and whose
/// first `blocking_calls` calls announce themselves and then wait for a
/// [`ProbeModel::release`] (or for the run to be cancelled or pass its
/// deadline).
pub struct ProbeModel {
    pub scripted: ScriptedModel,
    blocking_calls: usize,
    calls: AtomicUsize,
    seen: Mutex<Vec<Vec<Message>>>,
    entered: Notify,
    release: Notify,
}

impl ProbeModel {
    pub fn new(replies: Vec<ScriptedReply>, blocking_calls: usize) -> Arc<Self> {
        Self::of(ScriptedModel::new(replies), blocking_calls)
    }

    /// A probe of a model that requires its answers back exactly
    /// ([`ScriptedModel::requiring_answers_back`]).
    pub fn strict(replies: Vec<ScriptedReply>) -> Arc<Self> {
        Self::of(ScriptedModel::new(replies).requiring_answers_back(), 0)
    }

    fn of(scripted: ScriptedModel, blocking_calls: usize) -> Arc<Self> {
        Arc::new(Self {
            scripted,
            blocking_calls,
            calls: AtomicUsize::new(0),
            seen: Mutex::new(Vec::new()),
            entered: Notify::new(),
            release: Notify::new(),
        })
    }

    /// Every call, blocked ones included.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// The messages of every call, in order.
    pub fn seen(&self) -> Vec<Vec<Message>> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits until a blocking call has started.
    pub async fn entered(&self) {
        tokio::time::timeout(PATIENCE, self.entered.notified())
            .await
            .expect("the model was never called");
    }

    /// Lets one blocked call (or the next one to block) answer.
    pub fn release(&self) {
        self.release.notify_one();
    }
}

#[async_trait]
impl Model for ProbeModel {
    fn name(&self) -> &str {
        self.scripted.name()
    }

    async fn respond(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        self.seen.lock().unwrap().push(request.messages.to_vec());
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n <= self.blocking_calls {
            self.entered.notify_one();
            self.release.notified().await;
        }
        self.scripted.respond(request).await
    }
}

/// Unwraps an error, with the outcome in the message if there was none.
pub fn expect_err<T: std::fmt::Debug>(result: Result<T, Error>) -> Error {
    match result {
        Ok(value) => panic!("expected an error, got {value:?}"),
        Err(e) => e,
    }
}
