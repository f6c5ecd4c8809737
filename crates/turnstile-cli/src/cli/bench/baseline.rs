//! The floors the SQLite workload is measured against, in the same run on
//! the same kind of database (a WAL file with the workload's durability, or
//! memory): a bare transaction writing the rows of a one-turn request
//! (`BEGIN IMMEDIATE`, two message inserts, one update, `COMMIT`) and bare
//! single-row commits, both on one plain sqlx connection with no store
//! around it (measured by `turnstile_bench::baseline::sqlite`).

use std::time::Duration;

use serde::Serialize;
use turnstile_bench::baseline::sqlite;

use super::args::BenchDurability;
use super::stats::Latency;
use super::steps::Steps;
use crate::cli::exit::CliError;

#[derive(Debug, Serialize)]
pub(super) struct Baseline {
    pub what: &'static str,
    /// p50 of the bare one-turn transaction.
    pub bare_turn_p50_ms: f64,
    /// Single-row commits per second on one connection.
    pub bare_commit_per_second: f64,
    pub bare_turn: Latency,
    pub bare_commit: Latency,
    /// The SQLite the floors and the store ran on.
    pub sqlite_build: sqlite::SqliteBuild,
}

/// The run's figures over its baseline.
#[derive(Debug, Serialize)]
pub(super) struct Ratios {
    /// The workload's one-turn request p50 ÷ the bare one-turn transaction's.
    pub turn_p50_vs_bare_turn: f64,
    /// A request's first durable moment alone (`steps.claim`) ÷ the same.
    pub claim_p50_vs_bare_turn: f64,
    /// Its second (`steps.commit`) ÷ the same.
    pub commit_p50_vs_bare_turn: f64,
    /// The workload's turns per second ÷ bare single-row commits per second.
    pub turns_per_second_vs_bare_commits: f64,
}

impl Ratios {
    pub(super) fn of(
        turn_p50_ms: f64,
        turns_per_second: f64,
        steps: &Steps,
        baseline: &Baseline,
    ) -> Self {
        let bare_turn = baseline.bare_turn_p50_ms.max(f64::MIN_POSITIVE);
        Self {
            turn_p50_vs_bare_turn: turn_p50_ms / bare_turn,
            claim_p50_vs_bare_turn: steps.claim.p50_ms / bare_turn,
            commit_p50_vs_bare_turn: steps.commit.p50_ms / bare_turn,
            turns_per_second_vs_bare_commits: turns_per_second
                / baseline.bare_commit_per_second.max(f64::MIN_POSITIVE),
        }
    }
}

/// Measures both floors, `samples` of each, on a new database in `dir`
/// (`None`: in memory).
pub(super) async fn measure(
    dir: Option<&std::path::Path>,
    durability: BenchDurability,
    message_bytes: usize,
    samples: usize,
) -> Result<Baseline, CliError> {
    let floors = sqlite::measure(dir, durability.store(), message_bytes, samples)
        .await
        .map_err(|e| CliError::Failed(e.to_string()))?;
    let commits = floors.bare_commits;
    let bare_turn = Latency::of(floors.bare_turns);
    Ok(Baseline {
        what: sqlite::WHAT,
        bare_turn_p50_ms: bare_turn.p50_ms,
        bare_commit_per_second: samples as f64
            / commits.wall.max(Duration::from_nanos(1)).as_secs_f64(),
        bare_turn,
        bare_commit: Latency::of(commits.latencies),
        sqlite_build: floors.build,
    })
}
