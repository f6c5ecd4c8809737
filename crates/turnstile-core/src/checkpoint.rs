//! The loop checkpoint: the row saved after every turn.

use serde::{Deserialize, Serialize};

use crate::ids::RunId;
use crate::message::{Usage, VerificationReport};
use crate::stored_name::stored_names;

/// Where a run stood when its checkpoint was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointPhase {
    /// Write-ahead record of a turn: the model may have been called after it.
    /// Values are as of the turn's start.
    TurnInFlight,
    /// The model's answer for the turn is recorded (its usage included); its
    /// tool calls may have run after it.
    ToolsInFlight,
    /// The run stopped on purpose (budget, deadline, cancellation, model
    /// error) before or during the turn's model call: no answer was recorded
    /// and no tool ran. Resuming calls the model again; nothing is ambiguous.
    ModelPending,
    /// The run stopped on purpose with the turn's answer recorded and no
    /// unanswered tool call started. Resuming runs the unanswered calls.
    ToolsPending,
    /// The turn is complete; the next turn may start.
    Ready,
    /// The turn's answer was committed to the transcript.
    Completed,
}

stored_names!(CheckpointPhase {
    TurnInFlight => "turn_in_flight",
    ToolsInFlight => "tools_in_flight",
    ModelPending => "model_pending",
    ToolsPending => "tools_pending",
    Ready => "ready",
    Completed => "completed",
});

impl CheckpointPhase {
    /// Whether the turn's model answer is recorded and its tool round open.
    pub fn has_recorded_answer(self) -> bool {
        matches!(
            self,
            CheckpointPhase::ToolsInFlight | CheckpointPhase::ToolsPending
        )
    }

    /// Whether work may have happened after this checkpoint that it does not
    /// record: the run died (or was replaced) mid-turn.
    pub fn is_in_flight(self) -> bool {
        matches!(
            self,
            CheckpointPhase::TurnInFlight | CheckpointPhase::ToolsInFlight
        )
    }
}

/// The state of a run after (or, in flight, at the start of) one turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopCheckpoint {
    /// The run that saved it.
    pub run_id: RunId,
    /// Turn number, counted across resumes (turn 1 is the first).
    pub turn: u32,
    /// Where the turn stands: settled, or with a call in flight.
    pub phase: CheckpointPhase,
    /// Cumulative usage of the request, across resumed runs.
    pub usage: Usage,
    /// Cumulative number of tool calls answered.
    pub tool_calls_count: u64,
    /// Every verifier report of the request so far.
    pub verification_reports: Vec<VerificationReport>,
    /// How many messages the request has produced so far (the user input
    /// included): its position in the pending transcript.
    pub message_count: u64,
    /// Unix milliseconds.
    pub created_at: i64,
}

impl LoopCheckpoint {
    /// How many of the request's pending messages the checkpoint stands
    /// for: its `message_count`, and the model answer recorded past it
    /// while the turn's tool round is open.
    pub fn messages_recorded(&self) -> u64 {
        self.message_count
            .saturating_add(u64::from(self.phase.has_recorded_answer()))
    }
}
