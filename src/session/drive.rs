//! Running the loop for an admitted request: the model's context, the seed
//! state, and the outcome.

use super::{AgentSession, Outcome, ResumePolicy};
use crate::agent::run_loop::RunLoop;
use crate::agent::RunContext;
use crate::checkpoint::{CheckpointPhase, LoopCheckpoint};
use crate::events::{Emitter, Event};
use crate::ids::RunId;
use crate::message::{Message, Usage};
use crate::store::Fence;
use crate::Error;

impl AgentSession {
    /// A fresh claim: the seed is known without reading it back.
    pub(super) async fn drive_fresh(
        &self,
        fence: Fence,
        input: Message,
        ctx: &RunContext,
        events: &Emitter,
    ) -> Result<Outcome, Error> {
        let seed = start_of(fence);
        self.drive(fence, None, seed, vec![input], ctx, events)
            .await
    }

    /// A resumed run: its seeded checkpoint and the request's messages come
    /// from the store.
    pub(super) async fn drive_resumed(
        &self,
        fence: Fence,
        resumed_from: RunId,
        policy: ResumePolicy,
        ctx: &RunContext,
        events: &Emitter,
    ) -> Result<Outcome, Error> {
        // No checkpoint: the run being continued never wrote a turn's
        // write-ahead, so the request starts over from its bound input.
        let seed = self
            .store
            .latest_checkpoint(fence.run_id)
            .await?
            .unwrap_or_else(|| start_of(fence));
        // Checked again on the seed: the run being continued may have
        // written past the checkpoint read before the claim.
        if seed.phase.is_in_flight() && policy == ResumePolicy::RejectAmbiguous {
            return Err(Error::AmbiguousCheckpoint {
                run_id: resumed_from,
                turn: seed.turn,
            });
        }
        // In a tool round the recorded assistant message is needed too.
        let count = seed.message_count + u64::from(seed.phase.has_recorded_answer());
        let messages = self.store.request_messages(fence.request_id, count).await?;
        if messages.len() as u64 != count {
            return Err(Error::Corrupt {
                table: "run_messages",
                key: fence.request_id.to_string(),
                reason: format!("expected {count} messages, found {}", messages.len()),
            });
        }
        self.drive(fence, Some(resumed_from), seed, messages, ctx, events)
            .await
    }

    async fn drive(
        &self,
        fence: Fence,
        resumed_from: Option<RunId>,
        seed: LoopCheckpoint,
        messages: Vec<Message>,
        ctx: &RunContext,
        events: &Emitter,
    ) -> Result<Outcome, Error> {
        tracing::Span::current().record("run_id", tracing::field::display(fence.run_id));
        events
            .emit(Event::RunStarted {
                run_id: fence.run_id,
                request_id: fence.request_id,
                resumed_from,
                revision: fence.revision,
            })
            .await;
        let reuse_journal = seed.phase.has_recorded_answer();
        let run = RunLoop {
            agent: &self.agent,
            store: self.store.as_ref(),
            ctx,
            events,
            fence,
            prefix: self.context_prefix().await?,
            messages,
            checkpoint: seed,
            reuse_journal,
            tool_running: false,
        };
        let (stored, messages) = run.run().await?;
        Ok(Outcome::from_stored(
            fence.request_id,
            stored,
            messages,
            false,
        ))
    }

    /// System prompt plus the committed window. The window starts at a user
    /// message so the model never sees a tool result without its call.
    async fn context_prefix(&self) -> Result<Vec<Message>, Error> {
        let window = self
            .store
            .transcript_window(self.conversation_id, self.policy.window)
            .await?;
        let start = window
            .iter()
            .position(|e| matches!(e.message, Message::User { .. }))
            .unwrap_or(window.len());
        let mut prefix = Vec::with_capacity(window.len() - start + 1);
        if !self.agent.system_prompt.is_empty() {
            prefix.push(Message::system(self.agent.system_prompt.clone()));
        }
        prefix.extend(window.into_iter().skip(start).map(|e| e.message));
        Ok(prefix)
    }
}

/// The state of a request before its first turn: its input is its only
/// message.
fn start_of(fence: Fence) -> LoopCheckpoint {
    LoopCheckpoint {
        run_id: fence.run_id,
        turn: 0,
        phase: CheckpointPhase::Ready,
        usage: Usage::default(),
        tool_calls_count: 0,
        verification_reports: Vec::new(),
        message_count: 1,
        created_at: 0,
    }
}
