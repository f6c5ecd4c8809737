//! `run`, `resume`, `recover` and `abandon`: the session API from a shell.
//!
//! Every argument, the script and the input are checked before the database
//! is opened, so bad input writes nothing (not even a new database file).

use std::future::Future;
use std::io::{Read, Write};
use std::path::Path;
use std::pin::pin;
use std::sync::Arc;

use clap::Args;
use futures_util::Stream;
use serde::Serialize;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::exit::CliError;
use super::interrupt::Interrupt;
use super::model::{self, ModelArgs, ModelSpec};
use super::observe::{Note, Notes, ObservedModel, ObservedTool};
use super::output::{self, Style};
use super::progress::Progress;
use super::{parse_revision, tools, SessionArgs};
use turnstile::agent::{Agent, Model, RunContext, ScriptedModel, Tool};
use turnstile::checkpoint::{CheckpointPhase, LoopCheckpoint};
use turnstile::events::Event;
use turnstile::ids::{ConversationId, RequestId, Revision, RunId};
use turnstile::outcome::Outcome;
use turnstile::session::{AgentSession, ContextPolicy, ResumePolicy};
use turnstile::store::Store;
use turnstile::Error;
use turnstile::{SqliteStore, StoreAdmin};

/// The system prompt of the command-line agent. It is part of the agent
/// fingerprint: `resume` and `recover` accept a request only from the agent
/// it was admitted with.
pub const SYSTEM_PROMPT: &str = "You are a careful assistant. Use the tools add, clock and \
                                 word_count when they help, then answer briefly.";

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub session: SessionArgs,
    /// The request id, the idempotency key of this input. Generated (and
    /// printed) when absent; pass it again to replay instead of re-running.
    #[arg(long, value_name = "UUID")]
    pub request: Option<RequestId>,
    #[command(flatten)]
    pub model: ModelArgs,
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
    #[command(flatten)]
    pub session: SessionArgs,
    #[command(flatten)]
    pub model: ModelArgs,
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
    #[command(flatten)]
    pub session: SessionArgs,
    #[command(flatten)]
    pub model: ModelArgs,
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

/// The command-line agent: `model`, the real tools and [`SYSTEM_PROMPT`];
/// with `notes`, the model and tools report what they do.
pub(super) fn agent(model: Arc<dyn Model>, notes: Option<&Notes>) -> Agent {
    let model: Arc<dyn Model> = match notes {
        Some(notes) => Arc::new(ObservedModel {
            inner: model,
            notes: notes.clone(),
        }),
        None => model,
    };
    tools::toolbox()
        .into_iter()
        .fold(Agent::new(model), |agent, tool| {
            let tool: Arc<dyn Tool> = match notes {
                Some(notes) => Arc::new(ObservedTool {
                    inner: tool,
                    notes: notes.clone(),
                }),
                None => tool,
            };
            agent.with_tool(tool)
        })
        .with_system_prompt(SYSTEM_PROMPT)
}

/// Opens the database; unless `create`, a missing file is not found (and
/// is not created).
pub(super) async fn open_store(db: &Path, create: bool) -> Result<Arc<dyn StoreAdmin>, CliError> {
    if !create && !db.exists() {
        return Err(CliError::MissingDatabase(db.to_owned()));
    }
    Ok(Arc::new(SqliteStore::open(db).await?))
}

/// The input from the argument or stdin; empty input is refused.
fn read_input(arg: Option<String>) -> Result<String, CliError> {
    let input = match arg {
        Some(input) => input,
        None => {
            let mut input = String::new();
            std::io::stdin()
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
    Ok(input)
}

fn session(
    args: &SessionArgs,
    store: Arc<dyn StoreAdmin>,
    model: Arc<dyn Model>,
    notes: Option<&Notes>,
) -> AgentSession {
    AgentSession::new(
        agent(model, notes),
        store,
        args.conversation,
        args.namespace.clone(),
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
    let model = model::load(&args.model)?;
    let input = read_input(args.input)?;
    let generated = args.request.is_none();
    let request_id = args.request.unwrap_or_else(RequestId::new);
    if request_id.as_uuid() == args.session.conversation.as_uuid() {
        return Err(CliError::Usage(
            "the request id must differ from the conversation id".into(),
        ));
    }
    let store = open_store(&args.session.db, true).await?;
    let interrupt = Interrupt::watch();
    let ctx = RunContext::default().with_cancel(interrupt.token());
    let outcome = if json {
        session(&args.session, store.clone(), model, None)
            .run(request_id, &input, ctx)
            .await
            .map_err(CliError::from)
    } else {
        if generated {
            writeln!(
                out,
                "request {request_id} (generated: pass --request {request_id} to retry it)"
            )?;
        }
        let (notes, received) = unbounded_channel();
        let session = session(&args.session, store.clone(), model, Some(&notes));
        let events = session.stream(request_id, input, ctx);
        stream_outcome(events, received, &mut Progress::new(style, "  "), out).await
    };
    let outcome = outcome
        .map_err(|e| resumable(e, &args.session, &args.model))
        .map_err(|e| match generated {
            true => CliError::ForRequest {
                request_id,
                source: Box::new(e),
            },
            false => e,
        })?;
    show_outcome(
        out,
        style,
        json,
        &*store,
        args.session.conversation,
        &outcome,
    )
    .await
}

pub(super) async fn resume(
    args: ResumeArgs,
    out: &mut dyn Write,
    style: Style,
    json: bool,
) -> Result<(), CliError> {
    let what = TakeOver::Resume(args.run);
    let target = Target {
        session: &args.session,
        model: &args.model,
        revision: args.revision,
        retry_interrupted: args.retry_interrupted,
    };
    take_over(target, what, out, style, json).await
}

pub(super) async fn recover(
    args: RecoverArgs,
    out: &mut dyn Write,
    style: Style,
    json: bool,
) -> Result<(), CliError> {
    let input = read_input(args.input)?;
    let what = TakeOver::Recover(args.request, input);
    let target = Target {
        session: &args.session,
        model: &args.model,
        revision: args.revision,
        retry_interrupted: args.retry_interrupted,
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
    revision: Revision,
    retry_interrupted: bool,
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
    let store = open_store(&target.session.db, false).await?;
    let owner = match &what {
        TakeOver::Resume(run) => Some(*run),
        TakeOver::Recover(request, _) => match store.admission(target.session.conversation).await {
            Ok(admission) => admission
                .active
                .filter(|active| active.request_id == *request)
                .map(|active| active.run_id),
            Err(_) => None,
        },
    };
    let mut progress = progress_from(style, &*store, owner).await;
    let (notes, received) = unbounded_channel();
    let session = session(
        target.session,
        store.clone(),
        model,
        (!json).then_some(&notes),
    );
    let interrupt = Interrupt::watch();
    let ctx = RunContext::default().with_cancel(interrupt.token());
    let policy = policy(target.retry_interrupted);
    let outcome = match &what {
        TakeOver::Resume(run) => {
            let work = session.resume_run(*run, ctx, target.revision, policy);
            observe_outcome(work, received, &mut progress, json, out).await
        }
        TakeOver::Recover(request, input) => {
            let work =
                session.recover_after_owner_exit(*request, input, ctx, target.revision, policy);
            observe_outcome(work, received, &mut progress, json, out).await
        }
    }
    .map_err(|e| resumable(e, target.session, target.model))?;
    show_outcome(
        out,
        style,
        json,
        &*store,
        target.session.conversation,
        &outcome,
    )
    .await
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
    let store = open_store(&args.session.db, false).await?;
    // Abandoning calls no model: any agent will do.
    let idle: Arc<dyn Model> = Arc::new(ScriptedModel::new(Vec::new()));
    let revision = session(&args.session, store, idle, None)
        .abandon(args.request, args.revision)
        .await?;
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

/// A stopped run's error with the command that continues it (the run id
/// and revision it carries; the same database, conversation and model).
fn resumable(error: CliError, session: &SessionArgs, model: &ModelArgs) -> CliError {
    let CliError::Turnstile(source) = error else {
        return error;
    };
    let Some((run, revision)) = source.stopped_run() else {
        return CliError::Turnstile(source);
    };
    let mut words = vec![
        "turnstile".to_owned(),
        "resume".into(),
        run.to_string(),
        "--revision".into(),
        revision.to_string(),
        "--db".into(),
        quote(&session.db.display().to_string()),
        "--conversation".into(),
        session.conversation.to_string(),
    ];
    if session.namespace.as_str() != "default" {
        words.extend(["--namespace".into(), quote(session.namespace.as_str())]);
    }
    let spec = match &model.model {
        ModelSpec::Scripted(path) => format!("scripted:{}", path.display()),
        ModelSpec::OpenAi(name) => format!("openai:{name}"),
    };
    words.extend(["--model".into(), quote(&spec)]);
    if let Some(url) = &model.base_url {
        words.extend(["--base-url".into(), quote(url)]);
    }
    if let Some(var) = &model.api_key_env {
        words.extend(["--api-key-env".into(), quote(var)]);
    }
    CliError::Stopped {
        source,
        resume: words.join(" "),
    }
}

/// A shell word: as it is when it is plain, else single-quoted.
fn quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Progress lines for a run that continues `run`, numbering turns from the
/// one its latest checkpoint says comes next. The lookup is cosmetic: if it
/// fails, the turns are simply not numbered (the command reports errors).
pub(super) async fn progress_from(style: Style, store: &dyn Store, run: Option<RunId>) -> Progress {
    let progress = Progress::new(style, "  ");
    let Some(run) = run else { return progress };
    match store.latest_checkpoint(run).await {
        Ok(Some(checkpoint)) => progress.counting_turns_from(next_model_turn(&checkpoint)),
        Ok(None) => progress.counting_turns_from(1),
        Err(_) => progress,
    }
}

/// The turn whose model answer comes next after `checkpoint`.
pub(super) fn next_model_turn(checkpoint: &LoopCheckpoint) -> u32 {
    match checkpoint.phase {
        CheckpointPhase::TurnInFlight | CheckpointPhase::ModelPending => checkpoint.turn,
        _ => checkpoint.turn + 1,
    }
}

/// Drives a streamed request, printing its events, to its outcome.
pub(super) async fn stream_outcome(
    events: impl Stream<Item = Result<Event, Error>>,
    mut notes: UnboundedReceiver<Note>,
    progress: &mut Progress,
    out: &mut dyn Write,
) -> Result<Outcome, CliError> {
    let mut events = pin!(events);
    let mut outcome = None;
    while let Some(item) = std::future::poll_fn(|cx| events.as_mut().poll_next(cx)).await {
        // A tool's note is sent before its result is journaled, so it is
        // here by the time its `ToolFinished` event is.
        while let Ok(note) = notes.try_recv() {
            progress.note(out, note, true)?;
        }
        match item {
            Ok(Event::ConversationCommitted {
                outcome: committed,
                conversation_version,
            }) => {
                if !committed.replayed {
                    let event = Event::ConversationCommitted {
                        outcome: committed.clone(),
                        conversation_version,
                    };
                    progress.event(out, &event)?;
                }
                outcome = Some(*committed);
            }
            Ok(event) => progress.event(out, &event)?,
            Err(error) => {
                progress.finish(out)?;
                return Err(error.into());
            }
        }
    }
    progress.finish(out)?;
    outcome.ok_or_else(|| CliError::Failed("the run ended without an outcome".into()))
}

/// Awaits a resume or recovery, printing what its observed model and tools
/// report (unless `json`).
pub(super) async fn observe_outcome(
    work: impl Future<Output = Result<Outcome, Error>>,
    mut notes: UnboundedReceiver<Note>,
    progress: &mut Progress,
    json: bool,
    out: &mut dyn Write,
) -> Result<Outcome, CliError> {
    let mut work = pin!(work);
    let result = loop {
        tokio::select! {
            biased;
            Some(note) = notes.recv() => {
                if !json {
                    progress.note(out, note, false)?;
                }
            }
            result = &mut work => break result,
        }
    };
    while let Ok(note) = notes.try_recv() {
        if !json {
            progress.note(out, note, false)?;
        }
    }
    progress.finish(out)?;
    Ok(result?)
}

async fn show_outcome(
    out: &mut dyn Write,
    style: Style,
    json: bool,
    store: &dyn Store,
    conversation_id: ConversationId,
    outcome: &Outcome,
) -> Result<(), CliError> {
    if json {
        return output::json(out, outcome);
    }
    // Informational: another request may have moved it since.
    let revision = store.admission(conversation_id).await?.revision;
    let resumed_from = store
        .run(outcome.run_id)
        .await?
        .and_then(|run| run.resumed_from);
    output::outcome(out, style, outcome, Some(revision.0), resumed_from)
}
