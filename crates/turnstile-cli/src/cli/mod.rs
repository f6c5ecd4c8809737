//! The `turnstile` command-line tool (cargo feature `cli`): its arguments and
//! the dispatch to one small module per job. The binary only parses the
//! arguments, installs the tracing subscriber and calls [`main`].
//!
//! Output goes to the writer given to [`main`]: human-readable tables, or
//! with `--json` one JSON document. Errors are returned, and the binary
//! prints them as one `error: …` line on stderr with the exit code of
//! [`CliError::exit_code`] (see [`exit`] for the table).

mod abandon;
mod access;
mod agent;
mod agent_args;
mod approvals;
mod args;
mod bench;
mod budget_args;
mod committed;
mod db;
mod deletion;
mod demo;
pub mod exit;
mod follow;
mod hint;
mod input;
mod interrupt;
mod lease;
mod mcp;
mod meta;
mod model;
mod ops;
pub mod output;
mod postgres;
mod progress;
mod recover_expired;
mod run;
mod search;
mod serve;
mod store;
mod take_over;
mod text;
mod token;
mod tool_list;
pub mod tools;

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use abandon::AbandonArgs;
pub use approvals::{ApprovalsArgs, ApproveArgs, RejectArgs};
pub use bench::BenchArgs;
pub use db::DbLocation;
pub use deletion::{DeleteArgs, ForkArgs};
pub use demo::{DemoArgs, WorkerArgs};
pub use exit::CliError;
pub use meta::MetaArgs;
pub use ops::{CheckpointsArgs, DoctorArgs, EventsArgs, ExportArgs, LsArgs, PruneArgs, ShowArgs};
pub use output::Style;
pub use recover_expired::RecoverExpiredArgs;
pub use run::RunArgs;
pub use serve::ServeArgs;
pub use take_over::{RecoverArgs, ResumeArgs};
pub use token::TokenArgs;
pub use tool_list::ToolsArgs;

/// Durable LLM agent conversations on SQLite or PostgreSQL.
#[derive(Parser, Debug)]
#[command(name = "turnstile", version, about, max_term_width = 100)]
#[command(
    after_help = "Exit codes: 0 success, 1 failure, 2 usage or mismatch, 3 busy, \
                        4 not found, 5 fenced, conflict or ambiguous checkpoint, \
                        6 awaiting approval, 7 doctor cannot open the database.\n\
                        Logging: RUST_LOG (default warn), on stderr."
)]
pub struct Cli {
    /// Print one JSON document instead of tables (`export` prints JSON
    /// Lines, with or without it).
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Show a durable agent end to end: a tool-using request, a worker
    /// killed with SIGKILL mid-run and recovered, and an instant replay.
    Demo(DemoArgs),
    /// Run a request (or replay it, if it is already committed).
    Run(RunArgs),
    /// Continue a stopped run from its last checkpoint, in a new run.
    Resume(ResumeArgs),
    /// Take over a request whose owner is gone and finish it.
    Recover(RecoverArgs),
    /// Release a request's admission without committing; its id is burned.
    Abandon(AbandonArgs),
    /// Take over the requests whose lease expired (`run --lease` whose
    /// process froze or died) and finish them with the agent given. Exits
    /// with the code of the first request it could not finish.
    RecoverExpired(RecoverExpiredArgs),
    /// List the tool calls that wait for a human's approval (oldest first),
    /// with the commands that decide them.
    Approvals(ApprovalsArgs),
    /// Approve a tool call that waits for approval: the run that continues
    /// the request executes it. Prints the new revision and the next
    /// command.
    Approve(ApproveArgs),
    /// Reject a tool call that waits for approval: it never runs, and the
    /// model is given the reason. Prints the new revision and the next
    /// command.
    Reject(RejectArgs),
    /// List conversations, requests or runs (newest first), or only what
    /// stuck admissions hold.
    Ls(LsArgs),
    /// A conversation: version, admission, summary and transcript.
    Show(ShowArgs),
    /// Every checkpoint row of a run: turn, phase, usage, tool calls,
    /// reports, messages.
    Checkpoints(CheckpointsArgs),
    /// A conversation's transcript as JSON Lines, one object per entry
    /// (seq, request_id, message), with or without --json: it streams a
    /// transcript of any length page by page.
    Export(ExportArgs),
    /// A conversation's event log as JSON Lines, one object per step a
    /// watcher cares about (admitted, answered, tool finished, approval
    /// requested or decided, checkpoint saved, run started, stopped,
    /// committed, abandoned);
    /// with --follow, each new one as its step commits, from any process.
    Events(EventsArgs),
    /// Delete what no replay needs from old finished requests (optionally
    /// whole idle conversations) and give the space back to the disk.
    Prune(PruneArgs),
    /// Check a database: integrity, schema version, sizes, stuck admissions.
    /// Exits 1 when the integrity check fails.
    Doctor(DoctorArgs),
    /// Measure a workload on a fresh database: turn latency, turns per
    /// second, storage per message byte, checkpoint and replay reads.
    Bench(BenchArgs),
    /// The demo's child process: runs a request and freezes after a turn.
    #[command(hide = true)]
    Worker(WorkerArgs),
    /// Delete a conversation and everything of it (exit 5 if its version
    /// moved, 3 while a request holds it unless --revision names it). Its
    /// id and request ids are never admitted again.
    Delete(DeleteArgs),
    /// Create a new conversation from the first SEQ committed entries of
    /// another (left untouched). Prints the new id.
    Fork(ForkArgs),
    /// Serve requests and event logs over HTTP with the agent of these
    /// flags: `POST /v1/conversations/{id}/requests` (`{"input": "…"}`, the
    /// request id as `Idempotency-Key`) and `GET
    /// /v1/conversations/{id}/events` (server-sent events, resumed with
    /// `Last-Event-ID`), until Ctrl-C or SIGTERM.
    Serve(ServeArgs),
    /// The access tokens of `serve --tokens`: `create` one for a namespace
    /// (printed once, as the last line), `revoke` one, or `ls` them.
    Token(TokenArgs),
    /// A conversation's title, owner and metadata: shows them, or changes
    /// them with a compare-and-swap on their version (exit 5 if it moved).
    Meta(MetaArgs),
    /// The tools an agent of these flags has: the command line's own and
    /// those of the `--mcp-stdio` and `--mcp-http` servers, with what each MCP tool declares
    /// (read-only, destructive, idempotent, open-world) and whether its
    /// calls wait for approval.
    Tools(ToolsArgs),
}

/// Runs a parsed command, writing its output to `out`. With `--json`, a
/// command that fails before printing anything prints its error as one
/// JSON document ([`exit::ErrorDocument`]).
///
/// # Errors
/// A [`CliError`]; print it with [`CliError::one_line`] and exit with
/// [`CliError::exit_code`].
pub fn main(cli: Cli, out: &mut dyn Write, style: Style) -> Result<(), CliError> {
    let json = cli.json;
    let given = given(&cli.command);
    let database = database(&cli.command);
    let mut tracked = Tracked {
        out,
        written: false,
    };
    let result =
        dispatch(cli, &mut tracked, style).map_err(|error| error.on_database(database.as_deref()));
    if let Err(error) = &result {
        if json && !tracked.written && !error.is_closed_output() {
            // The error line on stderr says the same; a closed stdout
            // changes nothing.
            let _ = output::json(tracked.out, &error.document(given));
        }
    }
    result
}

/// The conversation and request a command names, for its error document.
fn given(command: &Command) -> exit::Given {
    let (conversation_id, request_id) = match command {
        Command::Run(a) => (a.session.conversation, a.request),
        Command::Resume(a) => (Some(a.session.conversation), None),
        Command::Recover(a) => (Some(a.session.conversation), Some(a.request)),
        Command::Abandon(a) => (Some(a.session.conversation), Some(a.request)),
        Command::Approve(a) => (Some(a.decide.session.conversation), Some(a.decide.request)),
        Command::Reject(a) => (Some(a.decide.session.conversation), Some(a.decide.request)),
        Command::Approvals(a) => (a.conversation, None),
        Command::Show(a) => (Some(a.conversation), None),
        Command::Export(a) => (Some(a.conversation), None),
        Command::Events(a) => (Some(a.conversation), None),
        Command::Delete(a) => (Some(a.conversation), None),
        Command::Fork(a) => (Some(a.conversation), None),
        Command::Meta(a) => (Some(a.conversation), None),
        _ => (None, None),
    };
    exit::Given {
        conversation_id,
        request_id,
    }
}

/// The SQLite file a command works on, if it names one.
fn database(command: &Command) -> Option<std::path::PathBuf> {
    let location = match command {
        Command::Run(a) => &a.session.db,
        Command::Resume(a) => &a.session.db,
        Command::Recover(a) => &a.session.db,
        Command::Abandon(a) => &a.session.db,
        Command::RecoverExpired(a) => &a.db,
        Command::Approvals(a) => &a.db,
        Command::Approve(a) => &a.decide.session.db,
        Command::Reject(a) => &a.decide.session.db,
        Command::Ls(a) => &a.db,
        Command::Show(a) => &a.db,
        Command::Checkpoints(a) => &a.db,
        Command::Export(a) => &a.db,
        Command::Events(a) => &a.db,
        Command::Prune(a) => &a.db,
        Command::Delete(a) => &a.db,
        Command::Fork(a) => &a.db,
        Command::Meta(a) => &a.db,
        Command::Demo(a) => &a.db,
        Command::Serve(a) => &a.db,
        Command::Token(a) => a.db(),
        _ => return None,
    };
    match location {
        DbLocation::File(path) => Some(path.clone()),
        DbLocation::Postgres(_) => None,
    }
}

/// A writer that remembers whether anything was written to it.
struct Tracked<'a> {
    out: &'a mut dyn Write,
    written: bool,
}

impl Write for Tracked<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.written |= !buf.is_empty();
        self.out.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// How many tasks a runtime worker polls from its own queue before it
/// looks at the runtime's global one. A task woken from outside the
/// runtime waits there, and a store's writer task is: SQLite's worker
/// thread wakes it with each statement's result. Every step of a group
/// transaction waits on that task, and behind 64 sessions' tasks Tokio's
/// self-tuned interval kept it waiting (`docs/performance.md`).
const GLOBAL_QUEUE_INTERVAL: u32 = 4;

fn dispatch(cli: Cli, out: &mut dyn Write, style: Style) -> Result<(), CliError> {
    // One thread is plenty: the work is a sequence of model calls and
    // database steps, and SQLite runs on its own worker threads. The bench
    // drives many conversations at once, as an application would, and a
    // server serves many clients: on every core.
    let mut builder = match cli.command {
        Command::Bench(_) | Command::Serve(_) => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.global_queue_interval(GLOBAL_QUEUE_INTERVAL);
            builder
        }
        _ => tokio::runtime::Builder::new_current_thread(),
    };
    let runtime = builder
        .enable_all()
        .build()
        .map_err(CliError::io("start the async runtime"))?;
    let json = cli.json;
    runtime.block_on(async move {
        match cli.command {
            Command::Demo(args) => demo::run(args, out, style, json).await,
            Command::Run(args) => run::run(args, out, style, json).await,
            Command::Resume(args) => take_over::resume(args, out, style, json).await,
            Command::Recover(args) => take_over::recover(args, out, style, json).await,
            Command::Abandon(args) => abandon::abandon(args, out, style, json).await,
            Command::RecoverExpired(args) => recover_expired::run(args, out, style, json).await,
            Command::Approvals(args) => approvals::list(args, out, style, json).await,
            Command::Approve(args) => approvals::approve(args, out, style, json).await,
            Command::Reject(args) => approvals::reject(args, out, style, json).await,
            Command::Ls(args) => ops::ls(args, out, style, json).await,
            Command::Show(args) => ops::show(args, out, style, json).await,
            Command::Checkpoints(args) => ops::checkpoints(args, out, style, json).await,
            Command::Export(args) => ops::export(args, out).await,
            Command::Events(args) => ops::events(args, out).await,
            Command::Serve(args) => serve::serve(args, out).await,
            Command::Token(args) => token::token(args, out, json).await,
            Command::Prune(args) => ops::prune(args, out, style, json).await,
            Command::Doctor(args) => ops::doctor(args, out, style, json).await,
            Command::Bench(args) => bench::run(args, out, style, json).await,
            Command::Worker(args) => demo::worker(args, out).await,
            Command::Delete(args) => deletion::delete(args, out, style, json).await,
            Command::Fork(args) => deletion::fork(args, out, json).await,
            Command::Meta(args) => meta::run(args, out, style, json).await,
            Command::Tools(args) => tool_list::run(args, out, style, json).await,
        }
    })
}

/// Handles a failed argument parse: help and version go to stdout (exit 0);
/// a usage error is printed as one line on stderr (exit 2).
pub fn parse_failure(error: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match error.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = error.print();
            ExitCode::SUCCESS
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = error.print();
            ExitCode::from(exit::USAGE)
        }
        _ => {
            report(&format!("error: {}", usage_line(&error)));
            ExitCode::from(exit::USAGE)
        }
    }
}

/// Writes one line to stderr; an unwritable stderr is ignored (`eprintln!`
/// would panic).
pub fn report(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Clap's message without its usage and tip paragraphs, on one line, with
/// the value it quotes made [`output::plain`]: an argument can hold control
/// or reordering characters like any other text a person did not write.
fn usage_line(error: &clap::Error) -> String {
    let rendered = error.render().to_string();
    let first = rendered.split("\n\n").next().unwrap_or_default();
    let line = first.split_whitespace().collect::<Vec<_>>().join(" ");
    let line = line.strip_prefix("error: ").unwrap_or(&line);
    output::plain(line).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnstile::ids::ConversationId;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("turnstile").chain(args.iter().copied()))
    }

    #[test]
    fn clap_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn usage_errors_are_one_line() {
        let error = parse(&["abandon", "not-a-uuid", "--revision", "1"]).unwrap_err();
        let line = usage_line(&error);
        assert!(line.contains("not-a-uuid"), "{line}");
        assert!(!line.contains('\n'));

        let error = parse(&["run"]).unwrap_err();
        let line = usage_line(&error);
        assert!(line.contains("--db"), "{line}");
        assert!(!line.contains("Usage"), "{line}");
    }

    #[test]
    fn a_usage_error_shows_reordering_and_control_characters_escaped() {
        let error = parse(&["abandon", "x\u{202e}y\u{1b}[2J", "--revision", "1"]).unwrap_err();
        let line = usage_line(&error);
        assert!(line.contains("x\\u{202e}y\\u{1b}[2J"), "{line}");
        assert!(!line.chars().any(text::unsafe_for_terminal), "{line}");
    }

    #[test]
    fn a_negative_revision_is_refused_by_the_parser() {
        let request = turnstile::RequestId::new().to_string();
        let conversation = ConversationId::new().to_string();
        let args = [
            "abandon",
            &request,
            "--revision",
            "-1",
            "--db",
            "x.db",
            "--conversation",
            &conversation,
        ];
        let error = parse(&args).unwrap_err();
        assert!(usage_line(&error).contains("non-negative"), "{error}");
    }
}
