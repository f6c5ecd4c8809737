//! Events of a streamed execution.

use crate::ids::{RequestId, Revision, RunId};
use crate::message::Usage;
use crate::session::Outcome;

/// What happened, in order. `ConversationCommitted` is last and is sent only
/// once the commit and the admission release are durable; an error ends the
/// stream instead.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Event {
    RunStarted {
        run_id: RunId,
        request_id: RequestId,
        resumed_from: Option<RunId>,
        revision: Revision,
    },
    /// A summary pass is recorded and its summary model is being called
    /// (before the request's first turn). `turn` is the request's turn the
    /// pass counts as.
    SummaryStarted {
        turn: u32,
        from_seq: u64,
        through_seq: u64,
    },
    /// The pass's summary is committed: it covers every entry up to
    /// `through_seq`.
    SummaryCommitted {
        turn: u32,
        summary_id: i64,
        through_seq: u64,
        /// Usage of this pass alone.
        usage: Usage,
    },
    TurnStarted {
        turn: u32,
    },
    TextDelta {
        turn: u32,
        text: String,
    },
    ModelResponded {
        turn: u32,
        /// Usage of this model call alone.
        usage: Usage,
        tool_calls: usize,
    },
    ToolStarted {
        turn: u32,
        call_id: String,
        name: String,
    },
    ToolFinished {
        turn: u32,
        call_id: String,
        name: String,
        is_error: bool,
        /// The result came from the journal of an earlier run: the tool was
        /// not executed again.
        reused: bool,
    },
    CheckpointSaved {
        turn: u32,
        revision: Revision,
    },
    ConversationCommitted {
        outcome: Box<Outcome>,
        conversation_version: u64,
    },
}

/// An event and, for events sent between durable steps, the acknowledgement
/// the run waits for.
pub(crate) type Envelope = (Event, Option<tokio::sync::oneshot::Sender<()>>);

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
