//! Turning an execution into a stream of events.

use std::future::Future;

use futures_core::Stream;

use super::Outcome;
use crate::events::{Emitter, Event};
use crate::Error;

/// Runs `work` inside the stream, yielding its events as they happen and
/// then its commit (or its error). The work is polled only while the stream
/// is: dropping the stream drops the work at its next await point.
pub(super) fn events<'a, F, Fut>(work: F) -> impl Stream<Item = Result<Event, Error>> + Send + 'a
where
    F: FnOnce(Emitter) -> Fut + Send + 'a,
    Fut: Future<Output = Result<Outcome, Error>> + Send + 'a,
{
    async_stream::stream! {
        let (emitter, mut received) = Emitter::channel();
        let work = work(emitter);
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
    }
}
