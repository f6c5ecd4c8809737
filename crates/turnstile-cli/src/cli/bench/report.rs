//! The bench's figures: one JSON object with `--json`, else an aligned
//! table that says what each figure counts.

use std::io::Write;

use serde::Serialize;

use super::location::Location;
use super::stats::Latency;
use super::Figures;
use crate::cli::exit::CliError;
use crate::cli::output::{self, Style};

/// The workload as asked for.
#[derive(Debug, Serialize)]
pub(super) struct WorkloadParams {
    pub conversations: u32,
    pub turns_per_conversation: u32,
    /// Bytes of text of each message; a turn is two messages.
    pub message_bytes: u32,
    /// Bytes of the image sent with each input; 0: none.
    pub image_bytes: u32,
    pub durability: &'static str,
    pub concurrency: u32,
}

/// Storage after the workload, with the log checkpointed into the file.
#[derive(Debug, Serialize)]
pub(super) struct Storage {
    /// The text of every input and answer (no ids, roles or JSON).
    pub message_text_bytes: u64,
    /// The bytes of every image sent with an input.
    pub image_bytes: u64,
    /// The backend's own figures (SQLite: `page_size`, `page_count`,
    /// `freelist_count`).
    #[serde(flatten)]
    pub details: std::collections::BTreeMap<String, serde_json::Value>,
    /// SQLite: `(page_count - freelist_count) * page_size`.
    pub bytes_in_use: u64,
    /// `bytes_in_use / (message_text_bytes + image_bytes)`.
    pub bytes_per_message_byte: f64,
    pub file_bytes: u64,
    pub wal_bytes: u64,
    /// False when a reader kept the checkpoint from emptying the log (the
    /// pages in use are counted either way).
    pub wal_checkpoint_complete: bool,
}

#[derive(Debug, Serialize)]
pub(super) struct BenchReport {
    workload: WorkloadParams,
    turns: u64,
    messages: u64,
    wall_seconds: f64,
    turns_per_second: f64,
    /// `AgentSession::run` of each request of the workload.
    turn_latency: Latency,
    /// `Store::latest_checkpoint` of sampled completed runs, one at a time.
    latest_checkpoint: Latency,
    /// `AgentSession::run` of sampled committed requests again, one at a time.
    replay: Latency,
    storage: Storage,
    /// A one-turn request's store calls, timed alone after the workload,
    /// in new conversations.
    steps: super::steps::Steps,
    /// The floors, measured in the same run on the same kind of database.
    baseline: super::baseline::Baseline,
    ratios: super::baseline::Ratios,
    /// The database file, when it was kept (`--db`).
    database: Option<String>,
    /// Timings of a debug build are not representative.
    debug_build: bool,
}

impl BenchReport {
    pub(super) fn new(workload: WorkloadParams, figures: Figures, location: &Location) -> Self {
        let turns = figures.written.latencies.len() as u64;
        let wall_seconds = figures.written.wall.as_secs_f64();
        let turns_per_second = turns as f64 / wall_seconds.max(f64::MIN_POSITIVE);
        let turn_latency = Latency::of(figures.written.latencies);
        Self {
            turns,
            messages: 2 * turns,
            wall_seconds,
            turns_per_second,
            ratios: super::baseline::Ratios::of(
                turn_latency.p50_ms,
                turns_per_second,
                &figures.steps,
                &figures.baseline,
            ),
            steps: figures.steps,
            baseline: figures.baseline,
            turn_latency,
            latest_checkpoint: figures.latest_checkpoint,
            replay: figures.replay,
            storage: figures.storage,
            database: location.kept().then(|| location.db().display().to_string()),
            debug_build: cfg!(debug_assertions),
            workload,
        }
    }

    pub(super) fn print(&self, out: &mut dyn Write, style: Style) -> Result<(), CliError> {
        let s = &self.storage;
        let mut file = format!("{} bytes + {} bytes of log", s.file_bytes, s.wal_bytes);
        if !s.wal_checkpoint_complete {
            file.push_str(" (a reader kept the checkpoint from emptying the log)");
        }
        let database = match (&self.database, self.storage.file_bytes) {
            (Some(path), _) => format!("{path} (kept)"),
            (None, 0) => "in memory".to_owned(),
            (None, _) => "a temp file, removed".to_owned(),
        };
        let [claim_read, claim, commit] = self
            .steps
            .described()
            .map(|(label, step, what)| (label, latency(step, &what)));
        output::table(
            out,
            "",
            &[
                (
                    "turns",
                    format!(
                        "{} in {:.2} s · {:.1} turns/s",
                        self.turns, self.wall_seconds, self.turns_per_second
                    ),
                ),
                (
                    "turn latency",
                    latency(
                        &self.turn_latency,
                        "session.run of one request: reads, admission, write-ahead, commit",
                    ),
                ),
                (
                    "latest checkpoint",
                    latency(
                        &self.latest_checkpoint,
                        &format!(
                            "Store::latest_checkpoint of {} completed runs, one at a time",
                            self.latest_checkpoint.samples
                        ),
                    ),
                ),
                (
                    "replay",
                    latency(
                        &self.replay,
                        &format!(
                            "session.run of {} committed requests again, one at a time",
                            self.replay.samples
                        ),
                    ),
                ),
                claim_read,
                claim,
                commit,
                (
                    "storage",
                    format!(
                        "{:.2} database bytes per message byte (text and images)",
                        s.bytes_per_message_byte
                    ),
                ),
                (
                    "  in use",
                    match (
                        s.details.get("page_count"),
                        s.details.get("freelist_count"),
                        s.details.get("page_size"),
                    ) {
                        (Some(pages), Some(free), Some(size)) => format!(
                            "{} bytes = ({pages} pages − {free} free) × {size} bytes, \
                             after a WAL checkpoint",
                            s.bytes_in_use
                        ),
                        _ => format!("{} bytes", s.bytes_in_use),
                    },
                ),
                (
                    "  message text",
                    format!(
                        "{} bytes in {} messages (inputs and answers, the timed steps' too; \
                         ids, roles and JSON not counted)",
                        s.message_text_bytes,
                        self.messages + 2 * u64::from(self.steps.requests)
                    ),
                ),
                (
                    "  images",
                    format!(
                        "{} bytes, one image with each input, the steps' too (stored once each)",
                        s.image_bytes
                    ),
                ),
                ("  file", file),
                (
                    "bare turn",
                    latency(
                        &self.baseline.bare_turn,
                        "BEGIN IMMEDIATE, 2 message inserts, 1 update, COMMIT on a plain connection",
                    ),
                ),
                (
                    "bare commit",
                    format!(
                        "{:.1} commits/s · {}",
                        self.baseline.bare_commit_per_second,
                        latency(&self.baseline.bare_commit, "single-row commits, one plain connection")
                    ),
                ),
                (
                    "ratios",
                    format!(
                        "turn p50 ÷ bare turn p50 = {:.2} (claim {:.2}, commit {:.2}) · \
                         turns/s ÷ bare commits/s = {:.2}",
                        self.ratios.turn_p50_vs_bare_turn,
                        self.ratios.claim_p50_vs_bare_turn,
                        self.ratios.commit_p50_vs_bare_turn,
                        self.ratios.turns_per_second_vs_bare_commits
                    ),
                ),
                ("database", database),
                ("sqlite", described(&self.baseline.sqlite_build)),
            ],
        )?;
        let build = &self.baseline.sqlite_build;
        if build.memory_statistics || build.shared_page_cache {
            writeln!(
                out,
                "{}",
                style.yellow(
                    "this SQLite takes process-wide mutexes that slow concurrent sessions: \
                     build it with the LIBSQLITE3_FLAGS of turnstile's .cargo/config.toml \
                     (README, \"SQLite's build\")"
                )
            )?;
        }
        if self.debug_build {
            writeln!(
                out,
                "{}",
                style.yellow("debug build: timings are not representative (build with --release)")
            )?;
        }
        Ok(())
    }
}

fn described(build: &turnstile_bench::baseline::sqlite::SqliteBuild) -> String {
    let statistics = match build.memory_statistics {
        true => "memory statistics on",
        false => "memory statistics off",
    };
    let cache = match build.shared_page_cache {
        true => "one page cache for all connections",
        false => "a page cache per connection",
    };
    format!("{} · {statistics} · {cache}", build.version)
}

/// The line printed before the workload starts, which can take a while.
pub(super) fn heading(
    out: &mut dyn Write,
    style: Style,
    w: &WorkloadParams,
) -> Result<(), CliError> {
    writeln!(
        out,
        "{} · {} conversations × {} turns · two {}-byte messages per turn · durability {} · concurrency {}",
        style.bold("turnstile bench"),
        w.conversations,
        w.turns_per_conversation,
        w.message_bytes,
        w.durability,
        w.concurrency
    )?;
    out.flush()?;
    Ok(())
}

/// `p50 1.234 ms · p99 5.678 ms   what was timed`.
fn latency(latency: &Latency, what: &str) -> String {
    format!(
        "p50 {} · p99 {}   {what}",
        millis(latency.p50_ms),
        millis(latency.p99_ms)
    )
}

fn millis(ms: f64) -> String {
    if ms < 1.0 {
        format!("{ms:.3} ms")
    } else {
        format!("{ms:.2} ms")
    }
}
