//! A one-turn request's store calls, timed alone: after the workload and
//! its reads, new conversations of the workload's shape, one request after
//! another, each sent through the `Store` trait as the session sends it.
//! The read before the claim (with the model's window), the claim (with
//! the first turn's write-ahead) and the commit of the answer; the last two
//! are the request's durable moments. What a request takes beyond the three
//! is the session's own work and its hand-offs.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use tokio::task::JoinSet;

use super::report::WorkloadParams;
use super::stats::Latency;
use super::text::{self, Role};
use super::workload;
use crate::cli::exit::CliError;
use turnstile::checkpoint::{CheckpointPhase, LoopCheckpoint};
use turnstile::message::Message;
use turnstile::session::ContextPolicy;
use turnstile::store::{ClaimOutcome, InputHash, NewRequest, Store};
use turnstile::{ConversationId, RequestId, RunId};

#[derive(Debug, Serialize)]
pub(super) struct Steps {
    /// Requests timed.
    pub requests: u32,
    /// `Store::claim_context` with the default policy's window.
    pub claim_context: Latency,
    /// `Store::claim`, with the first turn's write-ahead.
    pub claim: Latency,
    /// `Store::commit` of the answer, with the release of the admission.
    pub commit: Latency,
    /// The text of the inputs and answers these requests stored.
    pub message_text_bytes: u64,
    /// The bytes of the images sent with their inputs.
    pub image_bytes: u64,
}

/// The most requests timed: as many as the workload's, up to this.
const MAX_REQUESTS: u32 = 200;

/// How many requests are timed after a workload of `workload_requests`.
pub(super) fn timed_requests(workload_requests: u64) -> u32 {
    u32::try_from(workload_requests).map_or(MAX_REQUESTS, |n| n.min(MAX_REQUESTS))
}

impl Steps {
    /// Each call's row in a human report: its label, its latencies and
    /// what was timed.
    pub(super) fn described(&self) -> [(&'static str, &Latency, String); 3] {
        let alone = |what: &str| format!("{what}, {} requests alone", self.requests);
        [
            (
                "claim read",
                &self.claim_context,
                alone("Store::claim_context with the model's window"),
            ),
            (
                "claim",
                &self.claim,
                alone("Store::claim with the first turn's write-ahead (durable moment 1)"),
            ),
            (
                "commit",
                &self.commit,
                alone("Store::commit of the answer, releasing the admission (durable moment 2)"),
            ),
        ]
    }
}

/// Times the steps on a task of the runtime's, where the workload's
/// requests ran: a future polled by the bench's own thread is woken more
/// slowly after each step. The task is aborted if the bench stops.
pub(super) async fn measure(
    store: Arc<dyn Store>,
    params: &WorkloadParams,
) -> Result<Steps, CliError> {
    let workload_requests =
        u64::from(params.conversations) * u64::from(params.turns_per_conversation);
    let shape = Shape {
        requests: timed_requests(workload_requests),
        first_conversation: params.conversations,
        turns: params.turns_per_conversation.max(1),
        message_bytes: params.message_bytes as usize,
        image_bytes: params.image_bytes as usize,
    };
    let mut task = JoinSet::new();
    task.spawn(async move { time_requests(store.as_ref(), shape).await });
    match task.join_next().await {
        Some(Ok(steps)) => steps,
        Some(Err(e)) => Err(CliError::Failed(format!("the timed steps failed: {e}"))),
        None => Err(CliError::Failed("the timed steps did not run".into())),
    }
}

/// The steps' `requests`, in conversations of the workload's shape:
/// numbered after the workload's (for their text), of `turns` requests
/// each, with its messages and images.
struct Shape {
    requests: u32,
    first_conversation: u32,
    turns: u32,
    message_bytes: usize,
    image_bytes: usize,
}

async fn time_requests(store: &dyn Store, shape: Shape) -> Result<Steps, CliError> {
    let Shape {
        requests,
        first_conversation,
        turns,
        message_bytes,
        image_bytes,
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
        let input = workload::input(conversation, turn, message_bytes, image_bytes)?;
        let answer = text::message(conversation, turn, Role::Assistant, message_bytes);
        message_text_bytes += (input.text().len() + answer.len()) as u64;
        // As the workload's session sends it (`session/admit.rs`).
        let run_id = RunId::first_of(request_id);
        let first_turn = turnstile_bench::first_turn(run_id);
        let claim = NewRequest {
            conversation_id,
            request_id,
            input_sha256: InputHash::of_content(&input)?,
            input: Message::User { content: input },
            expected_revision: admission.revision,
            expected_created_at: None,
            run_id,
            agent_fingerprint: workload::agent(answer.clone()).fingerprint(),
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
        requests,
        claim_context: Latency::of(reads),
        claim: Latency::of(claims),
        commit: Latency::of(commits),
        message_text_bytes,
        image_bytes: u64::from(requests) * image_bytes as u64,
    })
}
