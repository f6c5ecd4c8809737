//! A conversation's next request, claimed from what the store remembers of
//! its last commit (`Store::claim_memory`), shows the model what a read of
//! the transcript shows and answers every refusal as a read-first claim
//! would, whatever changed behind the memory's back.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use turnstile_core::admin::PruneOptions;
use turnstile_core::agent::{ModelRequest, ModelResponse};
use turnstile_core::{
    async_trait, Agent, AgentSession, Content, ContextPolicy, ConversationId, Error, Message,
    Model, ModelError, ProviderMetadata, RequestId, RunContext, Store, Tool, ToolCall, ToolContext,
    ToolError, ToolSpec,
};

use crate::activity::SharedAdmin;
use crate::admin::tick;
use crate::support::{
    admit, admitted, complete_request, new_conversation, new_request, ns, TestResult,
};

/// The window the sessions here ask for: small, so that it slides.
const WINDOW: u32 = 4;

/// The input that makes [`Recorder`] call [`Echo`] first.
const USE_THE_TOOL: &str = "use the tool";

/// A model that answers each call with a numbered text and provider
/// metadata (whitespace kept), or with a call of [`Echo`] when the last
/// message is [`USE_THE_TOOL`], and records what it was shown.
#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<Vec<Message>>>,
}

#[async_trait]
impl Model for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }

    async fn respond(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.push(request.messages.to_vec());
        let metadata = ProviderMetadata::new(format!(r#"{{ "call" :  {} }}"#, seen.len()))
            .map_err(|e| ModelError::fatal(e.to_string()))?;
        if request.messages.last() == Some(&Message::user(USE_THE_TOOL)) {
            let call = ToolCall::new("call-1", "echo", serde_json::json!({ "say": "é \"x\"" }));
            return Ok(ModelResponse {
                tool_calls: vec![call],
                provider_metadata: Some(metadata),
                ..ModelResponse::default()
            });
        }
        Ok(ModelResponse {
            content: Content::from(format!("answer {}", seen.len())),
            provider_metadata: Some(metadata),
            ..ModelResponse::default()
        })
    }
}

impl Recorder {
    fn calls(&self) -> usize {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn last(&self) -> Vec<Message> {
        self.call(self.calls().saturating_sub(1))
    }

    /// The messages of call `n` (from 0).
    fn call(&self, n: usize) -> Vec<Message> {
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.get(n).cloned().unwrap_or_default()
    }
}

/// A tool that answers its arguments back.
struct Echo;

#[async_trait]
impl Tool for Echo {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "echo".into(),
            description: "Answers its arguments".into(),
            parameters: serde_json::json!({ "type": "object" }),
        }
    }

    async fn call(
        &self,
        arguments: serde_json::Value,
        _: ToolContext,
    ) -> Result<Content, ToolError> {
        Ok(Content::from(arguments.to_string()))
    }
}

/// A session of its own for each request, as a server makes them.
fn session(store: &SharedAdmin, model: &Arc<Recorder>, id: ConversationId) -> AgentSession {
    let store: Arc<dyn Store> = store.clone();
    let policy = ContextPolicy::new(WINDOW).expect("a valid window");
    let agent = Agent::new(model.clone()).with_tool(Arc::new(Echo));
    AgentSession::new(agent, store, id, ns(), policy)
}

/// What a read-first claim shows the model for `input`: the last
/// [`WINDOW`] committed entries from the first user message on, then the
/// input.
async fn read_first_context(
    store: &SharedAdmin,
    id: ConversationId,
    input: &str,
) -> Result<Vec<Message>, Error> {
    let window: Vec<Message> = match store.transcript_window(id, WINDOW).await {
        Ok(entries) => entries.into_iter().map(|e| e.message).collect(),
        Err(Error::NotFound { .. }) => Vec::new(),
        Err(e) => return Err(e),
    };
    let start = window
        .iter()
        .position(|m| matches!(m, Message::User { .. }))
        .unwrap_or(window.len());
    let mut context = window[start..].to_vec();
    context.push(Message::user(input));
    Ok(context)
}

/// Runs `input` as a new request and checks the model saw what a read
/// would have shown it.
async fn run_and_check(
    store: &SharedAdmin,
    model: &Arc<Recorder>,
    id: ConversationId,
    input: &str,
) -> Result<RequestId, Box<dyn std::error::Error + Send + Sync>> {
    let expected = read_first_context(store, id, input).await?;
    let request_id = RequestId::new();
    let first_call = model.calls();
    let outcome = session(store, model, id)
        .run(request_id, input, RunContext::default())
        .await?;
    assert!(!outcome.replayed, "{input}: a new request");
    assert_eq!(
        model.call(first_call),
        expected,
        "{input}: the model's context"
    );
    if let Some(memory) = store.claim_memory() {
        assert!(memory.remembers(id), "{input}: remembered after its commit");
    }
    Ok(request_id)
}

pub async fn a_next_request_claimed_from_memory_sees_what_a_read_shows_whatever_changed(
    store: SharedAdmin,
) -> TestResult {
    let model = Arc::new(Recorder::default());
    let id = ConversationId::new();
    // The window fills and slides, request after request.
    for n in 1..=4 {
        run_and_check(&store, &model, id, &format!("question {n}")).await?;
    }
    // A request with a tool round adds its call and result as stored.
    run_and_check(&store, &model, id, USE_THE_TOOL).await?;
    run_and_check(&store, &model, id, "after the tool").await?;

    // A request committed behind the memory's back (straight through the
    // store) is in the next request's context.
    complete_request(&*store, id, "elsewhere", 1, "elsewhere's answer").await?;
    let last = run_and_check(&store, &model, id, "after elsewhere").await?;

    // A retry of the last request replays it; with another input it is
    // refused; neither calls the model.
    let calls = model.calls();
    let replay = session(&store, &model, id)
        .run(last, "after elsewhere", RunContext::default())
        .await?;
    assert!(replay.replayed);
    let mismatch = session(&store, &model, id)
        .run(last, "another input", RunContext::default())
        .await;
    assert!(
        matches!(mismatch, Err(Error::RequestMismatch { .. })),
        "{mismatch:?}"
    );
    assert_eq!(model.calls(), calls, "no model call for a known request id");
    let next = run_and_check(&store, &model, id, "after the retries").await?;
    assert_ne!(next, last);

    // A request held by another owner answers Busy and writes nothing.
    let held = admit(&*store, id, "held elsewhere").await?;
    let busy = session(&store, &model, id)
        .run(RequestId::new(), "while held", RunContext::default())
        .await;
    assert!(matches!(busy, Err(Error::Busy { .. })), "{busy:?}");
    store.abandon(id, held.request_id, held.revision).await?;
    run_and_check(&store, &model, id, "after the abandon").await?;

    // Pruned whole while idle, the conversation starts again empty.
    tick().await;
    let options = PruneOptions {
        include_transcripts: true,
        conversations_older_than: Some(Duration::ZERO),
        ..PruneOptions::older_than(Duration::ZERO)
    };
    store.prune(&options).await?;
    run_and_check(&store, &model, id, "after the prune").await?;
    assert_eq!(model.last(), [Message::user("after the prune")]);
    run_and_check(&store, &model, id, "again").await?;

    // Deleted, it refuses the next request as deleted.
    let version = store.conversation(&ns(), id).await?.version;
    store.delete_conversation(&ns(), id, version, None).await?;
    let calls = model.calls();
    let deleted = session(&store, &model, id)
        .run(RequestId::new(), "after the delete", RunContext::default())
        .await;
    assert!(matches!(deleted, Err(Error::Deleted { .. })), "{deleted:?}");
    assert_eq!(model.calls(), calls);
    Ok(())
}

pub async fn a_claim_naming_another_creation_time_conflicts_and_writes_nothing(
    store: SharedAdmin,
) -> TestResult {
    let id = new_conversation(&*store).await?;
    let created_at = store.conversation(&ns(), id).await?.created_at;
    let before = store.admission(id).await?;
    // The conversation as one created again under its id would be.
    let mut claim = new_request(id, before.revision, "elsewhere");
    claim.expected_created_at = Some(created_at + 1);
    let refused = store.claim(&claim).await;
    assert!(
        matches!(refused, Err(Error::Conflict { .. })),
        "{refused:?}"
    );
    assert_eq!(store.admission(id).await?, before, "nothing written");
    assert_eq!(store.request(claim.request_id).await?, None);
    assert_eq!(store.request_messages(claim.request_id, 1).await?, []);
    // The one it is.
    claim.expected_created_at = Some(created_at);
    let fence = admitted(&*store, &claim).await?;
    assert_eq!(fence.revision.0, before.revision.0 + 1);
    Ok(())
}

/// Two stores on one database, `here` and `elsewhere` (as two processes
/// would open it): `here` remembers a conversation; `elsewhere` prunes it
/// whole, creates it again under its id and runs it up to the revision
/// `here` remembers. The model of `here`'s next request is shown the new
/// transcript. Not in [`suite!`](crate::suite), which opens one store: each
/// backend calls it with two.
pub async fn a_conversation_pruned_and_created_again_elsewhere_up_to_the_remembered_revision_shows_its_new_transcript(
    here: SharedAdmin,
    elsewhere: SharedAdmin,
) -> TestResult {
    let model = Arc::new(Recorder::default());
    let id = ConversationId::new();
    run_and_check(&here, &model, id, "old question").await?;
    let memory = here.claim_memory().ok_or("the store remembers nothing")?;
    let remembered = here.admission(id).await?.revision;

    tick().await;
    let options = PruneOptions {
        include_transcripts: true,
        conversations_older_than: Some(Duration::ZERO),
        ..PruneOptions::older_than(Duration::ZERO)
    };
    assert_eq!(elsewhere.prune(&options).await?.deleted.conversations, 1);
    elsewhere.ensure_conversation(&ns(), id).await?;
    complete_request(&*elsewhere, id, "new question", 0, "new answer").await?;
    assert_eq!(
        elsewhere.admission(id).await?.revision,
        remembered,
        "the revision remembered, in another conversation"
    );
    assert!(memory.remembers(id), "here did not see the prune");

    run_and_check(&here, &model, id, "after").await?;
    assert_eq!(
        model.last(),
        [
            Message::user("new question"),
            Message::assistant("new answer"),
            Message::user("after")
        ]
    );
    Ok(())
}
