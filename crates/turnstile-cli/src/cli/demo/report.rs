//! What the demo did, as numbers: printed as the closing summary, or as
//! JSON with `--json`.

use std::io::Write;
use std::path::Path;

use serde::Serialize;

use crate::cli::exit::CliError;
use crate::cli::output::{self, Style};
use turnstile::checkpoint::CheckpointPhase;
use turnstile::ids::{ConversationId, RequestId, RunId};
use turnstile::message::Usage;

#[derive(Debug, Serialize)]
pub struct DemoReport {
    /// The file, or the URL without its password.
    pub database: String,
    /// On PostgreSQL: `database_bytes` are the tables' and there is no log
    /// file.
    #[serde(skip)]
    pub on_server: bool,
    /// The database file alone.
    pub database_bytes: u64,
    /// Its write-ahead log (folded into the file at checkpoints).
    pub wal_bytes: u64,
    pub namespace: String,
    pub conversation_id: ConversationId,
    pub first: FirstRequest,
    pub recovered: RecoveredRequest,
    pub replay: Replay,
    pub totals: Totals,
}

#[derive(Debug, Serialize)]
pub struct FirstRequest {
    pub request_id: RequestId,
    pub run_id: RunId,
    pub turns: u32,
    pub tool_calls: u64,
    pub usage: Usage,
    pub model_calls: u64,
}

#[derive(Debug, Serialize)]
pub struct RecoveredRequest {
    pub request_id: RequestId,
    pub worker_pid: u32,
    /// 9 (SIGKILL) where the platform reports it.
    pub worker_signal: Option<i32>,
    pub killed_run_id: RunId,
    pub killed_after_turn: u32,
    /// The admission revision the recovery claimed from.
    pub revision_at_kill: u64,
    pub checkpoint_turn: u32,
    pub checkpoint_phase: CheckpointPhase,
    pub tool_calls_at_kill: u64,
    pub recovery_usage: Usage,
    pub model_calls_in_worker: u64,
    pub run_id: RunId,
    pub resumed_from: Option<RunId>,
    pub turns: u32,
    pub tool_calls: u64,
    pub usage: Usage,
    pub model_calls_in_recovery: u64,
    /// Answers of the recovered request holding the killed run's signed
    /// reasoning (its model refuses a call whose earlier answers did not
    /// come back exactly, so the recovery sent it back).
    pub signed_reasoning_answers: usize,
}

#[derive(Debug, Serialize)]
pub struct Replay {
    pub request_id: RequestId,
    pub replayed: bool,
    pub latency_ms: f64,
    pub model_calls_before: u64,
    pub model_calls_after: u64,
}

#[derive(Debug, Serialize)]
pub struct Totals {
    pub requests_committed: u32,
    pub turns: u32,
    pub tool_calls: u64,
    pub usage: Usage,
    pub model_calls: u64,
    pub runs: u32,
    pub checkpoint_rows: u64,
    pub transcript_messages: u64,
}

/// The sizes of a SQLite database file and of its write-ahead log.
pub fn database_bytes(db: &Path) -> (u64, u64) {
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    let size = |p: &std::ffi::OsStr| std::fs::metadata(p).map_or(0, |m| m.len());
    (size(db.as_os_str()), size(&wal))
}

impl DemoReport {
    /// The closing summary.
    pub fn print(&self, out: &mut dyn Write, style: Style) -> Result<(), CliError> {
        let t = &self.totals;
        let kib = |bytes: u64| (bytes as f64 / 1024.0).ceil();
        output::table(
            out,
            "   ",
            &[
                ("requests", format!("{} committed", t.requests_committed)),
                ("turns", t.turns.to_string()),
                ("tool calls", t.tool_calls.to_string()),
                ("usage", output::usage(&t.usage)),
                (
                    "model calls",
                    format!(
                        "{} ({} + {} before the kill + {} after it; the replay made none)",
                        t.model_calls,
                        self.first.model_calls,
                        self.recovered.model_calls_in_worker,
                        self.recovered.model_calls_in_recovery
                    ),
                ),
                ("runs", format!("{} (one of them killed)", t.runs)),
                ("checkpoints", format!("{} rows written", t.checkpoint_rows)),
                (
                    "transcript",
                    format!("{} committed messages", t.transcript_messages),
                ),
                (
                    "database",
                    if self.on_server {
                        format!(
                            "{} · {} KiB in tables",
                            self.database,
                            kib(self.database_bytes)
                        )
                    } else {
                        format!(
                            "{} · {} KiB, and {} KiB of write-ahead log that closing \
                             folds into it (the file alone is complete after exit)",
                            self.database,
                            kib(self.database_bytes),
                            kib(self.wal_bytes)
                        )
                    },
                ),
            ],
        )?;
        writeln!(out)?;
        writeln!(
            out,
            "   {}",
            style.dim(&format!(
                "conversation {} · namespace {} · run the demo again for a new one",
                self.conversation_id, self.namespace
            ))
        )?;
        Ok(())
    }
}
