//! Live text: the pieces of a model's answer as it streams, sent to the
//! event streams of its conversation while they are connected. Unlike the
//! durable log they are not stored, numbered or sent again: a client that
//! reconnects gets the answer whole from its durable event (`answered`, or
//! `committed` for the final one) and the transcript.

use std::sync::Arc;

use axum::response::sse::Event as SseEvent;
use futures_util::{Stream, StreamExt};
use serde::Serialize;
use tokio::sync::broadcast;
use turnstile_core::events::Event;
use turnstile_core::ids::{ConversationId, RequestId};
use turnstile_core::outcome::Outcome;
use turnstile_core::session::EventStream;
use turnstile_core::Error;

/// Pieces held for a slow event stream before it skips some (it gets the
/// answer whole from the durable log all the same).
const BACKLOG: usize = 4096;

/// One piece of an answer.
#[derive(Serialize)]
struct Delta {
    #[serde(skip)]
    conversation_id: ConversationId,
    request_id: RequestId,
    turn: u32,
    text: String,
}

/// Every run's pieces, to every event stream of the server; each stream
/// keeps its conversation's.
#[derive(Clone)]
pub(crate) struct LiveText {
    sender: broadcast::Sender<Arc<Delta>>,
}

impl LiveText {
    pub(crate) fn new() -> Self {
        Self {
            sender: broadcast::channel(BACKLOG).0,
        }
    }

    /// Drives `run` (a request's or a takeover's event stream) to its
    /// outcome, sending its text as it streams; `None` if the stream ended
    /// without one (which [`EventStream`] never does).
    pub(crate) async fn drive(
        &self,
        conversation_id: ConversationId,
        request_id: RequestId,
        mut run: EventStream<'_>,
    ) -> Result<Option<Outcome>, Error> {
        while let Some(event) = run.next().await {
            match event? {
                Event::TextDelta { turn, text } => {
                    // Nobody connected is no failure: the text is durable
                    // with its answer.
                    let _ = self.sender.send(Arc::new(Delta {
                        conversation_id,
                        request_id,
                        turn,
                        text,
                    }));
                }
                Event::ConversationCommitted { outcome, .. } => return Ok(Some(*outcome)),
                _ => {}
            }
        }
        Ok(None)
    }

    /// The pieces of `conversation_id`'s answers from now on, as
    /// server-sent events of kind `delta` with no `id`.
    pub(crate) fn follow(
        &self,
        conversation_id: ConversationId,
    ) -> impl Stream<Item = SseEvent> + Send + 'static {
        let receiver = self.sender.subscribe();
        futures_util::stream::unfold(receiver, move |mut receiver| async move {
            loop {
                match receiver.recv().await {
                    Ok(delta) if delta.conversation_id == conversation_id => {
                        let data = serde_json::to_string(&*delta).unwrap_or_default();
                        return Some((SseEvent::default().event("delta").data(data), receiver));
                    }
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
    }
}
