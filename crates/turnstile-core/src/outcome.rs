//! What a committed request returns, fresh or replayed.

use serde::{Deserialize, Serialize};

use crate::ids::{RequestId, RunId};
use crate::message::{Message, Usage, VerificationReport};
use crate::store::StoredOutcome;

/// The result of a committed request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// The committed request.
    pub request_id: RequestId,
    /// The run that committed.
    pub run_id: RunId,
    /// The text of the last assistant message: the answer.
    pub final_text: String,
    /// Every message the request added to the transcript, its input first.
    pub messages: Vec<Message>,
    /// Cumulative over all runs of the request, summary passes included.
    pub usage: Usage,
    /// Turns of the request: its summary passes, then its model turns.
    pub turns: u32,
    /// Tool calls answered, over all runs of the request.
    pub tool_calls: u64,
    /// Every verifier report of the request, in order.
    pub verification_reports: Vec<VerificationReport>,
    /// The conversation version this commit produced.
    pub conversation_version: u64,
    /// True when this is the stored answer of an earlier commit: no model or
    /// tool work was done.
    pub replayed: bool,
}

impl Outcome {
    /// `messages` are the request's committed messages, its answer last.
    pub(crate) fn from_stored(
        request_id: RequestId,
        stored: StoredOutcome,
        messages: Vec<Message>,
        replayed: bool,
    ) -> Self {
        let final_text = messages
            .last()
            .map(|m| m.text().into_owned())
            .unwrap_or_default();
        Self {
            request_id,
            run_id: stored.run_id,
            final_text,
            messages,
            usage: stored.usage,
            turns: stored.turns,
            tool_calls: stored.tool_calls,
            verification_reports: stored.verification_reports,
            conversation_version: stored.conversation_version,
            replayed,
        }
    }
}
