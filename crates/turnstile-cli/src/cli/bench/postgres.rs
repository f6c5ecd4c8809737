//! `turnstile bench --db postgres://…`: the workload on a PostgreSQL server
//! at concurrency 1, 8 and 64 (at most `--conversations`), each run in a new
//! schema of the database (`turnstile_bench_<uuid>`), and the floor it is
//! measured against, on the same server in the same run: a bare single-row
//! `INSERT` committing on its own (autocommit) through sqlx, on one
//! connection and on 64 at once (`turnstile_bench::baseline::postgres`).
//! Every schema the bench creates is dropped
//! (`DROP SCHEMA … CASCADE`) when it ends, on an error or a stop too.

use std::future::Future;
use std::io::Write;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use turnstile_bench::baseline::{self, postgres as floor};

use super::args::BenchArgs;
use super::reads;
use super::report::WorkloadParams;
use super::stats::Latency;
use super::steps::{self, Steps};
use super::text::{self, Role};
use super::workload::Workload;
use crate::cli::db::PgUrl;
use crate::cli::exit::CliError;
use crate::cli::output::{self, Style};
use crate::cli::postgres::location;
use turnstile::store::Store;
use turnstile::{PostgresOptions, PostgresStore, StoreAdmin};

/// The concurrency levels of the workload.
const LEVELS: [u32; 3] = [1, 8, 64];
/// Connections of the concurrent baseline.
const BASELINE_CONNECTIONS: u32 = 64;
/// Commits of the single-connection baseline: as many as the workload has
/// turns, within these bounds.
const BASELINE_COMMITS: (u64, u64) = (100, 2_000);

#[derive(Debug, Serialize)]
struct Report {
    backend: &'static str,
    /// `postgres://user@host:port/database`: never a password.
    database: String,
    server: Server,
    workload: Params,
    /// One per concurrency level, each in a schema of its own.
    runs: Vec<Run>,
    baseline: Baseline,
    ratios: Ratios,
    /// Every schema the bench created was dropped.
    schemas_dropped: bool,
    /// Timings of a debug build are not representative.
    debug_build: bool,
}

#[derive(Debug, Serialize)]
struct Server {
    version: String,
    synchronous_commit: String,
    fsync: String,
}

#[derive(Debug, Serialize)]
struct Params {
    conversations: u32,
    turns_per_conversation: u32,
    message_bytes: u32,
    concurrency: Vec<u32>,
}

#[derive(Debug, Serialize)]
struct Run {
    concurrency: u32,
    turns: u64,
    messages: u64,
    wall_seconds: f64,
    turns_per_second: f64,
    /// `AgentSession::run` of each request.
    turn_latency: Latency,
    /// `Store::latest_checkpoint` of sampled completed runs, one at a time.
    latest_checkpoint: Latency,
    /// `AgentSession::run` of sampled committed requests again, one at a time.
    replay: Latency,
    storage: Storage,
    /// A one-turn request's store calls, timed alone after the storage.
    steps: Steps,
}

#[derive(Debug, Serialize)]
struct Storage {
    /// The text of every input and answer.
    message_text_bytes: u64,
    /// The bytes of every image sent with an input.
    image_bytes: u64,
    /// The schema's tables, their indexes and TOAST included.
    bytes_in_use: u64,
    bytes_per_message_byte: f64,
}

#[derive(Debug, Serialize)]
struct Baseline {
    what: &'static str,
    /// Bytes of the text column of each row, as of each message.
    row_text_bytes: u32,
    single_connection: Commits,
    concurrent: Commits,
}

#[derive(Debug, Serialize)]
struct Commits {
    connections: u32,
    commits: u64,
    wall_seconds: f64,
    commits_per_second: f64,
    latency: Latency,
}

#[derive(Debug, Serialize)]
struct Ratios {
    /// Turn p50 at concurrency 1 ÷ bare commit p50 on one connection.
    turn_p50_over_commit_p50: f64,
    /// Turns per second at the highest concurrency (`at_concurrency`) ÷
    /// bare commits per second on one connection.
    turns_per_second_over_commits_per_second: f64,
    at_concurrency: u32,
}

/// The schemas and stores a bench made, to drop and close however it ends.
#[derive(Clone, Default)]
struct Made {
    schemas: Arc<Mutex<Vec<String>>>,
    stores: Arc<Mutex<Vec<PostgresStore>>>,
}

impl Made {
    fn schema(&self) -> String {
        let name = format!("turnstile_bench_{}", uuid::Uuid::new_v4().simple());
        self.schemas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(name.clone());
        name
    }

    fn store(&self, store: &PostgresStore) {
        self.stores
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(store.clone());
    }

    /// Closes the stores, then drops the schemas; whether all went.
    async fn clean_up(&self, url: &PgUrl) -> bool {
        let stores = std::mem::take(&mut *self.stores.lock().unwrap_or_else(|e| e.into_inner()));
        for store in stores {
            store.close().await;
        }
        let schemas = std::mem::take(&mut *self.schemas.lock().unwrap_or_else(|e| e.into_inner()));
        floor::drop_schemas(url.secret(), &schemas).await
    }
}

pub(super) async fn run(
    args: &BenchArgs,
    params: WorkloadParams,
    url: &PgUrl,
    stop: impl Future<Output = ()>,
    out: &mut dyn Write,
    style: Style,
    json: bool,
) -> Result<(), CliError> {
    if args.concurrency.is_some() {
        return Err(CliError::Usage(format!(
            "--concurrency is for a SQLite bench: on PostgreSQL the bench runs at concurrency {}",
            list(&LEVELS)
        )));
    }
    if args.durability.is_some() {
        return Err(CliError::Usage(
            "--durability is for a SQLite bench: on PostgreSQL the server's settings decide \
             (synchronous_commit and fsync are reported)"
                .into(),
        ));
    }
    let mut levels: Vec<u32> = LEVELS.map(|c| c.min(params.conversations)).to_vec();
    levels.dedup();
    let database = location(url)?;
    let made = Made::default();
    let measured = tokio::select! {
        figures = measure(url, &params, &levels, &made, &database, out, style, json) => Some(figures),
        () = stop => None,
    };
    let schemas_dropped = made.clean_up(url).await;
    let Some(figures) = measured else {
        return Err(CliError::Failed("interrupted: the bench stopped".into()));
    };
    let (server, runs, baseline) = figures?;
    let first = &runs[0];
    let last = &runs[runs.len() - 1];
    let single = &baseline.single_connection;
    let report = Report {
        backend: "postgres",
        database,
        server,
        workload: Params {
            conversations: params.conversations,
            turns_per_conversation: params.turns_per_conversation,
            message_bytes: params.message_bytes,
            concurrency: levels,
        },
        ratios: Ratios {
            turn_p50_over_commit_p50: first.turn_latency.p50_ms
                / single.latency.p50_ms.max(f64::MIN_POSITIVE),
            turns_per_second_over_commits_per_second: last.turns_per_second
                / single.commits_per_second.max(f64::MIN_POSITIVE),
            at_concurrency: last.concurrency,
        },
        runs,
        baseline,
        schemas_dropped,
        debug_build: cfg!(debug_assertions),
    };
    if json {
        output::json(out, &report)
    } else {
        print(out, style, &report)
    }
}

#[allow(clippy::too_many_arguments)]
async fn measure(
    url: &PgUrl,
    params: &WorkloadParams,
    levels: &[u32],
    made: &Made,
    database: &str,
    out: &mut dyn Write,
    style: Style,
    json: bool,
) -> Result<(Server, Vec<Run>, Baseline), CliError> {
    let server = server(url).await?;
    if !json {
        writeln!(
            out,
            "{} · PostgreSQL {} at {database} · {} conversations × {} turns · two {}-byte \
             messages per turn · concurrency {}",
            style.bold("turnstile bench"),
            server.version,
            params.conversations,
            params.turns_per_conversation,
            params.message_bytes,
            list(levels)
        )?;
        out.flush()?;
    }
    let mut runs = Vec::with_capacity(levels.len());
    for &concurrency in levels {
        runs.push(workload(url, params, concurrency, made).await?);
    }
    let total_turns = u64::from(params.conversations) * u64::from(params.turns_per_conversation);
    let commits = total_turns.clamp(BASELINE_COMMITS.0, BASELINE_COMMITS.1);
    let body = text::message(u32::MAX, 0, Role::User, params.message_bytes as usize);
    let baseline = baseline(url, &made.schema(), commits, body, params.message_bytes).await?;
    Ok((server, runs, baseline))
}

async fn server(url: &PgUrl) -> Result<Server, CliError> {
    let settings = floor::settings(url.secret()).await.map_err(failed)?;
    Ok(Server {
        version: settings.version,
        synchronous_commit: settings.synchronous_commit,
        fsync: settings.fsync,
    })
}

/// The workload at `concurrency`, in a new schema, through `PostgresStore`.
async fn workload(
    url: &PgUrl,
    params: &WorkloadParams,
    concurrency: u32,
    made: &Made,
) -> Result<Run, CliError> {
    let mut options = PostgresOptions::new(url.secret());
    options.schema = Some(made.schema());
    options.pool_size = concurrency;
    let store = PostgresStore::connect_with(options).await?;
    made.store(&store);
    let level = WorkloadParams {
        concurrency,
        durability: "server",
        ..*params
    };
    let shared: Arc<dyn Store> = Arc::new(store.clone());
    let written = Workload::from(&level).run(shared.clone()).await?;
    let latest_checkpoint = reads::latest_checkpoints(shared.as_ref(), &written.samples).await?;
    let replay = reads::replays(&shared, &written.samples, params).await?;
    let storage = store.storage().await?;
    let steps = steps::measure(shared, &level).await?;
    store.close().await;
    let turns = written.latencies.len() as u64;
    let wall_seconds = written.wall.as_secs_f64();
    Ok(Run {
        concurrency,
        turns,
        messages: 2 * turns,
        wall_seconds,
        turns_per_second: turns as f64 / wall_seconds.max(f64::MIN_POSITIVE),
        turn_latency: Latency::of(written.latencies),
        latest_checkpoint,
        replay,
        steps,
        storage: Storage {
            message_text_bytes: written.message_text_bytes,
            image_bytes: written.image_bytes,
            bytes_in_use: storage.bytes_in_use,
            bytes_per_message_byte: storage.bytes_in_use as f64
                / (written.message_text_bytes + written.image_bytes).max(1) as f64,
        },
    })
}

/// The floor: `commits` single-row INSERTs, each its own transaction, on
/// one connection; then as many again spread over 64 connections at once.
async fn baseline(
    url: &PgUrl,
    schema: &str,
    commits: u64,
    body: String,
    row_text_bytes: u32,
) -> Result<Baseline, CliError> {
    let measured = floor::measure(url.secret(), schema, commits, body, BASELINE_CONNECTIONS)
        .await
        .map_err(failed)?;
    Ok(Baseline {
        what: floor::WHAT,
        row_text_bytes,
        single_connection: commits_of(1, measured.single_connection),
        concurrent: commits_of(BASELINE_CONNECTIONS, measured.concurrent),
    })
}

fn commits_of(connections: u32, measured: baseline::Commits) -> Commits {
    let commits = measured.latencies.len() as u64;
    let wall_seconds = measured.wall.as_secs_f64();
    Commits {
        connections,
        commits,
        wall_seconds,
        commits_per_second: commits as f64 / wall_seconds.max(f64::MIN_POSITIVE),
        latency: Latency::of(measured.latencies),
    }
}

fn failed(error: baseline::BaselineError) -> CliError {
    CliError::Failed(error.to_string())
}

/// `1, 8, 64`.
fn list(levels: &[u32]) -> String {
    levels
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn print(out: &mut dyn Write, style: Style, report: &Report) -> Result<(), CliError> {
    let latency = |l: &Latency| format!("p50 {} · p99 {}", millis(l.p50_ms), millis(l.p99_ms));
    let mut rows: Vec<(String, String)> = Vec::new();
    for run in &report.runs {
        rows.push((
            format!("concurrency {}", run.concurrency),
            format!(
                "{} turns in {:.2} s · {:.1} turns/s · turn {}",
                run.turns,
                run.wall_seconds,
                run.turns_per_second,
                latency(&run.turn_latency)
            ),
        ));
    }
    let first = &report.runs[0];
    rows.push((
        "latest checkpoint".into(),
        format!(
            "{}   Store::latest_checkpoint of {} completed runs, one at a time",
            latency(&first.latest_checkpoint),
            first.latest_checkpoint.samples
        ),
    ));
    rows.push((
        "replay".into(),
        format!(
            "{}   session.run of {} committed requests again, one at a time",
            latency(&first.replay),
            first.replay.samples
        ),
    ));
    for (label, step, what) in first.steps.described() {
        rows.push((label.into(), format!("{}   {what}", latency(step))));
    }
    rows.push((
        "storage".into(),
        format!(
            "{:.2} database bytes per message byte ({} bytes in tables, indexes and TOAST)",
            first.storage.bytes_per_message_byte, first.storage.bytes_in_use
        ),
    ));
    for commits in [
        &report.baseline.single_connection,
        &report.baseline.concurrent,
    ] {
        rows.push((
            format!("bare commit ×{}", commits.connections),
            format!(
                "{} · {:.1} commits/s   {} single-row INSERTs in autocommit on {} connection{}",
                latency(&commits.latency),
                commits.commits_per_second,
                commits.commits,
                commits.connections,
                if commits.connections == 1 {
                    ""
                } else {
                    "s at once"
                }
            ),
        ));
    }
    rows.push((
        "ratios".into(),
        format!(
            "turn p50 ÷ bare commit p50 = {:.2} · turns/s at concurrency {} ÷ bare commits/s = {:.2}",
            report.ratios.turn_p50_over_commit_p50,
            report.ratios.at_concurrency,
            report.ratios.turns_per_second_over_commits_per_second
        ),
    ));
    rows.push((
        "server".into(),
        format!(
            "synchronous_commit {} · fsync {}",
            report.server.synchronous_commit, report.server.fsync
        ),
    ));
    rows.push((
        "database".into(),
        if report.schemas_dropped {
            format!("{} (the bench's schemas were dropped)", report.database)
        } else {
            style.yellow(&format!(
                "{} (a turnstile_bench_… schema could not be dropped)",
                report.database
            ))
        },
    ));
    let rows: Vec<(&str, String)> = rows.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    output::table(out, "", &rows)?;
    if report.debug_build {
        writeln!(
            out,
            "{}",
            style.yellow("debug build: timings are not representative (build with --release)")
        )?;
    }
    Ok(())
}

fn millis(ms: f64) -> String {
    if ms < 1.0 {
        format!("{ms:.3} ms")
    } else {
        format!("{ms:.2} ms")
    }
}
