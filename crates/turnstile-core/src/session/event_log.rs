//! Reading and following a conversation's event log.

use std::pin::Pin;
use std::time::Duration;

use futures_core::Stream;
use tokio::sync::watch;

use super::AgentSession;
use crate::error::Error;
use crate::store::LoggedEvent;

/// A followed event log: see [`AgentSession::follow_events`].
pub type LoggedEvents = Pin<Box<dyn Stream<Item = Result<LoggedEvent, Error>> + Send>>;

/// Events read per query while following.
const FOLLOW_PAGE: u32 = 256;

impl AgentSession {
    /// The events of this conversation's log numbered after `after`, oldest
    /// first, at most `limit`: each durable step of its requests, written
    /// in the step's own transaction (see
    /// [`LoggedStep`](crate::store::LoggedStep)). A client that saw the
    /// events up to `n` reads on with `after = n` and misses none.
    ///
    /// # Errors
    /// [`Error::NotFound`] or [`Error::NamespaceMismatch`] for a conversation
    /// that does not exist in this session's namespace.
    pub async fn events_after(&self, after: u64, limit: u32) -> Result<Vec<LoggedEvent>, Error> {
        self.store
            .conversation(&self.namespace, self.conversation_id)
            .await?;
        self.store
            .events_after(self.conversation_id, after, limit)
            .await
    }

    /// Every event of this conversation's log after `after`, then each new
    /// one once its step commits, in any process sharing the store: the
    /// log is read again every `poll` while nothing new is there. Ends at
    /// the first error, [`Error::Deleted`] once the conversation is
    /// deleted. The store is read only while the stream is polled.
    pub fn follow_events(&self, after: u64, poll: Duration) -> LoggedEvents {
        self.follow(after, poll, None)
    }

    /// [`follow_events`](Self::follow_events), reading the log again at
    /// once whenever `wake` is sent to, not only every `poll`: a process
    /// that knows when its own runs write a step (as `turnstile serve`
    /// does) tells its followers at once, and the poll still finds the
    /// steps of other processes. A wake sent while the log is being read
    /// is not lost; once every sender is gone, only the poll is left.
    pub fn follow_events_woken(
        &self,
        after: u64,
        poll: Duration,
        wake: watch::Receiver<()>,
    ) -> LoggedEvents {
        self.follow(after, poll, Some(wake))
    }

    fn follow(
        &self,
        after: u64,
        poll: Duration,
        mut wake: Option<watch::Receiver<()>>,
    ) -> LoggedEvents {
        let store = self.store.clone();
        let namespace = self.namespace.clone();
        let conversation_id = self.conversation_id;
        Box::pin(async_stream::try_stream! {
            store.conversation(&namespace, conversation_id).await?;
            let mut after = after;
            loop {
                // Seen before the read: a wake during it is waited for
                // below, so the step it tells of is read then.
                if let Some(wake) = &mut wake {
                    wake.mark_unchanged();
                }
                let page = store.events_after(conversation_id, after, FOLLOW_PAGE).await?;
                let full = page.len() == FOLLOW_PAGE as usize;
                for event in page {
                    after = event.seq;
                    yield event;
                }
                if full {
                    continue;
                }
                let senders_gone = match &mut wake {
                    Some(wake) => tokio::select! {
                        () = tokio::time::sleep(poll) => false,
                        woken = wake.changed() => woken.is_err(),
                    },
                    None => {
                        tokio::time::sleep(poll).await;
                        false
                    }
                };
                if senders_gone {
                    wake = None;
                }
            }
        })
    }
}
