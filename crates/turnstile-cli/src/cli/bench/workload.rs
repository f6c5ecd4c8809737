//! The write workload: `conversations` conversations of `turns` one-turn
//! requests each, `concurrency` of them at a time, each driven by its own
//! tokio task through `AgentSession::run`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use super::report::WorkloadParams;
use super::text::{self, Role};
use crate::cli::exit::CliError;
use turnstile::agent::{Agent, RunContext, ScriptedModel, ScriptedReply};
use turnstile::ids::{ConversationId, Namespace, RequestId, RunId};
use turnstile::session::{AgentSession, ContextPolicy};
use turnstile::store::Store;
use turnstile::{Attachment, Content, Part};

/// The namespace of every bench conversation.
const NAMESPACE: &str = "bench";
/// Completed requests whose reads are timed afterwards.
const READ_SAMPLES: u64 = 200;

#[derive(Clone, Copy)]
pub(super) struct Workload {
    conversations: u32,
    turns: u32,
    message_bytes: usize,
    image_bytes: usize,
    concurrency: u32,
}

impl From<&WorkloadParams> for Workload {
    fn from(params: &WorkloadParams) -> Self {
        Self {
            conversations: params.conversations,
            turns: params.turns_per_conversation,
            message_bytes: params.message_bytes as usize,
            image_bytes: params.image_bytes as usize,
            concurrency: params.concurrency,
        }
    }
}

/// What the workload wrote, and how long it took.
#[derive(Default)]
pub(super) struct Written {
    /// One per turn: the time of its `session.run`.
    pub latencies: Vec<Duration>,
    /// From the first request's start to the last one's commit.
    pub wall: Duration,
    /// Evenly spread committed requests, for the read latencies.
    pub samples: Vec<Committed>,
    /// The bytes of message text written: every input and every answer.
    pub message_text_bytes: u64,
    /// The bytes of the images sent with the inputs.
    pub image_bytes: u64,
}

impl Written {
    /// The text and image bytes written, as the storage figure counts them.
    pub fn raw_bytes(&self) -> (u64, u64) {
        (self.message_text_bytes, self.image_bytes)
    }
}

/// A committed request: enough to read it back and replay it.
pub(super) struct Committed {
    pub conversation_id: ConversationId,
    /// Which conversation and turn of the workload: the seed of its texts.
    pub conversation: u32,
    pub turn: u32,
    pub request_id: RequestId,
    pub run_id: RunId,
}

impl Workload {
    pub(super) async fn run(self, store: Arc<dyn Store>) -> Result<Written, CliError> {
        let namespace = namespace()?;
        let next = Arc::new(AtomicU32::new(0));
        let started = Instant::now();
        let mut tasks = JoinSet::new();
        for _ in 0..self.concurrency {
            let (store, namespace, next) = (store.clone(), namespace.clone(), next.clone());
            tasks.spawn(async move { self.drive(store, namespace, &next).await });
        }
        let mut written = Written::default();
        // On the first failure the set is dropped, which aborts the rest.
        while let Some(joined) = tasks.join_next().await {
            let part =
                joined.map_err(|e| CliError::Failed(format!("a bench task failed: {e}")))??;
            written.latencies.extend(part.latencies);
            written.samples.extend(part.samples);
            written.message_text_bytes += part.message_text_bytes;
            written.image_bytes += part.image_bytes;
        }
        written.wall = started.elapsed();
        Ok(written)
    }

    /// Takes conversations from `next` until none are left, running each
    /// one's turns in order.
    async fn drive(
        self,
        store: Arc<dyn Store>,
        namespace: Namespace,
        next: &AtomicU32,
    ) -> Result<Written, CliError> {
        let mut part = Written::default();
        loop {
            let conversation = next.fetch_add(1, Ordering::Relaxed);
            if conversation >= self.conversations {
                return Ok(part);
            }
            let conversation_id = ConversationId::new();
            for turn in 0..self.turns {
                let input = input(conversation, turn, self.message_bytes, self.image_bytes)?;
                let answer = text::message(conversation, turn, Role::Assistant, self.message_bytes);
                part.message_text_bytes += (input.text().len() + answer.len()) as u64;
                part.image_bytes += self.image_bytes as u64;
                let session = session(&store, conversation_id, &namespace, answer.clone());
                let request_id = RequestId::new();
                let started = Instant::now();
                let outcome = session
                    .run(request_id, input, RunContext::default())
                    .await?;
                part.latencies.push(started.elapsed());
                if outcome.replayed || outcome.final_text != answer {
                    return Err(CliError::Failed(format!(
                        "request {request_id} did not commit the scripted answer"
                    )));
                }
                if self.sampled(conversation, turn) {
                    part.samples.push(Committed {
                        conversation_id,
                        conversation,
                        turn,
                        request_id,
                        run_id: outcome.run_id,
                    });
                }
            }
        }
    }

    /// Every `total / READ_SAMPLES`-th turn (rounded up), so at most
    /// [`READ_SAMPLES`] requests, spread over the whole workload.
    fn sampled(&self, conversation: u32, turn: u32) -> bool {
        let total = u64::from(self.conversations) * u64::from(self.turns);
        let stride = total.div_ceil(READ_SAMPLES).max(1);
        (u64::from(conversation) * u64::from(self.turns) + u64::from(turn)) % stride == 0
    }
}

/// A session whose scripted model answers `answer` at once. The model only
/// knows one reply (every request starts the script over), so each request
/// gets a session of its own: cheap, and the agent fingerprint is the same.
pub(super) fn session(
    store: &Arc<dyn Store>,
    conversation_id: ConversationId,
    namespace: &Namespace,
    answer: String,
) -> AgentSession {
    AgentSession::new(
        agent(answer),
        store.clone(),
        conversation_id,
        namespace.clone(),
        ContextPolicy::default(),
    )
}

/// The agent of a session: a scripted model that answers `answer`.
pub(super) fn agent(answer: String) -> Agent {
    Agent::new(Arc::new(ScriptedModel::named(
        "bench",
        vec![ScriptedReply::text(answer)],
    )))
}

/// The input of one turn: its text, and an image of `image_bytes` (none
/// when 0) whose bytes no other turn's image has, and that do not compress
/// (like an encoded image's).
pub(super) fn input(
    conversation: u32,
    turn: u32,
    message_bytes: usize,
    image_bytes: usize,
) -> Result<Content, CliError> {
    let text = text::message(conversation, turn, Role::User, message_bytes);
    if image_bytes == 0 {
        return Ok(Content::from(text));
    }
    // xorshift64*, seeded by the turn: cheap, incompressible, reproducible
    // (a replay sends the same image).
    let mut state = (u64::from(conversation) << 32 | u64::from(turn)) ^ 0x9e37_79b9_7f4a_7c15;
    let bytes: Vec<u8> = (0..image_bytes)
        .map(|_| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect();
    let image = Attachment::new("image/png", bytes)?;
    Ok(Content::new(vec![Part::text(text), Part::Image(image)]))
}

/// The namespace of the bench conversations.
pub(super) fn namespace() -> Result<Namespace, CliError> {
    Ok(Namespace::new(NAMESPACE)?)
}
