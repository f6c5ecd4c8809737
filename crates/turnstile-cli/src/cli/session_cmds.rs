//! `run`, `resume`, `recover` and `abandon`: the session API from a shell.
//! A run that stops to wait for approval of tool calls exits 6 (see
//! [`super::approvals`]).
//!
//! Every argument, the script and the input are checked before the database
//! is opened, so bad input writes nothing (not even a new database file).

use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;

use clap::Args;
use futures_util::StreamExt;
use serde::Serialize;

use super::approvals::{report_awaiting, ApprovalArgs};
use super::db::DbLocation;
use super::exit::CliError;
use super::hint::{with_hint, AgentFlags};
use super::interrupt::Interrupt;
use super::lease::{leased, LeaseArgs};
use super::model::{self, ModelArgs};
use super::output::{self, Style};
use super::progress::Progress;
use super::{parse_revision, tools, NewSessionArgs, SessionArgs};
use turnstile::agent::{Agent, AgentUpgrade, Model, RunContext, ScriptedModel};
use turnstile::events::Event;
use turnstile::ids::{ConversationId, Namespace, RequestId, Revision, RunId};
use turnstile::outcome::Outcome;
use turnstile::session::{AgentSession, ContextPolicy, EventStream, ResumePolicy, MAX_INPUT_BYTES};
use turnstile::store::Store;
use turnstile::{LeasePolicy, SqliteOptions, SqliteStore, StoreAdmin};

/// The system prompt of the command-line agent. It is part of the agent
/// fingerprint: `resume` and `recover` accept a request only from the agent
/// it was admitted with.
pub const SYSTEM_PROMPT: &str = "You are a careful assistant. Use the tools add, clock and \
                                 word_count when they help, then answer briefly.";

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub session: NewSessionArgs,
    /// The request id, the idempotency key of this input. Generated (and
    /// printed) when absent; pass it again to replay instead of re-running.
    #[arg(long, value_name = "UUID")]
    pub request: Option<RequestId>,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub approval: ApprovalArgs,
    #[command(flatten)]
    pub lease: LeaseArgs,
    /// The user input. Read from stdin when absent (trailing newlines
    /// dropped).
    #[arg(value_name = "INPUT")]
    pub input: Option<String>,
}

#[derive(Args, Debug)]
pub struct ResumeArgs {
    /// The stopped run to continue.
    #[arg(value_name = "RUN_ID")]
    pub run: RunId,
    /// The admission revision you saw (compare-and-swap token).
    #[arg(long, value_name = "N", value_parser = parse_revision, allow_hyphen_values = true)]
    pub revision: Revision,
    /// Re-run a turn that was in flight (journaled tool results are reused).
    #[arg(long)]
    pub retry_interrupted: bool,
    /// Continue even if the request was run with another agent (model,
    /// tools, approval rules): the run records both agent fingerprints.
    #[arg(long)]
    pub accept_agent_change: bool,
    #[command(flatten)]
    pub session: SessionArgs,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub approval: ApprovalArgs,
    #[command(flatten)]
    pub lease: LeaseArgs,
}

#[derive(Args, Debug)]
pub struct RecoverArgs {
    /// The request whose owner is gone.
    #[arg(value_name = "REQUEST_ID")]
    pub request: RequestId,
    /// The admission revision you saw (compare-and-swap token).
    #[arg(long, value_name = "N", value_parser = parse_revision, allow_hyphen_values = true)]
    pub revision: Revision,
    /// Re-run a turn that was in flight (journaled tool results are reused).
    #[arg(long)]
    pub retry_interrupted: bool,
    /// Continue even if the request was run with another agent (model,
    /// tools, approval rules): the run records both agent fingerprints.
    #[arg(long)]
    pub accept_agent_change: bool,
    #[command(flatten)]
    pub session: SessionArgs,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub approval: ApprovalArgs,
    #[command(flatten)]
    pub lease: LeaseArgs,
    /// The request's input, exactly as first given. Read from stdin when
    /// absent (trailing newlines dropped).
    #[arg(value_name = "INPUT")]
    pub input: Option<String>,
}

#[derive(Args, Debug)]
pub struct AbandonArgs {
    /// The active request to release.
    #[arg(value_name = "REQUEST_ID")]
    pub request: RequestId,
    /// The admission revision you saw (compare-and-swap token).
    #[arg(long, value_name = "N", value_parser = parse_revision, allow_hyphen_values = true)]
    pub revision: Revision,
    #[command(flatten)]
    pub session: SessionArgs,
}

/// The command-line agent: `model`, the real tools and [`SYSTEM_PROMPT`].
pub(super) fn agent(model: Arc<dyn Model>) -> Agent {
    agent_requiring(model, &[])
}

/// The command-line agent whose calls of the tools named in `approval`
/// wait for a human's approval.
pub(super) fn agent_requiring(model: Arc<dyn Model>, approval: &[String]) -> Agent {
    tools::toolbox()
        .into_iter()
        .fold(Agent::new(model), |agent, tool| {
            match approval.contains(&tool.spec().name) {
                true => agent.with_tool_requiring_approval(tool),
                false => agent.with_tool(tool),
            }
        })
        .with_system_prompt(SYSTEM_PROMPT)
}

/// Closes the store after a command, whatever the command's result, so the
/// database file alone is complete when the process exits. A close kept
/// from folding the log whole by another process reading (or by a
/// read-only medium) is logged at debug: the next writer folds it, and
/// nothing committed is lost either way. A close that found no room to
/// fold it (a full disk) leaves the latest commits in the `-wal` file
/// beside the database: after a command that succeeded that is
/// [`CliError::Unfolded`], so the user learns that the file alone is not
/// the whole database; after one that failed, its own error stands.
pub(super) async fn closed<T>(
    store: &dyn StoreAdmin,
    result: Result<T, CliError>,
) -> Result<T, CliError> {
    match store.close().await {
        Err(turnstile::Error::Store(e)) if e.is_busy() => {
            tracing::debug!(error = %e, "the database was not closed cleanly");
        }
        Err(turnstile::Error::Store(e)) if e.is_full() && result.is_ok() => {
            return Err(CliError::Unfolded {
                source: turnstile::Error::Store(e),
                database: None,
            })
        }
        Err(error) => tracing::debug!(%error, "the database was not closed cleanly"),
        Ok(()) => {}
    }
    result
}

/// Opens the database: a file (unless `create`, a missing file is not
/// found, and is not created) or a PostgreSQL database (see
/// [`super::postgres`]).
pub(super) async fn open_store(
    db: &DbLocation,
    access: Access,
) -> Result<Arc<dyn StoreAdmin>, CliError> {
    match db {
        DbLocation::File(path) => open_file(path, access).await,
        DbLocation::Postgres(url) => Ok(Arc::new(super::postgres::open(url, access).await?)),
    }
}

async fn open_file(db: &Path, access: Access) -> Result<Arc<dyn StoreAdmin>, CliError> {
    match std::fs::metadata(db) {
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound && !matches!(access, Access::Create(_)) =>
        {
            return Err(CliError::MissingDatabase(db.display().to_string()));
        }
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(CliError::io(format!("inspect {}", db.display()))(e));
        }
        // `--db /dev/null`, a directory or a FIFO: SQLite would make a
        // journal beside it, or block on it.
        Ok(metadata) if !metadata.is_file() => {
            return Err(CliError::Usage(format!(
                "{} is not a database file",
                db.display()
            )));
        }
        _ => {}
    }
    let limits = access.limits();
    let defaults = SqliteOptions::default();
    let options = SqliteOptions {
        existing_only: access == Access::Read,
        max_database_bytes: limits.max_db_bytes,
        busy_timeout: limits.busy_timeout.unwrap_or(defaults.busy_timeout),
        ..defaults
    };
    Ok(Arc::new(SqliteStore::open_with(db, options).await?))
}

/// What a command does with its database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Access {
    /// Creates it when missing (`run`, `demo`).
    Create(Limits),
    /// Writes to an existing one, migrating an older schema (`resume`,
    /// `recover`, `abandon`, `prune`).
    Write(Limits),
    /// Only reads: never creates, never migrates (`ls`, `show`,
    /// `checkpoints`, `export`).
    Read,
}

/// The store settings of a writing command; `None` keeps the store's
/// default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Limits {
    pub max_db_bytes: Option<u64>,
    pub busy_timeout: Option<std::time::Duration>,
}

impl Access {
    pub(super) fn limits(self) -> Limits {
        match self {
            Access::Create(limits) | Access::Write(limits) => limits,
            Access::Read => Limits::default(),
        }
    }
}

/// The input from the argument or stdin; empty input is refused.
fn read_input(arg: Option<String>) -> Result<String, CliError> {
    let input = match arg {
        Some(input) => input,
        None => {
            // One byte past the limit is enough to refuse: `yes | turnstile
            // run …` must not read without end.
            let mut input = String::new();
            std::io::stdin()
                .take(MAX_INPUT_BYTES as u64 + 1)
                .read_to_string(&mut input)
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::InvalidData => {
                        CliError::Usage("the input on stdin is not valid UTF-8".into())
                    }
                    _ => CliError::io("read the input from stdin")(e),
                })?;
            let end = input.trim_end_matches(['\n', '\r']).len();
            input.truncate(end);
            input
        }
    };
    if input.trim().is_empty() {
        return Err(CliError::Usage(
            "the input is empty: give it as an argument or on stdin".into(),
        ));
    }
    // Refused here, before the database is opened (or created).
    if input.len() > MAX_INPUT_BYTES {
        return Err(CliError::Usage(format!(
            "the input is over the {MAX_INPUT_BYTES}-byte limit"
        )));
    }
    Ok(input)
}

pub(super) fn session(
    args: &SessionArgs,
    store: Arc<dyn StoreAdmin>,
    model: Arc<dyn Model>,
    approval: &[String],
) -> AgentSession {
    agent_session(
        args.conversation,
        args.namespace.clone(),
        store,
        model,
        approval,
    )
}

/// The command-line agent's session on one conversation.
pub(super) fn agent_session(
    conversation: ConversationId,
    namespace: Namespace,
    store: Arc<dyn StoreAdmin>,
    model: Arc<dyn Model>,
    approval: &[String],
) -> AgentSession {
    AgentSession::new(
        agent_requiring(model, approval),
        store,
        conversation,
        namespace,
        ContextPolicy::default(),
    )
}

fn policy(retry_interrupted: bool) -> ResumePolicy {
    if retry_interrupted {
        ResumePolicy::RetryInterruptedTurn
    } else {
        ResumePolicy::RejectAmbiguous
    }
}

pub(super) async fn run(
    args: RunArgs,
    out: &mut dyn Write,
    style: Style,
    json: bool,
) -> Result<(), CliError> {
    let approval = args.approval.tools()?;
    let lease = args.lease.policy()?;
    let model = model::load(&args.model)?;
    let input = read_input(args.input)?;
    let generated = args.request.is_none();
    let request_id = args.request.unwrap_or_else(RequestId::new);
    let new_conversation = args.session.conversation.is_none();
    let conversation = args
        .session
        .conversation
        .unwrap_or_else(ConversationId::new);
    let args_session = args.session.on(conversation);
    if request_id.as_uuid() == conversation.as_uuid() {
        return Err(CliError::Usage(
            "the request id must differ from the conversation id: pass another --request".into(),
        ));
    }
    let store = open_store(&args_session.db, Access::Create(args_session.limits())).await?;
    let result = async {
        let interrupt = Interrupt::watch();
        let ctx = RunContext::default().with_cancel(interrupt.token());
        if new_conversation && !json {
            // Like all progress, an unwritable line does not stop the run.
            let _ = writeln!(
                out,
                "conversation {conversation} (new: pass --conversation {conversation} to continue it)"
            );
        }
        if generated && !json {
            let _ = writeln!(
                out,
                "request {request_id} (generated: pass --request {request_id} to retry it)"
            );
        }
        let session = leased(
            session(&args_session, store.clone(), model, &approval),
            lease,
        );
        let events = session.stream(request_id, input, ctx);
        // With --json the output is the outcome alone.
        let mut quiet = std::io::sink();
        let shown: &mut dyn Write = if json { &mut quiet } else { &mut *out };
        let mut started = None;
        let progress = &mut Progress::new(style, "  ");
        let followed = follow(events, progress, shown, &mut started).await;
        let agent = AgentFlags::new(&args.model, &approval).leased(lease);
        let followed = report_awaiting(followed, out, style, json, &args_session, &agent);
        let outcome = with_hint(followed, &session, started, &args_session, &agent)
            .await
            .map_err(|e| match generated || new_conversation {
                true => CliError::ForRequest {
                    request_id,
                    conversation_id: new_conversation.then_some(conversation),
                    source: Box::new(e),
                },
                false => e,
            })?;
        show_outcome(
            out,
            style,
            json,
            store.as_ref(),
            conversation,
            &outcome,
        )
        .await
    }
    .await;
    closed(store.as_ref(), result).await
}

pub(super) async fn resume(
    args: ResumeArgs,
    out: &mut dyn Write,
    style: Style,
    json: bool,
) -> Result<(), CliError> {
    let approval = args.approval.tools()?;
    let what = TakeOver::Resume(args.run);
    let target = Target {
        session: &args.session,
        model: &args.model,
        approval: &approval,
        lease: args.lease.policy()?,
        revision: args.revision,
        retry_interrupted: args.retry_interrupted,
        accept_agent_change: args.accept_agent_change,
    };
    take_over(target, what, out, style, json).await
}

pub(super) async fn recover(
    args: RecoverArgs,
    out: &mut dyn Write,
    style: Style,
    json: bool,
) -> Result<(), CliError> {
    let approval = args.approval.tools()?;
    let input = read_input(args.input)?;
    let what = TakeOver::Recover(args.request, input);
    let target = Target {
        session: &args.session,
        model: &args.model,
        approval: &approval,
        lease: args.lease.policy()?,
        revision: args.revision,
        retry_interrupted: args.retry_interrupted,
        accept_agent_change: args.accept_agent_change,
    };
    take_over(target, what, out, style, json).await
}

/// What `resume` and `recover` continue: a stopped run, or the request of
/// an owner that is gone (with its bound input).
enum TakeOver {
    Resume(RunId),
    Recover(RequestId, String),
}

/// The options `resume` and `recover` share.
struct Target<'a> {
    session: &'a SessionArgs,
    model: &'a ModelArgs,
    /// The tools whose calls need approval (checked).
    approval: &'a [String],
    lease: Option<LeasePolicy>,
    revision: Revision,
    retry_interrupted: bool,
    accept_agent_change: bool,
}

/// Continues a request in a new run, with live progress and Ctrl-C.
async fn take_over(
    target: Target<'_>,
    what: TakeOver,
    out: &mut dyn Write,
    style: Style,
    json: bool,
) -> Result<(), CliError> {
    let model = model::load(target.model)?;
    let store = open_store(&target.session.db, Access::Write(target.session.limits())).await?;
    let result = async {
        let session = session(target.session, store.clone(), model, target.approval);
        let session = leased(session, target.lease);
        let interrupt = Interrupt::watch();
        let upgrade = match target.accept_agent_change {
            true => AgentUpgrade::Accept,
            false => AgentUpgrade::Refuse,
        };
        let ctx = RunContext::default()
            .with_cancel(interrupt.token())
            .with_agent_upgrade(upgrade);
        let policy = policy(target.retry_interrupted);
        let events = match what {
            TakeOver::Resume(run) => session.resume_stream(run, ctx, target.revision, policy),
            TakeOver::Recover(request, input) => {
                session.recover_stream(request, input, ctx, target.revision, policy)
            }
        };
        // With --json the output is the outcome alone.
        let mut quiet = std::io::sink();
        let shown: &mut dyn Write = if json { &mut quiet } else { &mut *out };
        let mut started = None;
        let progress = &mut Progress::new(style, "  ");
        let followed = follow(events, progress, shown, &mut started).await;
        let agent = AgentFlags::new(target.model, target.approval).leased(target.lease);
        let followed = report_awaiting(followed, out, style, json, target.session, &agent);
        let outcome = with_hint(followed, &session, started, target.session, &agent)
            .await
            .map_err(|e| match e {
                CliError::Turnstile(source @ turnstile::Error::ConfigurationMismatch { .. }) => {
                    CliError::Advised {
                        source,
                        advice: "resume and recover need the --model and --require-approval \
                                 the request was run with (or --accept-agent-change to continue \
                                 it with this agent)",
                    }
                }
                e => e,
            })?;
        show_outcome(
            out,
            style,
            json,
            store.as_ref(),
            target.session.conversation,
            &outcome,
        )
        .await
    }
    .await;
    closed(store.as_ref(), result).await
}

#[derive(Serialize)]
struct Abandoned {
    conversation_id: ConversationId,
    request_id: RequestId,
    revision: Revision,
}

pub(super) async fn abandon(
    args: AbandonArgs,
    out: &mut dyn Write,
    style: Style,
    json: bool,
) -> Result<(), CliError> {
    let store = open_store(&args.session.db, Access::Write(args.session.limits())).await?;
    // Abandoning calls no model: any agent will do.
    let idle: Arc<dyn Model> = Arc::new(ScriptedModel::new(Vec::new()));
    let abandoned = session(&args.session, store.clone(), idle, &[])
        .abandon(args.request, args.revision)
        .await;
    let revision = closed(&*store, abandoned.map_err(CliError::from)).await?;
    let abandoned = Abandoned {
        conversation_id: args.session.conversation,
        request_id: args.request,
        revision,
    };
    if json {
        return output::json(out, &abandoned);
    }
    output::table(
        out,
        "",
        &[
            (
                "status",
                style.yellow("abandoned (the request id is burned)"),
            ),
            ("request", abandoned.request_id.to_string()),
            ("conversation", abandoned.conversation_id.to_string()),
            ("revision", format!("{revision} (the conversation is idle)")),
        ],
    )
}

/// Drives a streamed execution, printing its events, to its outcome.
///
/// Output that cannot be written (a closed pipe, a full disk) only stops
/// the printing: the run goes on to its commit or its stop, and the output
/// error is reported after it, so a retry with the same request id
/// replays instead of finding the conversation held.
///
/// `started` is set to the run this stream started and the admission
/// revision it holds, if it got that far: what a resume hint may name.
pub(super) async fn follow(
    mut events: EventStream<'_>,
    progress: &mut Progress,
    out: &mut dyn Write,
    started: &mut Option<(RunId, Revision)>,
) -> Result<Outcome, CliError> {
    let mut printing = Printing::To(out);
    let mut outcome = None;
    while let Some(item) = events.next().await {
        let event = match item {
            Ok(event) => event,
            Err(error) => {
                printing.write(|out| progress.finish(out));
                return Err(error.into());
            }
        };
        if let Event::RunStarted {
            run_id, revision, ..
        } = &event
        {
            *started = Some((*run_id, *revision));
        }
        printing.write(|out| progress.event(out, &event));
        if let Event::ConversationCommitted {
            outcome: committed, ..
        } = event
        {
            outcome = Some(*committed);
        }
    }
    printing.write(|out| progress.finish(out));
    let outcome =
        outcome.ok_or_else(|| CliError::Failed("the run ended without an outcome".into()))?;
    match printing {
        Printing::Failed(error) => Err(error),
        Printing::To(_) => Ok(outcome),
    }
}

/// Where progress goes: the output, until a write to it fails.
enum Printing<'a> {
    To(&'a mut dyn Write),
    Failed(CliError),
}

impl Printing<'_> {
    fn write(&mut self, print: impl FnOnce(&mut dyn Write) -> Result<(), CliError>) {
        if let Printing::To(out) = self {
            if let Err(error) = print(&mut **out) {
                *self = Printing::Failed(error);
            }
        }
    }
}

async fn show_outcome(
    out: &mut dyn Write,
    style: Style,
    json: bool,
    store: &dyn Store,
    conversation_id: ConversationId,
    outcome: &Outcome,
) -> Result<(), CliError> {
    // Informational: another request may have moved it since.
    let revision = store.admission(conversation_id).await?.revision;
    if json {
        let committed = Committed {
            conversation_id,
            outcome,
            revision,
        };
        return output::json(out, &committed);
    }
    let resumed_from = store
        .run(outcome.run_id)
        .await?
        .and_then(|run| run.resumed_from);
    output::outcome(out, style, outcome, Some(revision.0), resumed_from)
}

/// A committed (or replayed) request as `--json` prints it: the outcome,
/// its conversation, and the admission revision read after it (the
/// `--revision` a later `delete` or takeover compares against).
#[derive(Serialize)]
struct Committed<'a> {
    conversation_id: ConversationId,
    #[serde(flatten)]
    outcome: &'a Outcome,
    revision: Revision,
}
