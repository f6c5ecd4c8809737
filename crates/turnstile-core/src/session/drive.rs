//! Running the loop for an admitted request: the model's context, the seed
//! state, and the outcome.

use super::compact;
use super::reconcile::InDoubt;
use super::stream::Emitter;
use super::turns::{first_turn, start_of, RunLoop};
use super::AgentSession;
use crate::agent::RunContext;
use crate::checkpoint::{CheckpointPhase, LoopCheckpoint};
use crate::error::Error;
use crate::events::Event;
use crate::ids::RunId;
use crate::message::Message;
use crate::outcome::Outcome;
use crate::store::{AgentChange, Fence};

impl AgentSession {
    /// A fresh claim: the request is at its start, or at its first turn
    /// when the claim wrote that turn's write-ahead (the model's context
    /// then read before the claim).
    pub(super) async fn drive_fresh(
        &self,
        fence: Fence,
        input: Message,
        written_ahead: Option<Vec<Message>>,
        ctx: &RunContext,
        events: &Emitter,
    ) -> Result<Outcome, Error> {
        let seed = match written_ahead {
            Some(prefix) => Seed::WrittenAhead(first_turn(fence.run_id), prefix),
            None => Seed::Start(None),
        };
        self.drive(fence, None, seed, vec![input], ctx, events)
            .await
    }

    /// A resumed run: its seeded checkpoint and the request's messages come
    /// from the store.
    pub(super) async fn drive_resumed(
        &self,
        fence: Fence,
        resumed_from: RunId,
        agent_change: Option<AgentChange>,
        in_doubt: Option<InDoubt>,
        ctx: &RunContext,
        events: &Emitter,
    ) -> Result<Outcome, Error> {
        let reads = self.resume_reads(fence);
        // Without a summary agent the model's context does not depend on
        // where the run stopped: it is read at the same time.
        let ((seed, messages), prefix) = match self.summary {
            None => {
                // Both finish before either error is looked at: an
                // overtaken run is told `Fenced` by `resume_reads`, whatever
                // the context read met.
                let (reads, prefix) = tokio::join!(reads, self.context_prefix());
                (reads?, Some(prefix?))
            }
            Some(_) => (reads.await?, None),
        };
        let seed = match seed {
            Some(seed) => Seed::Resumed(seed, prefix),
            None => Seed::Start(prefix),
        };
        let continues = Continues {
            from: resumed_from,
            agent_change,
            in_doubt,
        };
        self.drive(fence, Some(continues), seed, messages, ctx, events)
            .await
    }

    /// The latest checkpoint of the run being continued and the request's
    /// messages up to it.
    async fn resume_reads(
        &self,
        fence: Fence,
    ) -> Result<(Option<LoopCheckpoint>, Vec<Message>), Error> {
        // No checkpoint: the run being continued never wrote a turn's
        // write-ahead, so the request goes on from its bound input (its
        // summary passes, if any, are continued from the admission).
        let seed = self.store.latest_checkpoint(fence.run_id).await?;

        // In a tool round the recorded assistant message is needed too.
        let count = seed.as_ref().map_or(1, LoopCheckpoint::messages_recorded);
        let messages = self.store.request_messages(fence.request_id, count).await?;
        if messages.len() as u64 != count {
            // A recoverer that took the request over and committed it in
            // the meantime moved the messages to the transcript.
            let admission = self.store.admission(fence.conversation_id).await?;
            if admission.revision != fence.revision {
                return Err(Error::Fenced {
                    run_id: fence.run_id,
                    revision: fence.revision,
                });
            }
            return Err(Error::Corrupt {
                table: "run_messages",
                key: fence.request_id.to_string(),
                reason: format!("expected {count} messages, found {}", messages.len()),
            });
        }
        Ok((seed, messages))
    }

    /// Runs the request from `seed`, with its lease renewed alongside when
    /// the session has one.
    async fn drive(
        &self,
        fence: Fence,
        continues: Option<Continues>,
        seed: Seed,
        messages: Vec<Message>,
        ctx: &RunContext,
        events: &Emitter,
    ) -> Result<Outcome, Error> {
        let run = self.drive_owned(fence, continues, seed, messages, ctx, events);
        self.leased(fence, run).await
    }

    /// Runs the request from `seed`, or from its start (summary passes
    /// first) when it has no checkpoint yet.
    async fn drive_owned(
        &self,
        fence: Fence,
        continues: Option<Continues>,
        seed: Seed,
        messages: Vec<Message>,
        ctx: &RunContext,
        events: &Emitter,
    ) -> Result<Outcome, Error> {
        tracing::Span::current().record("run_id", tracing::field::display(fence.run_id));
        let (resumed_from, agent_change, in_doubt) = match continues {
            Some(c) => (Some(c.from), c.agent_change, c.in_doubt),
            None => (None, None, None),
        };
        events
            .emit(Event::RunStarted {
                run_id: fence.run_id,
                request_id: fence.request_id,
                resumed_from,
                revision: fence.revision,
            })
            .await;
        if let Some(change) = agent_change {
            events
                .emit(Event::AgentChanged {
                    run_id: fence.run_id,
                    from: change.from,
                    to: change.to,
                })
                .await;
        }
        let (seed, prefix) = match seed {
            Seed::Resumed(seed, Some(prefix)) => (seed, prefix),
            Seed::Resumed(seed, None) => (seed, self.context_prefix().await?),
            Seed::WrittenAhead(seed, prefix) => {
                events.emit(Event::TurnStarted { turn: seed.turn }).await;
                (seed, prefix)
            }
            Seed::Start(prefix) => {
                let seed = start_of(fence, self.compact(&fence, ctx, events).await?);
                let prefix = match prefix {
                    Some(prefix) => prefix,
                    None => self.context_prefix().await?,
                };
                (seed, prefix)
            }
        };
        let reuse_journal = seed.phase.has_recorded_answer();
        // A run that takes over a tool round in flight inherits its
        // ambiguity: a call the run it continues started may have had its
        // effect unjournaled, so a stop before that call is journaled again
        // must not settle the turn (the first journaled result clears it).
        let tool_running = seed.phase == CheckpointPhase::ToolsInFlight;
        let request_start = prefix.len();
        let mut context = prefix;
        context.extend(messages);
        let run = RunLoop {
            agent: &self.agent,
            store: self.store.as_ref(),
            ctx,
            events,
            fence,
            context,
            request_start,
            checkpoint: seed,
            reuse_journal,
            tool_running,
            in_doubt,
            images: self.policy.images() as usize,
        };
        let (stored, messages) = run.run().await?;
        Ok(Outcome::from_stored(
            fence.request_id,
            stored,
            messages,
            false,
        ))
    }

    /// System prompt plus committed context. Without a summary agent, the
    /// plain sliding window, moved forward to start at a user message so the
    /// model never sees a tool result without its call. With one, the latest
    /// summary as a marked system message and every entry after it (the
    /// passes before the first turn left fewer than a batch outside the
    /// window).
    pub(super) async fn context_prefix(&self) -> Result<Vec<Message>, Error> {
        if self.summary.is_none() {
            let window = self
                .store
                .transcript_window(self.conversation_id, self.policy.window())
                .await?;
            let messages: Vec<Message> = window.into_iter().map(|e| e.message).collect();
            return Ok(self.window_prefix(&messages));
        }
        let mut prefix = Vec::new();
        if !self.agent.system_prompt.is_empty() {
            prefix.push(Message::system(self.agent.system_prompt.clone()));
        }
        let latest = self.store.latest_summary(self.conversation_id).await?;
        let from = latest.as_ref().map_or(0, |s| s.through_seq + 1);
        if let Some(latest) = latest {
            prefix.push(compact::context_message(&latest.content));
        }
        let tail = self
            .store
            .transcript_range(self.conversation_id, from, u64::MAX)
            .await?;
        prefix.extend(tail.into_iter().map(|e| self.policy.shown(e.message)));
        Ok(prefix)
    }

    /// The model's context without a summary agent: the system prompt and
    /// the plain sliding `window` (as read with the policy's window), moved
    /// forward to start at a user message.
    pub(super) fn window_prefix(&self, window: &[Message]) -> Vec<Message> {
        let mut prefix = Vec::new();
        if !self.agent.system_prompt.is_empty() {
            prefix.push(Message::system(self.agent.system_prompt.clone()));
        }
        let start = window
            .iter()
            .position(|m| matches!(m, Message::User { .. }))
            .unwrap_or(window.len());
        prefix.extend(window[start..].iter().map(|m| self.policy.shown(m.clone())));
        prefix
    }
}

/// The run a resumed run continues, the agent change it accepted, and what
/// it found of the call in doubt of a tool round in flight.
struct Continues {
    from: RunId,
    agent_change: Option<AgentChange>,
    in_doubt: Option<InDoubt>,
}

/// Where a run starts.
enum Seed {
    /// At the request's start: summary passes, then the first turn; with
    /// the model's context when it was read already (only without a summary
    /// agent, whose passes come first).
    Start(Option<Vec<Message>>),
    /// At a turn whose write-ahead the claim saved, with the model's
    /// context read before the claim.
    WrittenAhead(LoopCheckpoint, Vec<Message>),
    /// At the latest checkpoint of the run it continues, with the model's
    /// context when it was read alongside.
    Resumed(LoopCheckpoint, Option<Vec<Message>>),
}
