//! `turnstile demo`: the library's promise shown end to end on a SQLite
//! file, with the scripted model and the real tools.
//!
//! 1. A three-turn, tool-using request commits, its events printed live.
//! 2. A second request runs in a worker process that is killed with SIGKILL
//!    after its turn-2 checkpoint; the stuck admission (`admission`) and the
//!    recovery usage are shown; `recover_stream` finishes the request with
//!    usage and tool-call count carried over, its events printed live.
//! 3. The first request is retried: replayed from the store, no model work.
//! 4. A summary: turns, tool calls, usage, checkpoints, database size.

mod report;
mod script;
mod worker;

use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;

pub use worker::{worker, WorkerArgs};

use self::report::{DemoReport, FirstRequest, RecoveredRequest, Replay, Totals};
use super::access::Access;
use super::agent::agent;
use super::db::DbLocation;
use super::exit::CliError;
use super::follow::follow;
use super::hint::quote;
use super::output::{self, Style};
use super::progress::Progress;
use super::store::open_store;
use turnstile::ids::{ConversationId, Namespace, RequestId, RunId};
use turnstile::session::{AgentSession, ContextPolicy, ResumePolicy};
use turnstile::RunContext;
use turnstile::{SqliteStore, StoreAdmin};

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// The database: a SQLite file (created if missing), or a PostgreSQL
    /// URL (its tables are created if missing).
    #[arg(long, value_name = "PATH|URL", default_value = "turnstile-demo.db")]
    pub db: DbLocation,
    /// Delete the database file first (SQLite only).
    #[arg(long)]
    pub fresh: bool,
}

/// How long each scripted answer takes on a terminal, so the progress can
/// be watched; elsewhere the demo runs at full speed.
const TERMINAL_PACE: Duration = Duration::from_millis(300);

pub async fn run(
    args: DemoArgs,
    out: &mut dyn Write,
    style: Style,
    json: bool,
) -> Result<(), CliError> {
    if args.fresh {
        let DbLocation::File(path) = &args.db else {
            // Dropping tables on a server is not the demo's to do.
            return Err(CliError::Usage(
                "--fresh deletes a SQLite file; for PostgreSQL, point --db at a new database"
                    .into(),
            ));
        };
        refuse_foreign_or_live(path).await?;
        remove_database(path)?;
    }
    let store = open_store(&args.db, Access::Create(Default::default())).await?;
    let pace = if style.terminal && !json {
        TERMINAL_PACE
    } else {
        Duration::ZERO
    };
    let result = async {
        let demo = Demo::new(&args.db, store.clone(), pace, style)?;
        let report = if json {
            demo.play(&mut std::io::sink()).await?
        } else {
            demo.play(out).await?
        };
        if json {
            output::json(out, &report)
        } else {
            Ok(())
        }
    }
    .await;
    super::store::closed(store.as_ref(), result).await
}

/// `--fresh` deletes only a turnstile database that no live run holds: not
/// a file of anything else, and not a database another process is working
/// in (an admission held by a `running` run that changed within the last
/// five minutes).
async fn refuse_foreign_or_live(db: &Path) -> Result<(), CliError> {
    let metadata = match std::fs::symlink_metadata(db) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(CliError::io(format!("inspect {}", db.display()))(e)),
    };
    let refuse = |why: &str| {
        Err(CliError::Usage(format!(
            "--fresh refuses to delete {}: {why}",
            db.display()
        )))
    };
    if !metadata.is_file() {
        return refuse("it is not a regular file");
    }
    let mut header = [0u8; 16];
    let read = std::fs::File::open(db).and_then(|mut f| f.read_exact(&mut header));
    if read.is_err() || &header != b"SQLite format 3\0" {
        return refuse("it is not a SQLite database");
    }
    let report = SqliteStore::doctor(db, Duration::from_secs(300)).await?;
    if report.schema_version.is_none() {
        return refuse("it is not a turnstile database");
    }
    let (held, stuck) = (
        report.held_admissions.unwrap_or(0),
        report.stuck_admissions.unwrap_or(0),
    );
    if held > stuck {
        return refuse("a live run holds one of its conversations");
    }
    Ok(())
}

fn remove_database(db: &Path) -> Result<(), CliError> {
    for suffix in ["", "-wal", "-shm"] {
        let mut path = db.as_os_str().to_owned();
        path.push(suffix);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(CliError::io(format!(
                    "delete {}",
                    Path::new(&path).display()
                ))(e))
            }
        }
    }
    Ok(())
}

struct Demo<'a> {
    db: &'a DbLocation,
    store: Arc<dyn StoreAdmin>,
    conversation: ConversationId,
    namespace: Namespace,
    pace: Duration,
    style: Style,
}

impl<'a> Demo<'a> {
    fn new(
        db: &'a DbLocation,
        store: Arc<dyn StoreAdmin>,
        pace: Duration,
        style: Style,
    ) -> Result<Self, CliError> {
        Ok(Self {
            db,
            store,
            conversation: ConversationId::new(),
            namespace: Namespace::new(script::NAMESPACE)?,
            pace,
            style,
        })
    }

    fn session(&self, model: Arc<dyn turnstile::Model>) -> AgentSession {
        AgentSession::new(
            agent(model),
            self.store.clone(),
            self.conversation,
            self.namespace.clone(),
            ContextPolicy::default(),
        )
    }

    fn heading(&self, out: &mut dyn Write, text: &str) -> Result<(), CliError> {
        writeln!(out)?;
        writeln!(out, "{}", self.style.bold(text))?;
        Ok(())
    }

    async fn play(self, out: &mut dyn Write) -> Result<DemoReport, CliError> {
        let s = self.style;
        writeln!(
            out,
            "{} · database {} · conversation {} (namespace {})",
            s.bold("turnstile demo"),
            self.db,
            self.conversation,
            self.namespace
        )?;

        // 1. A multi-turn, tool-using request.
        self.heading(out, "1. A tool-using request, saved turn by turn")?;
        let first_model = script::first_model(self.pace);
        let first_session = self.session(first_model.clone());
        let first_request = RequestId::new();
        writeln!(out, "   request {first_request}")?;
        writeln!(
            out,
            "   {}",
            s.dim(&format!("user: {}", script::FIRST_INPUT))
        )?;
        let events =
            first_session.stream(first_request, script::FIRST_INPUT, RunContext::default());
        let first = follow(events, &mut Progress::new(s, "   "), out, &mut None).await?;
        if !s.terminal {
            // On a terminal the answer was streamed word by word above.
            writeln!(out, "   {} {}", s.dim("answer:"), first.final_text)?;
        }

        // 2. A worker killed mid-run, then recovered.
        self.heading(
            out,
            "2. A run killed with SIGKILL mid-request, then recovered",
        )?;
        let second_request = RequestId::new();
        writeln!(
            out,
            "   request {second_request} runs in a worker process, killed after turn {}",
            script::KILL_AFTER_TURN
        )?;
        writeln!(
            out,
            "   {}",
            s.dim(&format!("user: {}", script::SECOND_INPUT))
        )?;
        let killed = worker::run_and_kill(
            self.db,
            self.conversation,
            second_request,
            self.pace.as_millis() as u64,
            out,
            &format!("   {} ", s.dim("worker │")),
        )
        .await?;
        let signal = match killed.signal {
            Some(9) => "SIGKILL".to_owned(),
            Some(n) => format!("signal {n}"),
            None => "a kill".to_owned(),
        };
        writeln!(
            out,
            "   {} worker (pid {}) ended by {signal} right after its turn-{} checkpoint (revision {})",
            s.red("✗"),
            killed.pid,
            killed.turn,
            killed.revision
        )?;

        let second_model = script::second_model(self.pace);
        let second_session = self.session(second_model.clone());
        let admission = second_session.admission().await?;
        let active = admission.active.ok_or_else(|| {
            CliError::Failed("the killed worker's request no longer holds the admission".into())
        })?;
        let killed_run = active.run_id;
        let checkpoint = active
            .checkpoint
            .ok_or_else(|| CliError::Failed("the killed run left no checkpoint".into()))?;
        let recovery_usage = second_session.recovery_usage(second_request).await?;
        writeln!(out)?;
        writeln!(
            out,
            "   the conversation is stuck: its admission is held by a dead run"
        )?;
        output::table(
            out,
            "     ",
            &[
                ("conversation", self.conversation.to_string()),
                ("request", active.request_id.to_string()),
                ("run", format!("{killed_run} (its process is gone)")),
                ("revision", admission.revision.to_string()),
                (
                    "last checkpoint",
                    format!(
                        "turn {} · {} · {} tool calls",
                        checkpoint.turn,
                        checkpoint.phase.as_str(),
                        checkpoint.tool_calls_count
                    ),
                ),
                (
                    "recovery_usage",
                    format!(
                        "{} · a lower bound: work in flight may have cost more",
                        output::usage(&recovery_usage)
                    ),
                ),
            ],
        )?;
        writeln!(out)?;
        // The turn-2 checkpoint was committed with turn 3's write-ahead, so
        // the dead run's last checkpoint says turn 3 was in flight: the
        // default policy would refuse it as ambiguous.
        writeln!(
            out,
            "   recover_stream(request, input, revision {}, RetryInterruptedTurn) continues from turn {}:",
            admission.revision, checkpoint.turn
        )?;
        // What a user would type for the same recovery (the demo's scripted
        // model is in this process: a shell would name its own).
        let mut command = vec![
            "turnstile recover".to_owned(),
            second_request.to_string(),
            format!("--revision {} --retry-interrupted", admission.revision),
            format!("--db {}", quote(&self.db.to_string())),
            format!("--conversation {}", self.conversation),
        ];
        if self.namespace.as_str() != Namespace::DEFAULT {
            command.push(format!("--namespace {}", quote(self.namespace.as_str())));
        }
        command.push("--model scripted:FILE".into());
        command.push(quote(script::SECOND_INPUT));
        writeln!(
            out,
            "   {}",
            s.dim(&format!("from a shell: {}", command.join(" ")))
        )?;
        let events = second_session.recover_stream(
            second_request,
            script::SECOND_INPUT,
            RunContext::default(),
            admission.revision,
            ResumePolicy::RetryInterruptedTurn,
        );
        let second = follow(events, &mut Progress::new(s, "   "), out, &mut None).await?;
        let recovered_run = self.store.run(second.run_id).await?.ok_or_else(|| {
            CliError::Failed(format!("run {} of the recovery not found", second.run_id))
        })?;
        writeln!(
            out,
            "   {} committed by run {} (resumed_from {})",
            s.green("✓"),
            second.run_id,
            recovered_run
                .resumed_from
                .map_or_else(|| "none".to_owned(), |r| r.to_string())
        )?;
        writeln!(
            out,
            "     turns {} · tool calls {} ({} carried over) · {} tokens ({} carried over)",
            second.turns,
            second.tool_calls,
            checkpoint.tool_calls_count,
            second.usage.total(),
            checkpoint.usage.total()
        )?;
        // Stored with its answer; that it went back to the model exactly is
        // proved by the model itself, which refuses a call whose earlier
        // answers did not come back exactly: the recovery finished.
        let signed_reasoning_answers = second
            .messages
            .iter()
            .flat_map(|m| m.content().reasoning())
            .filter(|r| **r == script::second_reasoning())
            .count();
        if signed_reasoning_answers > 0 {
            writeln!(
                out,
                "     turn {}'s signed reasoning, stored with its answer, went back to the model exactly",
                script::KILL_AFTER_TURN
            )?;
        }
        writeln!(out, "   {} {}", s.dim("answer:"), second.final_text)?;

        // 3. The completed request again: a replay.
        self.heading(out, "3. The first request, retried")?;
        let calls_before = first_model.calls();
        let started = Instant::now();
        let replay = first_session
            .run(first_request, script::FIRST_INPUT, RunContext::default())
            .await?;
        let latency = started.elapsed();
        let calls_after = first_model.calls();
        let same = replay.run_id == first.run_id && replay.final_text == first.final_text;
        writeln!(
            out,
            "   {} in {:.1} ms · model calls {calls_before} → {calls_after} · {}",
            if replay.replayed {
                s.cyan("replayed")
            } else {
                s.red("not replayed")
            },
            latency.as_secs_f64() * 1000.0,
            if same {
                "the stored answer of the committed run, no model or tool work"
            } else {
                "a different answer"
            }
        )?;
        writeln!(out, "   {} {}", s.dim("answer:"), replay.final_text)?;

        // 4. The summary, read back from the database.
        let runs = [first.run_id, killed_run, second.run_id];
        let (database_bytes, wal_bytes) = match self.db {
            DbLocation::File(path) => report::database_bytes(path),
            DbLocation::Postgres(_) => (self.store.storage().await?.database_bytes, 0),
        };
        let report = DemoReport {
            database: self.db.to_string(),
            on_server: matches!(self.db, DbLocation::Postgres(_)),
            database_bytes,
            wal_bytes,
            namespace: self.namespace.to_string(),
            conversation_id: self.conversation,
            totals: Totals {
                requests_committed: 2,
                turns: first.turns + second.turns,
                tool_calls: first.tool_calls + second.tool_calls,
                usage: first.usage.saturating_add(second.usage),
                model_calls: calls_after + killed.model_calls + second_model.calls(),
                runs: runs.len() as u32,
                checkpoint_rows: self.checkpoint_rows(&runs).await?,
                transcript_messages: self
                    .store
                    .transcript_window(self.conversation, u32::MAX)
                    .await?
                    .len() as u64,
            },
            first: FirstRequest {
                request_id: first_request,
                run_id: first.run_id,
                turns: first.turns,
                tool_calls: first.tool_calls,
                usage: first.usage,
                model_calls: calls_before,
            },
            recovered: RecoveredRequest {
                request_id: second_request,
                worker_pid: killed.pid,
                worker_signal: killed.signal,
                killed_run_id: killed_run,
                killed_after_turn: killed.turn,
                revision_at_kill: admission.revision.0,
                checkpoint_turn: checkpoint.turn,
                checkpoint_phase: checkpoint.phase,
                tool_calls_at_kill: checkpoint.tool_calls_count,
                recovery_usage,
                model_calls_in_worker: killed.model_calls,
                run_id: second.run_id,
                resumed_from: recovered_run.resumed_from,
                turns: second.turns,
                tool_calls: second.tool_calls,
                usage: second.usage,
                model_calls_in_recovery: second_model.calls(),
                signed_reasoning_answers,
            },
            replay: Replay {
                request_id: first_request,
                replayed: replay.replayed,
                latency_ms: latency.as_secs_f64() * 1000.0,
                model_calls_before: calls_before,
                model_calls_after: calls_after,
            },
        };
        self.heading(out, "4. Summary")?;
        report.print(out, s)?;
        Ok(report)
    }

    async fn checkpoint_rows(&self, runs: &[RunId]) -> Result<u64, CliError> {
        let mut rows = 0;
        for run in runs {
            rows += self.store.checkpoints(*run).await?.len() as u64;
        }
        Ok(rows)
    }
}
