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

/// Where the loop sends events; a no-op for `run`.
#[derive(Clone, Default)]
pub(crate) struct Emitter(Option<tokio::sync::mpsc::UnboundedSender<Event>>);

impl Emitter {
    pub(crate) fn channel() -> (Self, tokio::sync::mpsc::UnboundedReceiver<Event>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (Self(Some(tx)), rx)
    }

    pub(crate) fn is_active(&self) -> bool {
        self.0.is_some()
    }

    pub(crate) fn emit(&self, event: Event) {
        if let Some(tx) = &self.0 {
            // A closed receiver means the stream was dropped; the run stops
            // at its next await point anyway.
            let _ = tx.send(event);
        }
    }
}
