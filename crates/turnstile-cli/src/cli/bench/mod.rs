//! `turnstile bench`: a fixed workload through the public API (SqliteStore,
//! AgentSession, a zero-latency ScriptedModel) on a fresh database, and what
//! it cost: per-turn latency, turns per second, storage per message byte,
//! latest-checkpoint and replay reads. With `--db postgres://…` the same
//! workload runs on the server at concurrency 1, 8 and 64, against a
//! bare-commit baseline measured there in the same run (`postgres`).
//!
//! - `location`: where the database lives (a removed temp dir, or a new
//!   `--db` file that is kept);
//! - `text`: varied message text;
//! - `workload`: the conversations, driven concurrently;
//! - `reads`: the sampled read latencies;
//! - `storage`: pages in use after a WAL checkpoint;
//! - `stats` and `report`: the figures and their rendering.

mod baseline;
mod location;
mod postgres;
mod reads;
mod report;
mod stats;
mod storage;
mod text;
mod workload;

use std::io::Write;
use std::sync::Arc;

use clap::{Args, ValueEnum};

use self::location::Location;
use self::report::{BenchReport, WorkloadParams};
use self::stats::Latency;
use self::workload::Workload;
use super::db::DbLocation;
use super::exit::CliError;
use super::output::{self, Style};
use turnstile::session::MAX_INPUT_BYTES;
use turnstile::store::Store;
use turnstile::{Durability, SqliteOptions, SqliteStore};

/// The largest `--message-bytes`: the largest input a request accepts.
const MAX_MESSAGE_BYTES: i64 = MAX_INPUT_BYTES as i64;
/// Caps on the whole workload, so a typo cannot fill the disk or memory
/// (one latency is kept per turn).
const MAX_TURNS: u64 = 1_000_000;
const MAX_MESSAGE_TEXT_BYTES: u64 = 4 << 30;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Conversations in the workload.
    #[arg(long, value_name = "N", default_value_t = 200,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub conversations: u32,
    /// Turns per conversation. A turn is one request: a user input answered
    /// by a scripted final answer (two messages).
    #[arg(long, value_name = "T", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub turns: u32,
    /// Bytes of each message's text (input and answer alike).
    #[arg(long, value_name = "B", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(1..=MAX_MESSAGE_BYTES))]
    pub message_bytes: u32,
    /// `full` (synchronous=FULL, survives power loss; the default) or
    /// `normal` (synchronous=NORMAL, survives a process crash). SQLite only:
    /// on PostgreSQL the server's settings decide, and are reported.
    #[arg(long, value_enum)]
    pub durability: Option<BenchDurability>,
    /// Conversations driven at the same time, each by its own task (at most
    /// --conversations). Default 1. SQLite only: on PostgreSQL the bench
    /// runs at 1, 8 and 64.
    #[arg(long, value_name = "C",
          value_parser = clap::value_parser!(u32).range(1..=1_024))]
    pub concurrency: Option<u32>,
    /// Write to this new file and keep it (an existing file is refused).
    /// Default: a fresh temp directory, removed afterwards. Or a PostgreSQL
    /// URL: each workload then runs in a new schema of that database
    /// (`turnstile_bench_…`), dropped afterwards.
    #[arg(long, value_name = "PATH|URL", conflicts_with = "in_memory")]
    pub db: Option<DbLocation>,
    /// Run the workload on `SqliteStore::in_memory()` (the test-harness
    /// store), against a baseline in memory too; storage is what the
    /// in-memory database holds.
    #[arg(long)]
    pub in_memory: bool,
}

/// `--durability`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BenchDurability {
    Full,
    Normal,
}

impl BenchDurability {
    fn store(self) -> Durability {
        match self {
            BenchDurability::Full => Durability::Full,
            BenchDurability::Normal => Durability::Normal,
        }
    }

    fn name(self) -> &'static str {
        match self {
            BenchDurability::Full => "full",
            BenchDurability::Normal => "normal",
        }
    }
}

pub(super) async fn run(
    args: BenchArgs,
    out: &mut dyn Write,
    style: Style,
    json: bool,
) -> Result<(), CliError> {
    let params = validate(&args)?;
    let stop = super::interrupt::stopping();
    let location = match args.db {
        Some(DbLocation::Postgres(ref url)) => {
            return postgres::run(&args, params, url, stop, out, style, json).await
        }
        Some(DbLocation::File(path)) => Location::new_file(path)?,
        None if args.in_memory => Location::memory(),
        None => Location::temp()?,
    };
    if !json {
        report::heading(out, style, &params)?;
    }
    // Ctrl-C, SIGTERM or SIGHUP stops the bench: dropping the work aborts
    // its tasks, and the temp directory is removed on the way out.
    let durability = args.durability.unwrap_or(BenchDurability::Full);
    let figures = tokio::select! {
        figures = measure(&params, durability, &location) => figures?,
        () = stop => {
            return Err(CliError::Failed("interrupted: the bench stopped".into()));
        }
    };
    let report = BenchReport::new(params, figures, &location);
    // The temp directory is gone before the report says so.
    drop(location);
    if json {
        output::json(out, &report)
    } else {
        report.print(out, style)
    }
}

/// Refuses workloads past the caps; clap checked each argument alone.
fn validate(args: &BenchArgs) -> Result<WorkloadParams, CliError> {
    let turns = u64::from(args.conversations) * u64::from(args.turns);
    if turns > MAX_TURNS {
        return Err(CliError::Usage(format!(
            "--conversations × --turns is {turns} turns; at most {MAX_TURNS}"
        )));
    }
    let text_bytes = turns * 2 * u64::from(args.message_bytes);
    if text_bytes > MAX_MESSAGE_TEXT_BYTES {
        return Err(CliError::Usage(format!(
            "the workload writes {text_bytes} bytes of message text; at most {MAX_MESSAGE_TEXT_BYTES}"
        )));
    }
    let concurrency = args.concurrency.unwrap_or(1);
    if concurrency > args.conversations {
        return Err(CliError::Usage(format!(
            "--concurrency {} exceeds --conversations {}: one task drives one conversation at a time",
            concurrency, args.conversations
        )));
    }
    Ok(WorkloadParams {
        conversations: args.conversations,
        turns_per_conversation: args.turns,
        message_bytes: args.message_bytes,
        durability: args.durability.unwrap_or(BenchDurability::Full).name(),
        concurrency,
    })
}

/// Everything the bench measured, before rendering.
pub(super) struct Figures {
    written: workload::Written,
    latest_checkpoint: Latency,
    replay: Latency,
    storage: report::Storage,
    baseline: baseline::Baseline,
}

/// Samples of each baseline floor: the workload's turn count, within
/// bounds that keep it quick and its percentiles meaningful.
fn baseline_samples(params: &WorkloadParams) -> usize {
    let turns = u64::from(params.conversations) * u64::from(params.turns_per_conversation);
    turns.clamp(100, 2_000) as usize
}

async fn measure(
    params: &WorkloadParams,
    durability: BenchDurability,
    location: &Location,
) -> Result<Figures, CliError> {
    // The floor first, in its own temp directory (or memory), so the
    // workload's file holds only the workload.
    let scratch = match location.in_memory() {
        true => None,
        false => Some(
            tempfile::Builder::new()
                .prefix("turnstile-bench-baseline-")
                .tempdir()
                .map_err(CliError::io("create the baseline's temp directory"))?,
        ),
    };
    let baseline = baseline::measure(
        scratch.as_ref().map(tempfile::TempDir::path),
        durability,
        params.message_bytes as usize,
        baseline_samples(params),
    )
    .await?;
    drop(scratch);
    let store = match location.in_memory() {
        true => SqliteStore::in_memory().await?,
        false => {
            let options = SqliteOptions {
                durability: durability.store(),
                ..SqliteOptions::default()
            };
            SqliteStore::open_with(location.db(), options).await?
        }
    };
    let shared: Arc<dyn Store> = Arc::new(store.clone());
    let written = Workload::from(params).run(shared.clone()).await?;
    let latest_checkpoint = reads::latest_checkpoints(shared.as_ref(), &written.samples).await?;
    let replay = reads::replays(&shared, &written.samples, params.message_bytes).await?;
    drop(shared);
    let storage = match location.in_memory() {
        true => storage::in_memory(&store, written.message_text_bytes).await?,
        false => storage::measure(&store, location.db(), written.message_text_bytes).await?,
    };
    Ok(Figures {
        written,
        latest_checkpoint,
        replay,
        storage,
        baseline,
    })
}
