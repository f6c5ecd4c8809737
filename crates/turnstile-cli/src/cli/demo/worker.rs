//! The demo's crash: a child process (this executable, `turnstile worker`)
//! runs the second request and freezes right after a turn's checkpoint; the
//! parent reads its progress lines and kills it with SIGKILL at that point.
//!
//! The worker stops polling its event stream after the marker line, so the
//! run is frozen exactly after that durable step. It then waits for its
//! stdin to close: if the parent dies first, the worker exits too instead of
//! lingering forever.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use clap::Args;
use futures_util::StreamExt;
use tokio::sync::mpsc::unbounded_channel;

use super::script;
use crate::cli::access::Access;
use crate::cli::agent::agent;
use crate::cli::db::DbLocation;
use crate::cli::exit::CliError;
use crate::cli::output::Style;
use crate::cli::progress::Progress;
use crate::cli::store::open_store;
use turnstile::events::Event;
use turnstile::ids::{ConversationId, Namespace, RequestId};
use turnstile::session::{AgentSession, ContextPolicy};
use turnstile::RunContext;

/// The line the worker prints once frozen.
const MARKER: &str = "@worker-frozen";

/// How long the parent waits for the worker to reach its turn.
const PATIENCE: Duration = Duration::from_secs(60);

#[derive(Args, Debug)]
pub struct WorkerArgs {
    #[arg(long, value_name = "PATH|URL")]
    pub db: DbLocation,
    #[arg(long, value_name = "UUID")]
    pub conversation: ConversationId,
    #[arg(long, value_name = "UUID")]
    pub request: RequestId,
    /// Freeze after this turn's checkpoint.
    #[arg(long, value_name = "TURN")]
    pub stop_after_turn: u32,
    /// How long each scripted model answer takes.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub pace_ms: u64,
}

/// The child: runs the demo's second request and freezes after
/// `stop_after_turn`.
pub async fn worker(args: WorkerArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let store = open_store(&args.db, Access::Write(Default::default())).await?;
    let model = script::second_model(Duration::from_millis(args.pace_ms));
    let session = AgentSession::new(
        agent(model.clone()),
        store,
        args.conversation,
        Namespace::new(script::NAMESPACE)?,
        ContextPolicy::default(),
    );
    let mut events = session.stream(args.request, script::SECOND_INPUT, RunContext::default());
    let mut progress = Progress::new(Style::default(), "");
    while let Some(item) = events.next().await {
        let event = item?;
        progress.event(out, &event)?;
        if let Event::CheckpointSaved { turn, revision } = event {
            if turn == args.stop_after_turn {
                writeln!(
                    out,
                    "{MARKER} turn={turn} revision={revision} model_calls={}",
                    model.calls()
                )?;
                out.flush()?;
                // Frozen: the stream is not polled again. Blocking this
                // thread is the point; the kill comes while it waits.
                let _ = std::io::stdin().read_to_end(&mut Vec::new());
                return Err(CliError::Failed(
                    "the demo worker was not killed (its parent went away)".into(),
                ));
            }
        }
    }
    Err(CliError::Failed(format!(
        "the demo worker's run ended before turn {}",
        args.stop_after_turn
    )))
}

/// What the parent learned from the worker it killed.
#[derive(Clone, Debug)]
pub struct Killed {
    pub pid: u32,
    pub turn: u32,
    pub revision: u64,
    pub model_calls: u64,
    /// The signal that ended the worker (9 for SIGKILL), where known.
    pub signal: Option<i32>,
}

/// Starts the worker, relays its progress lines to `out` (after `prefix`)
/// and kills it with SIGKILL as soon as it reports being frozen.
pub async fn run_and_kill(
    db: &DbLocation,
    conversation: ConversationId,
    request: RequestId,
    pace_ms: u64,
    out: &mut dyn Write,
    prefix: &str,
) -> Result<Killed, CliError> {
    let exe = std::env::current_exe().map_err(CliError::io("find the turnstile executable"))?;
    let mut command = Command::new(exe);
    command.arg("worker").arg("--db");
    // The URL as given (the child connects with it), never printed.
    match db {
        DbLocation::File(path) => command.arg(path),
        DbLocation::Postgres(url) => command.arg(url.secret()),
    };
    let mut child = command
        .args(["--conversation", &conversation.to_string()])
        .args(["--request", &request.to_string()])
        .args(["--stop-after-turn", &script::KILL_AFTER_TURN.to_string()])
        .args(["--pace-ms", &pace_ms.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(CliError::io("start the demo worker"))?;
    let pid = child.id();
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| CliError::Failed("the demo worker's stdout was not captured".into()))?;
    // Reading a pipe blocks: a thread forwards the lines.
    let (lines, mut received) = unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let frozen = loop {
        match tokio::time::timeout(PATIENCE, received.recv()).await {
            Err(_) => {
                break Err(CliError::Failed(format!(
                    "the demo worker did not reach turn {} within {} s",
                    script::KILL_AFTER_TURN,
                    PATIENCE.as_secs()
                )))
            }
            Ok(None) => {
                break Err(CliError::Failed(
                    "the demo worker exited before it could be killed".into(),
                ))
            }
            Ok(Some(line)) => match parse_marker(&line) {
                Some(frozen) => break Ok(frozen),
                None => {
                    if let Err(e) = writeln!(out, "{prefix}{line}").and_then(|_| out.flush()) {
                        break Err(e.into());
                    }
                }
            },
        }
    };
    // Killed on every path, so no worker outlives the demo. `kill` sends
    // SIGKILL on unix: no destructor, no rollback, no goodbye.
    let _ = child.kill();
    let status = child
        .wait()
        .map_err(CliError::io("wait for the demo worker"))?;
    let (turn, revision, model_calls) = frozen?;
    Ok(Killed {
        pid,
        turn,
        revision,
        model_calls,
        signal: signal_of(&status),
    })
}

#[cfg(unix)]
fn signal_of(status: &std::process::ExitStatus) -> Option<i32> {
    std::os::unix::process::ExitStatusExt::signal(status)
}

#[cfg(not(unix))]
fn signal_of(_: &std::process::ExitStatus) -> Option<i32> {
    None
}

/// `@worker-frozen turn=2 revision=3 model_calls=2`.
fn parse_marker(line: &str) -> Option<(u32, u64, u64)> {
    let rest = line.strip_prefix(MARKER)?;
    let field = |name: &str| {
        rest.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse::<u64>().ok())
    };
    let turn = u32::try_from(field("turn")?).ok()?;
    Some((turn, field("revision")?, field("model_calls")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_round_trips() {
        assert_eq!(
            parse_marker("@worker-frozen turn=2 revision=7 model_calls=2"),
            Some((2, 7, 2))
        );
        assert_eq!(parse_marker("turn 2 · model answered"), None);
        assert_eq!(parse_marker("@worker-frozen turn=x"), None);
    }
}
