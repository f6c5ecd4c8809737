//! A one-turn request's store calls, timed alone: after the workload and
//! its reads, new conversations of the workload's shape, one request after
//! another, each sent through the `Store` trait as the session sends it. The read before
//! the claim (with the model's window), the claim (with the first turn's
//! write-ahead) and the commit of the answer; the last two are the request's
//! durable moments. What a request takes beyond the three is the session's
//! own work and its hand-offs.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use super::report::WorkloadParams;
use super::stats::Latency;
use super::text::{self, Role};
use super::workload;
use crate::cli::exit::CliError;
use turnstile::checkpoint::{CheckpointPhase, LoopCheckpoint};
use turnstile::message::Message;
use turnstile::session::ContextPolicy;
use turnstile::store::{ClaimOutcome, InputHash, NewRequest, Store};
use turnstile::{ConversationId, RequestId, RunId, Usage};

#[derive(Debug, Serialize)]
pub(super) struct Steps {
    /// `Store::claim_context` with the default policy's window.
    pub claim_context: Latency,
    /// `Store::claim`, with the first turn's write-ahead.
    pub claim: Latency,
    /// `Store::commit` of the answer, with the release of the admission.
    pub commit: Latency,
    /// The text of the inputs and answers these requests stored.
    #[serde(skip)]
    pub message_text_bytes: u64,
}

/// The most requests timed: as many as the workload's, up to this.
const MAX_REQUESTS: u32 = 200;

/// Times the steps on a task of the runtime's, where the workload's
/// requests ran: a future polled by the bench's own thread is woken more
/// slowly after each step.
pub(super) async fn measure(
    store: Arc<dyn Store>,
    params: &WorkloadParams,
) -> Result<Steps, CliError> {
    let workload = params
        .conversations
        .saturating_mul(params.turns_per_conversation);
    let shape = Shape {
        requests: workload.min(MAX_REQUESTS),
        first_conversation: params.conversations,
        turns: params.turns_per_conversation.max(1),
        bytes: params.message_bytes as usize,
    };
    tokio::spawn(async move { time(store.as_ref(), shape).await })
        .await
        .map_err(|e| CliError::Failed(format!("the timed steps failed: {e}")))?
}

/// The steps' `requests`, in conversations of the workload's shape:
/// numbered after the workload's (for their text), of `turns` requests
/// each, with messages of `bytes`.
struct Shape {
    requests: u32,
    first_conversation: u32,
    turns: u32,
    bytes: usize,
}

async fn time(store: &dyn Store, shape: Shape) -> Result<Steps, CliError> {
    let Shape {
        requests,
        first_conversation,
        turns,
        bytes,
    } = shape;
    let namespace = workload::namespace()?;
    let window = ContextPolicy::default().window();
    let mut reads = Vec::with_capacity(requests as usize);
    let mut claims = Vec::with_capacity(requests as usize);
    let mut commits = Vec::with_capacity(requests as usize);
    let mut message_text_bytes = 0;
    let mut conversation_id = ConversationId::new();
    for request in 0..requests {
        let (conversation, turn) = (first_conversation + request / turns, request % turns);
        if turn == 0 {
            conversation_id = ConversationId::new();
            store
                .ensure_conversation(&namespace, conversation_id)
                .await?;
        }
        let request_id = RequestId::new();
        let started = Instant::now();
        let context = store
            .claim_context(&namespace, conversation_id, request_id, Some(window))
            .await?;
        reads.push(started.elapsed());
        let admission = match context.admission {
            Some(admission) if admission.active.is_none() => admission,
            _ => {
                return Err(CliError::Failed(format!(
                    "conversation {conversation_id} is not idle between its requests"
                )))
            }
        };
        let input = text::message(conversation, turn, Role::User, bytes);
        let answer = text::message(conversation, turn, Role::Assistant, bytes);
        message_text_bytes += (input.len() + answer.len()) as u64;
        let run_id = RunId::first_of(request_id);
        let first_turn = LoopCheckpoint {
            run_id,
            turn: 1,
            phase: CheckpointPhase::TurnInFlight,
            usage: Usage::default(),
            tool_calls_count: 0,
            verification_reports: Vec::new(),
            message_count: 1,
            created_at: 0,
        };
        let claim = NewRequest {
            conversation_id,
            request_id,
            input_sha256: InputHash::of(&input),
            input: Message::user(input),
            expected_revision: admission.revision,
            run_id,
            agent_fingerprint: "bench".into(),
            first_turn: Some(first_turn.clone()),
            deadline_at: None,
            budget: Default::default(),
        };
        let started = Instant::now();
        let claimed = store.claim(&claim).await?;
        claims.push(started.elapsed());
        let ClaimOutcome::Admitted(fence) = claimed else {
            return Err(CliError::Failed(format!(
                "the new request {request_id} was already known"
            )));
        };
        let completed = LoopCheckpoint {
            phase: CheckpointPhase::Completed,
            message_count: 2,
            ..first_turn
        };
        let started = Instant::now();
        store
            .commit(&fence, &completed, &Message::assistant(answer))
            .await?;
        commits.push(started.elapsed());
    }
    Ok(Steps {
        claim_context: Latency::of(reads),
        claim: Latency::of(claims),
        commit: Latency::of(commits),
        message_text_bytes,
    })
}
