//! Live events: the pieces of a model's answer as it streams, and each
//! tool call as it starts, sent to the event streams of its conversation
//! while they are connected. Unlike the durable log they are not stored,
//! numbered or sent again: a client that reconnects reads the answer whole
//! in the transcript once `committed`, and a call's result as
//! `tool_finished`. A tool's start is no durable step (the call was
//! journaled with the answer that made it, which `answered` tells), so it
//! is live only.
//!
//! Beside them, each conversation's followers are woken whenever this
//! server writes a logged step, so they read the log at once rather than
//! at their next poll (which still finds other processes' steps).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use axum::response::sse::Event as SseEvent;
use futures_util::{Stream, StreamExt};
use serde::Serialize;
use tokio::sync::{broadcast, watch};
use turnstile_core::events::Event;
use turnstile_core::ids::{ConversationId, RequestId};
use turnstile_core::outcome::Outcome;
use turnstile_core::session::EventStream;
use turnstile_core::Error;

/// Live events held for a slow event stream before it skips some (it
/// reads the answer whole in the transcript all the same).
const BACKLOG: usize = 256;

/// What a run tells the connected streams as it happens.
enum LiveEvent {
    /// One piece of an answer: `event: delta`.
    Delta(Delta),
    /// A tool call about to run: `event: tool_started`.
    ToolStarted(ToolStarted),
}

#[derive(Serialize)]
struct Delta {
    request_id: RequestId,
    turn: u32,
    text: String,
}

#[derive(Serialize)]
struct ToolStarted {
    request_id: RequestId,
    turn: u32,
    call_id: String,
    name: String,
}

impl LiveEvent {
    /// As a server-sent event, with no `id`.
    fn sse(&self) -> SseEvent {
        let (kind, data) = match self {
            LiveEvent::Delta(delta) => ("delta", serde_json::to_string(delta)),
            LiveEvent::ToolStarted(started) => ("tool_started", serde_json::to_string(started)),
        };
        SseEvent::default()
            .event(kind)
            .data(data.unwrap_or_default())
    }
}

/// What a conversation's runs send its followers.
struct Channel {
    live: broadcast::Sender<Arc<LiveEvent>>,
    /// Sent to after each logged step this server writes.
    stepped: watch::Sender<()>,
}

type Channels = HashMap<ConversationId, Arc<Channel>>;

/// A channel per conversation that a run streams in or a client follows,
/// dropped once neither does.
#[derive(Clone, Default)]
pub(crate) struct LiveEvents {
    channels: Arc<Mutex<Channels>>,
}

impl LiveEvents {
    fn channels(&self) -> std::sync::MutexGuard<'_, Channels> {
        // A poisoned map only means a holder panicked between two plain
        // map operations: it is whole.
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The conversation's channel, opened if nobody has it open.
    fn channel(&self, conversation_id: ConversationId) -> Arc<Channel> {
        self.channels()
            .entry(conversation_id)
            .or_insert_with(|| {
                Arc::new(Channel {
                    live: broadcast::channel(BACKLOG).0,
                    stepped: watch::Sender::new(()),
                })
            })
            .clone()
    }

    /// Drops the conversation's channel once no run sends on it and no
    /// stream follows it (the map's own handle is the one left).
    fn release(&self, conversation_id: ConversationId) {
        let mut channels = self.channels();
        // A follower's wake-up receiver goes with its live stream, whose
        // guard calls this: only the live receivers are counted.
        if channels
            .get(&conversation_id)
            .is_some_and(|c| Arc::strong_count(c) == 1 && c.live.receiver_count() == 0)
        {
            channels.remove(&conversation_id);
        }
    }

    /// Wakes the conversation's followers, if it has any: a step of this
    /// server that no run drives (a decision, an abandon, a delete) was
    /// written.
    pub(crate) fn stepped(&self, conversation_id: ConversationId) {
        if let Some(channel) = self.channels().get(&conversation_id) {
            channel.stepped.send_replace(());
        }
    }

    /// Drives `run` (a request's or a takeover's event stream) to its
    /// outcome, sending its text and its tools' starts as they happen;
    /// `None` if the stream ended without one (which [`EventStream`] never
    /// does).
    pub(crate) async fn drive(
        &self,
        conversation_id: ConversationId,
        request_id: RequestId,
        mut run: EventStream<'_>,
    ) -> Result<Option<Outcome>, Error> {
        // Declared first, dropped last: the channel is let go after this
        // run's sender, however the drive ends.
        let _release = Release {
            live: self.clone(),
            conversation_id,
        };
        let channel = self.channel(conversation_id);
        let sender = &channel.live;
        let mut outcome = Ok(None);
        while let Some(event) = run.next().await {
            // The events sent once a logged step is written wake the
            // followers to read it: a claim or takeover (`RunStarted`), an
            // answer with calls (the round that follows it: a call started,
            // answered or waiting for approval), a turn's end, the commit,
            // and the stop an error wrote. `ModelResponded` is sent before
            // its answer is written, and the rest log nothing.
            if matches!(
                event,
                Ok(Event::RunStarted { .. }
                    | Event::ToolStarted { .. }
                    | Event::ToolFinished { .. }
                    | Event::ApprovalRequested { .. }
                    | Event::CheckpointSaved { .. }
                    | Event::ConversationCommitted { .. })
                    | Err(_)
            ) {
                channel.stepped.send_replace(());
            }
            // Nobody following is no failure: what is sent live is
            // durable with its step.
            match event {
                Ok(Event::TextDelta { turn, text }) => {
                    let delta = Delta {
                        request_id,
                        turn,
                        text,
                    };
                    let _ = sender.send(Arc::new(LiveEvent::Delta(delta)));
                }
                Ok(Event::ToolStarted {
                    turn,
                    call_id,
                    name,
                    ..
                }) => {
                    let started = ToolStarted {
                        request_id,
                        turn,
                        call_id,
                        name,
                    };
                    let _ = sender.send(Arc::new(LiveEvent::ToolStarted(started)));
                }
                Ok(Event::ConversationCommitted { outcome: done, .. }) => {
                    outcome = Ok(Some(*done));
                    break;
                }
                Ok(_) => {}
                Err(error) => {
                    outcome = Err(error);
                    break;
                }
            }
        }
        outcome
    }

    /// `conversation_id`'s live events from now on, as server-sent events
    /// of kind `delta` or `tool_started`, with no `id`; and what wakes a
    /// follower of its durable log (the channel stays while the live
    /// stream does).
    pub(crate) fn follow(
        &self,
        conversation_id: ConversationId,
    ) -> (
        impl Stream<Item = SseEvent> + Send + 'static,
        watch::Receiver<()>,
    ) {
        let channel = self.channel(conversation_id);
        let following = Following {
            receiver: channel.live.subscribe(),
            _release: Release {
                live: self.clone(),
                conversation_id,
            },
        };
        let stepped = channel.stepped.subscribe();
        let live = futures_util::stream::unfold(following, |mut following| async move {
            loop {
                match following.receiver.recv().await {
                    Ok(live) => return Some((live.sse(), following)),
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        });
        (live, stepped)
    }
}

/// A stream's subscription. Its fields drop in order: unsubscribed first,
/// then the channel released, counting this stream out.
struct Following {
    receiver: broadcast::Receiver<Arc<LiveEvent>>,
    _release: Release,
}

struct Release {
    live: LiveEvents,
    conversation_id: ConversationId,
}

impl Drop for Release {
    fn drop(&mut self) {
        self.live.release(self.conversation_id);
    }
}
