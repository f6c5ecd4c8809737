//! `turnstile bench`: a fixed workload through the public API (SqliteStore,
//! AgentSession, a zero-latency ScriptedModel) on a fresh database, and what
//! it cost: per-turn latency, turns per second, storage per message byte,
//! latest-checkpoint and replay reads, and a one-turn request's store calls
//! timed alone. With `--db postgres://…` the same workload runs on the
//! server at concurrency 1, 8 and 64, against a bare-commit baseline
//! measured there in the same run (`postgres`).
//!
//! - `location`: where the database lives (a removed temp dir, or a new
//!   `--db` file that is kept);
//! - `text`: varied message text;
//! - `workload`: the conversations, driven concurrently;
//! - `reads`: the sampled read latencies;
//! - `steps`: a one-turn request's store calls, timed alone;
//! - `storage`: pages in use after a WAL checkpoint;
//! - `stats` and `report`: the figures and their rendering.

mod args;
mod baseline;
mod location;
mod postgres;
mod reads;
mod report;
mod stats;
mod steps;
mod storage;
mod text;
mod workload;

use std::io::Write;
use std::sync::Arc;

pub use self::args::BenchArgs;
use self::args::{BenchDurability, MAX_MESSAGE_TEXT_BYTES, MAX_TURNS};
use self::location::Location;
use self::report::{BenchReport, WorkloadParams};
use self::stats::Latency;
use self::workload::Workload;
use super::db::DbLocation;
use super::exit::CliError;
use super::output::{self, Style};
use turnstile::store::Store;
use turnstile::{SqliteOptions, SqliteStore};

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
    let requests = turns + u64::from(steps::timed_requests(turns));
    let text_bytes = requests * 2 * u64::from(args.message_bytes);
    if text_bytes > MAX_MESSAGE_TEXT_BYTES {
        return Err(CliError::Usage(format!(
            "the workload and its timed steps write {text_bytes} bytes of message text; \
             at most {MAX_MESSAGE_TEXT_BYTES}"
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
        image_bytes: args.image_bytes,
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
    steps: steps::Steps,
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
    let replay = reads::replays(&shared, &written.samples, params).await?;
    let steps = steps::measure(shared.clone(), params).await?;
    drop(shared);
    // Every message and image stored, the steps' requests' included.
    let (text_bytes, image_bytes) = written.raw_bytes();
    let raw = (
        text_bytes + steps.message_text_bytes,
        image_bytes + steps.image_bytes,
    );
    let storage = match location.in_memory() {
        true => storage::in_memory(&store, raw).await?,
        false => storage::measure(&store, location.db(), raw).await?,
    };
    Ok(Figures {
        written,
        latest_checkpoint,
        replay,
        storage,
        steps,
        baseline,
    })
}
