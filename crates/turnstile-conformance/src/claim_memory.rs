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
    Model, ModelError, ProviderMetadata, RequestId, RunContext, Store,
};

use crate::activity::SharedAdmin;
use crate::admin::tick;
use crate::support::{admit, complete_request, ns, TestResult};

/// The window the sessions here ask for: small, so that it slides.
const WINDOW: u32 = 4;

/// A model that answers each call with a numbered text and provider
/// metadata (whitespace kept), and records what it was shown.
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
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.last().cloned().unwrap_or_default()
    }
}

/// A session of its own for each request, as a server makes them.
fn session(store: &SharedAdmin, model: &Arc<Recorder>, id: ConversationId) -> AgentSession {
    let store: Arc<dyn Store> = store.clone();
    let policy = ContextPolicy::new(WINDOW).expect("a valid window");
    AgentSession::new(Agent::new(model.clone()), store, id, ns(), policy)
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
    let outcome = session(store, model, id)
        .run(request_id, input, RunContext::default())
        .await?;
    assert!(!outcome.replayed, "{input}: a new request");
    assert_eq!(model.last(), expected, "{input}: the model's context");
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
