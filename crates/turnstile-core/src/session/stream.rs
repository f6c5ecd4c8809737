//! Turning an execution into a stream of events.

use std::future::Future;

use tracing::Instrument;

use super::EventStream;
use crate::error::Error;
use crate::events::Event;
use crate::outcome::Outcome;

/// Runs `work` inside the stream (in `span`), yielding its events as they
/// happen and then its commit (or its error). The work is polled only while
/// the stream is: dropping the stream drops the work at its next await point.
pub(super) fn events<'a, F, Fut>(span: tracing::Span, work: F) -> EventStream<'a>
where
    F: FnOnce(Emitter) -> Fut + Send + 'a,
    Fut: Future<Output = Result<Outcome, Error>> + Send + 'a,
{
    Box::pin(async_stream::stream! {
        let (emitter, mut received) = Emitter::channel();
        let work = work(emitter).instrument(span);
        tokio::pin!(work);
        let result = loop {
            tokio::select! {
                biased;
                Some((event, ack)) = received.recv() => {
                    yield Ok(event);
                    // Resumed: the consumer took the event and asks for more.
                    if let Some(ack) = ack {
                        let _ = ack.send(());
                    }
                }
                result = &mut work => break result,
            }
        };
        while let Ok((event, _)) = received.try_recv() {
            yield Ok(event);
        }
        match result {
            Ok(outcome) => {
                let conversation_version = outcome.conversation_version;
                yield Ok(Event::ConversationCommitted {
                    outcome: Box::new(outcome),
                    conversation_version,
                });
            }
            Err(error) => yield Err(error),
        }
    })
}

/// An event and, for events sent between durable steps, the acknowledgement
/// the run waits for.
pub(super) type Envelope = (Event, Option<tokio::sync::oneshot::Sender<()>>);

/// Where the loop sends events; a no-op for `run`.
#[derive(Clone, Default)]
pub(crate) struct Emitter(Option<tokio::sync::mpsc::UnboundedSender<Envelope>>);

impl Emitter {
    pub(crate) fn channel() -> (Self, tokio::sync::mpsc::UnboundedReceiver<Envelope>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (Self(Some(tx)), rx)
    }

    pub(crate) fn is_active(&self) -> bool {
        self.0.is_some()
    }

    /// Sends an event and waits until the consumer has taken it. The loop
    /// emits only between durable steps, so a slow consumer never keeps the
    /// run inside a store call (holding a connection), and a consumer that
    /// stops polling freezes the run exactly after the event it last saw.
    pub(crate) async fn emit(&self, event: Event) {
        if let Some(tx) = &self.0 {
            let (ack, acked) = tokio::sync::oneshot::channel();
            if tx.send((event, Some(ack))).is_ok() {
                // An error only means the stream was dropped.
                let _ = acked.await;
            }
        }
    }

    /// Sends an event without waiting: for text deltas, which arrive from
    /// inside a model call, where no connection is held.
    pub(crate) fn emit_now(&self, event: Event) {
        if let Some(tx) = &self.0 {
            let _ = tx.send((event, None));
        }
    }
}
