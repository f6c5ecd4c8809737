//! The event log's rows, as every backend selects them.

use crate::error::Error;
use crate::ids::{RequestId, RunId};
use crate::store::{LoggedEvent, LoggedStep};

use super::Row;

/// An event row as every backend selects it: `kind` is the step's code,
/// the other columns are set as that kind needs them.
#[derive(Clone, Debug)]
pub struct EventRow {
    /// The event's number in its conversation's log.
    pub seq: i64,
    /// Unix milliseconds.
    pub at: i64,
    /// The step's code: 0 admitted, 1 run started, 2 answered, 3 tool
    /// finished, 4 approval requested, 5 approval decided, 6 stopped,
    /// 7 committed, 8 abandoned, 9 checkpoint saved.
    pub kind: i64,
    /// The request's id, 16 bytes.
    pub request_id: Vec<u8>,
    /// `None` where the run is the request's first (its id is the
    /// request's), or the kind names none.
    pub run_id: Option<Vec<u8>>,
    /// The tool call's turn, for the kinds about a tool call; the turn
    /// that ended, for a saved checkpoint.
    pub turn: Option<i64>,
    /// The transcript entry of an answer, or of an admitted request's
    /// input.
    pub entry_seq: Option<i64>,
    /// The tool call's id, for the kinds about a tool call.
    pub call_id: Option<String>,
}

impl EventRow {
    /// The event this row stores; [`Error::Corrupt`] for a kind or a column
    /// no event has.
    pub fn decode(
        self,
        conversation: &(dyn std::fmt::Display + Sync),
    ) -> Result<LoggedEvent, Error> {
        let key = format!("{conversation} #{}", self.seq);
        let row = Row {
            table: "events",
            key: &key,
        };
        let request_id: RequestId = row.id("request_id", &self.request_id)?;
        let run_id = || -> Result<RunId, Error> {
            match &self.run_id {
                Some(bytes) => row.id("run_id", bytes),
                None => Ok(RunId::first_of(request_id)),
            }
        };
        let turn = || {
            row.u32(
                "turn",
                self.turn.ok_or_else(|| row.corrupt("turn is missing"))?,
            )
        };
        let call_id = || {
            self.call_id
                .clone()
                .ok_or_else(|| row.corrupt("call_id is missing"))
        };
        let entry_seq = || {
            row.u64(
                "entry_seq",
                self.entry_seq
                    .ok_or_else(|| row.corrupt("entry_seq is missing"))?,
            )
        };
        let step = match self.kind {
            0 => LoggedStep::Admitted {
                run_id: run_id()?,
                entry_seq: entry_seq()?,
            },
            1 => LoggedStep::RunStarted { run_id: run_id()? },
            2 => LoggedStep::Answered {
                entry_seq: entry_seq()?,
            },
            3 => LoggedStep::ToolFinished {
                turn: turn()?,
                call_id: call_id()?,
            },
            4 => LoggedStep::ApprovalRequested {
                turn: turn()?,
                call_id: call_id()?,
            },
            5 => LoggedStep::ApprovalDecided {
                turn: turn()?,
                call_id: call_id()?,
            },
            6 => LoggedStep::Stopped { run_id: run_id()? },
            7 => LoggedStep::Committed { run_id: run_id()? },
            8 => LoggedStep::Abandoned,
            9 => LoggedStep::CheckpointSaved {
                run_id: run_id()?,
                turn: turn()?,
            },
            other => return Err(row.corrupt(format!("kind {other} is no event's"))),
        };
        Ok(LoggedEvent {
            seq: row.u64("seq", self.seq)?,
            at: self.at,
            request_id,
            step,
        })
    }
}
