//! Human approval of tool calls from a shell: `--require-approval` (which
//! tools' calls wait for a decision), what `run`, `resume` and `recover`
//! print when a run stops for one (exit 6), `approvals` (what waits) and
//! `approve` / `reject` (each a compare-and-swap that moves the revision on
//! and prints the command to run next).

use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

use clap::Args;
use serde::Serialize;

use super::access::Access;
use super::agent::session;
use super::args::{parse_revision, SessionArgs};
use super::db::DbLocation;
use super::exit::CliError;
use super::hint::{self, AgentFlags, Decision};
use super::model::{ModelSpec, ReplayArg};
use super::ops::utc;
use super::output::{self, Style};
use super::store::{closed, open_store};
use super::tools;
use turnstile::ids::{ConversationId, Namespace, RequestId, Revision, RunId};
use turnstile::session::AgentSession;
use turnstile::store::{PendingApproval, MAX_REJECTION_REASON_BYTES};
use turnstile::Error;

/// `--require-approval` of `run`, `resume` and `recover`.
#[derive(Args, Clone, Debug, Default)]
pub struct ApprovalArgs {
    /// Tools whose every call waits for a human's approval (`add,clock`;
    /// repeatable): when the model asks for one, the run stops (exit 6) and
    /// prints the calls and the commands that decide them. Part of the
    /// agent: `resume` and `recover` need the same set as the run.
    #[arg(long, value_name = "TOOL[,TOOL]", value_delimiter = ',')]
    pub require_approval: Vec<String>,
}

impl ApprovalArgs {
    /// The tool names, checked, sorted and without repeats.
    pub(super) fn tools(&self) -> Result<Vec<String>, CliError> {
        checked(&self.require_approval)
    }
}

/// Every name a tool of the command-line agent, sorted, without repeats.
fn checked(names: &[String]) -> Result<Vec<String>, CliError> {
    let known: Vec<String> = tools::toolbox().iter().map(|t| t.spec().name).collect();
    let mut tools = Vec::with_capacity(names.len());
    for name in names {
        if !known.contains(name) {
            return Err(CliError::Usage(format!(
                "--require-approval: unknown tool {name:?} (the tools are {})",
                known.join(", ")
            )));
        }
        tools.push(name.clone());
    }
    tools.sort();
    tools.dedup();
    Ok(tools)
}

#[derive(Args, Debug)]
pub struct ApprovalsArgs {
    /// The database: a SQLite file, or a PostgreSQL URL.
    #[arg(long, value_name = "PATH|URL")]
    pub db: DbLocation,
    /// Only this conversation's calls (every conversation's when absent).
    #[arg(long, value_name = "UUID")]
    pub conversation: Option<ConversationId>,
    /// Only calls of conversations in this namespace, with or without
    /// --conversation (which must then be in it); every namespace when
    /// absent.
    #[arg(long, value_name = "NS")]
    pub namespace: Option<Namespace>,
}

/// What `approve` and `reject` share.
#[derive(Args, Debug)]
pub struct DecideArgs {
    /// The request whose run stopped for approval.
    #[arg(value_name = "REQUEST_ID")]
    pub request: RequestId,
    /// The tool call (its id, as `approvals` lists it).
    #[arg(value_name = "CALL_ID")]
    pub call: String,
    /// The admission revision you saw (compare-and-swap token). Each
    /// decision moves it on and prints the new one.
    #[arg(long, value_name = "N", value_parser = parse_revision, allow_hyphen_values = true)]
    pub revision: Revision,
    #[command(flatten)]
    pub session: SessionArgs,
    #[command(flatten)]
    pub next: NextArgs,
}

/// The run's agent options, only to print the `turnstile resume` command
/// that continues the request once every call is decided: deciding calls no
/// model.
#[derive(Args, Debug)]
pub struct NextArgs {
    /// The run's --model, for the printed `turnstile resume` command
    /// (nothing is loaded or called).
    #[arg(long, value_name = "scripted:FILE|openai:NAME|anthropic:NAME")]
    pub model: Option<ModelSpec>,
    /// The run's --base-url, for that command.
    #[arg(long, value_name = "URL", requires = "model")]
    pub base_url: Option<String>,
    /// The run's --api-key-env, for that command.
    #[arg(long, value_name = "VAR", requires = "model")]
    pub api_key_env: Option<String>,
    /// The run's --reasoning-replay, for that command.
    #[arg(long, value_name = "WHICH", requires = "model")]
    pub reasoning_replay: Option<ReplayArg>,
    /// The run's --thinking-budget, for that command.
    #[arg(long, value_name = "TOKENS", requires = "model")]
    pub thinking_budget: Option<u32>,
    /// The run's --mcp-stdio servers, for that command.
    #[arg(long = "mcp-stdio", value_name = "COMMAND", requires = "model")]
    pub mcp_stdio: Vec<String>,
    /// The run's --mcp-http servers, for that command.
    #[arg(long = "mcp-http", value_name = "URL", requires = "model")]
    pub mcp_http: Vec<String>,
    /// The run's --require-approval, for that command.
    #[arg(long, value_name = "TOOL[,TOOL]", value_delimiter = ',')]
    pub require_approval: Vec<String>,
}

#[derive(Args, Debug)]
pub struct ApproveArgs {
    #[command(flatten)]
    pub decide: DecideArgs,
}

#[derive(Args, Debug)]
pub struct RejectArgs {
    #[command(flatten)]
    pub decide: DecideArgs,
    /// Why: the model is given it as the call's error result (at most 4096
    /// bytes). The call never runs.
    #[arg(long, value_name = "TEXT")]
    pub reason: String,
}

/// `approvals --json`: one object, as every listing is, with its items and
/// `next`, the cursor of a next page (always `null`: every waiting call is
/// listed).
#[derive(Serialize)]
struct Listed<'a> {
    approvals: Vec<Pending<'a>>,
    next: Option<String>,
}

/// One waiting call as `approvals --json` (and a run's exit 6 with
/// `--json`) writes it.
#[derive(Serialize)]
struct Pending<'a> {
    conversation_id: ConversationId,
    request_id: RequestId,
    run_id: RunId,
    turn: u32,
    call_id: &'a str,
    tool: &'a str,
    /// The arguments exactly as the model gave them (JSON text).
    arguments: &'a str,
    revision: Revision,
    /// Unix milliseconds.
    requested_at: i64,
}

impl<'a> From<&'a PendingApproval> for Pending<'a> {
    fn from(p: &'a PendingApproval) -> Self {
        Self {
            conversation_id: p.conversation_id,
            request_id: p.request_id,
            run_id: p.run_id,
            turn: p.turn,
            call_id: &p.call_id,
            tool: &p.tool,
            arguments: &p.arguments,
            revision: p.revision,
            requested_at: p.requested_at,
        }
    }
}

/// A run's exit 6 with `--json`.
#[derive(Serialize)]
struct Awaiting<'a> {
    status: &'static str,
    request_id: RequestId,
    run_id: RunId,
    revision: Revision,
    pending: Vec<Pending<'a>>,
}

/// After a streamed run: when it stopped to wait for approval, prints the
/// calls and the commands that decide them (a JSON document with `--json`).
/// The result is returned as it is (the error exits 6); output that cannot
/// be written is not reported, the stop is.
pub(super) fn report_awaiting<T>(
    result: Result<T, CliError>,
    out: &mut dyn Write,
    style: Style,
    json: bool,
    session: &SessionArgs,
    agent: &AgentFlags<'_>,
) -> Result<T, CliError> {
    if let Err(CliError::Turnstile(Error::AwaitingApproval {
        request_id,
        run_id,
        revision,
        pending,
    })) = &result
    {
        let _ = match json {
            true => output::json(
                out,
                &Awaiting {
                    status: "awaiting_approval",
                    request_id: *request_id,
                    run_id: *run_id,
                    revision: *revision,
                    pending: pending.iter().map(Pending::from).collect(),
                },
            ),
            false => awaiting_block(out, style, *run_id, *revision, pending, session, agent),
        };
    }
    result
}

fn awaiting_block(
    out: &mut dyn Write,
    style: Style,
    run_id: RunId,
    revision: Revision,
    pending: &[PendingApproval],
    session: &SessionArgs,
    agent: &AgentFlags<'_>,
) -> Result<(), CliError> {
    let Some(first) = pending.first() else {
        return Ok(());
    };
    let calls = match pending.len() {
        1 => "1 tool call".to_owned(),
        n => format!("{n} tool calls"),
    };
    writeln!(
        out,
        "{} · request {} · run {run_id} · revision {revision} · {calls}",
        style.yellow("awaiting approval"),
        first.request_id,
    )?;
    for call in pending {
        writeln!(out, "  {}", call_line(call))?;
    }
    decide_next(out, "", first, revision, session, Some(agent))?;
    out.flush()?;
    Ok(())
}

/// `call ID · TOOL ARGUMENTS`, every character of the model's made safe and
/// on one line. The arguments are shown whole: they are what is approved.
fn call_line(call: &PendingApproval) -> String {
    format!(
        "call {} · {} {}",
        one_line(&call.call_id),
        one_line(&call.tool),
        one_line(&call.arguments)
    )
}

/// [`output::plain`] with newlines and tabs escaped too: text from a model
/// that cannot start a line of its own (or forge a command).
fn one_line(text: &str) -> String {
    output::plain(text)
        .chars()
        .flat_map(|c| match c {
            '\n' | '\t' => c.escape_unicode().collect::<Vec<_>>(),
            c => vec![c],
        })
        .collect()
}

/// The commands that decide `call` at `revision`.
fn decide_next(
    out: &mut dyn Write,
    indent: &str,
    call: &PendingApproval,
    revision: Revision,
    session: &SessionArgs,
    agent: Option<&AgentFlags<'_>>,
) -> Result<(), CliError> {
    writeln!(
        out,
        "{indent}decide call {} (each decision prints the new revision and the next command; \
         a rejection needs its reason, written after --reason):",
        one_line(&call.call_id)
    )?;
    for decision in [Decision::Approve, Decision::Reject] {
        let command = hint::decide_command(
            decision,
            call.request_id,
            &call.call_id,
            revision,
            session,
            agent,
        );
        writeln!(out, "{indent}  {command}")?;
    }
    Ok(())
}

/// `turnstile approvals`: the tool calls that wait for a decision.
pub(super) async fn list(
    args: ApprovalsArgs,
    out: &mut dyn Write,
    style: Style,
    json: bool,
) -> Result<(), CliError> {
    let store = open_store(&args.db, Access::Read).await?;
    let result = async {
        if let Some(id) = args.conversation {
            match &args.namespace {
                // The store's own check: not found, or in another namespace.
                Some(namespace) => {
                    store.conversation(namespace, id).await?;
                }
                None => {
                    namespace_of(store.as_ref(), id).await?;
                }
            }
        }
        let mut pending = store.pending_approvals(args.conversation).await?;
        if let (Some(namespace), None) = (&args.namespace, args.conversation) {
            let mut kept = Vec::with_capacity(pending.len());
            for p in pending {
                if namespace_of(store.as_ref(), p.conversation_id).await? == *namespace {
                    kept.push(p);
                }
            }
            pending = kept;
        }
        // The namespace of each conversation, for the printed commands.
        let mut namespaces = HashMap::new();
        if !json {
            for p in &pending {
                if namespaces.contains_key(&p.conversation_id) {
                    continue;
                }
                let namespace = match (&args.namespace, args.conversation) {
                    (Some(namespace), Some(_)) => namespace.clone(),
                    _ => namespace_of(store.as_ref(), p.conversation_id).await?,
                };
                namespaces.insert(p.conversation_id, namespace);
            }
        }
        Ok((pending, namespaces))
    }
    .await;
    let (pending, namespaces) = closed(store.as_ref(), result).await?;
    if json {
        let approvals: Vec<Pending<'_>> = pending.iter().map(Pending::from).collect();
        return output::json(
            out,
            &Listed {
                approvals,
                next: None,
            },
        );
    }
    if pending.is_empty() {
        writeln!(out, "no tool calls await approval")?;
        return Ok(());
    }
    // Grouped by request, oldest first.
    let mut requests: Vec<(RequestId, Vec<&PendingApproval>)> = Vec::new();
    for p in &pending {
        match requests.iter_mut().find(|(id, _)| *id == p.request_id) {
            Some((_, calls)) => calls.push(p),
            None => requests.push((p.request_id, vec![p])),
        }
    }
    for (i, (request_id, calls)) in requests.iter().enumerate() {
        if i > 0 {
            writeln!(out)?;
        }
        let first = calls[0];
        writeln!(
            out,
            "{} · conversation {} · run {} · revision {}",
            style.bold(&format!("request {request_id}")),
            first.conversation_id,
            first.run_id,
            first.revision
        )?;
        for call in calls {
            writeln!(
                out,
                "  {} · asked {} UTC",
                call_line(call),
                utc(call.requested_at)
            )?;
        }
        // Looked up above for every conversation listed.
        let Some(namespace) = namespaces.get(&first.conversation_id).cloned() else {
            continue;
        };
        let session = SessionArgs {
            db: args.db.clone(),
            conversation: first.conversation_id,
            namespace,
            max_db_bytes: None,
            busy_timeout: None,
        };
        decide_next(out, "  ", first, first.revision, &session, None)?;
    }
    Ok(())
}

/// A conversation's namespace; not found when there is no such
/// conversation.
async fn namespace_of(
    store: &dyn turnstile::StoreAdmin,
    id: ConversationId,
) -> Result<Namespace, CliError> {
    // The running-owner threshold only colours `show`; unused here.
    let summary = store
        .conversation_summary(id, Duration::from_secs(300))
        .await?
        .ok_or_else(|| Error::NotFound {
            what: "conversation",
            id: id.to_string(),
        })?;
    Ok(summary.namespace)
}

pub(super) async fn approve(
    args: ApproveArgs,
    out: &mut dyn Write,
    style: Style,
    json: bool,
) -> Result<(), CliError> {
    decide(args.decide, None, out, style, json).await
}

pub(super) async fn reject(
    args: RejectArgs,
    out: &mut dyn Write,
    style: Style,
    json: bool,
) -> Result<(), CliError> {
    // Refused here, before the database is opened.
    if args.reason.len() > MAX_REJECTION_REASON_BYTES {
        return Err(CliError::Usage(format!(
            "the reason is over the {MAX_REJECTION_REASON_BYTES}-byte limit"
        )));
    }
    decide(args.decide, Some(args.reason), out, style, json).await
}

#[derive(Serialize)]
struct Decided {
    revision: Revision,
}

/// What comes after a decision.
enum Next {
    /// Calls of the request still wait: the first one to decide.
    Decide(PendingApproval, usize),
    /// Every call is decided: the run that continues, at this revision.
    Resume(RunId, Revision),
}

async fn decide(
    args: DecideArgs,
    reason: Option<String>,
    out: &mut dyn Write,
    style: Style,
    json: bool,
) -> Result<(), CliError> {
    let approval = checked(&args.next.require_approval)?;
    let store = open_store(&args.session.db, Access::Write(args.session.limits())).await?;
    let result = async {
        // Deciding calls no model: any agent will do.
        let session = session(&args.session, store.clone(), idle_model(), &[], &[]);
        let revision = match &reason {
            None => {
                session
                    .approve(args.request, &args.call, args.revision)
                    .await
            }
            Some(reason) => {
                let (request, call) = (args.request, &args.call);
                session.reject(request, call, args.revision, reason).await
            }
        }?;
        // Informational, and read after the decision: a failure to read it
        // does not undo the decision, so it is not reported.
        let next = match json {
            true => None,
            false => next_step(&session, args.request).await,
        };
        Ok((revision, next))
    }
    .await;
    let (revision, next) = closed(store.as_ref(), result).await?;
    if json {
        return output::json(out, &Decided { revision });
    }
    let what = match reason {
        None => style.green("approved"),
        Some(_) => style.yellow("rejected"),
    };
    writeln!(
        out,
        "{what} call {} of request {} · revision {revision}",
        one_line(&args.call),
        args.request
    )?;
    let agent = args.next.model.as_ref().map(|model| AgentFlags {
        model,
        base_url: args.next.base_url.as_deref(),
        api_key_env: args.next.api_key_env.as_deref(),
        reasoning_replay: args.next.reasoning_replay,
        thinking_budget: args.next.thinking_budget,
        mcp_stdio: &args.next.mcp_stdio,
        mcp_http: &args.next.mcp_http,
        require_approval: &approval,
        lease: None,
    });
    match next {
        Some(Next::Decide(call, waiting)) => {
            let more = match waiting {
                1 => "1 call still awaits a decision".to_owned(),
                n => format!("{n} calls still await a decision"),
            };
            writeln!(out, "{more}:")?;
            writeln!(out, "  {}", call_line(&call))?;
            decide_next(out, "", &call, revision, &args.session, agent.as_ref())?;
        }
        Some(Next::Resume(run, revision)) => {
            let mut missing = Vec::new();
            if agent.is_none() {
                missing.push("--model");
            }
            if approval.is_empty() {
                missing.push("--require-approval");
            }
            let add = match missing.is_empty() {
                true => String::new(),
                false => format!(" (add the run's {})", missing.join(" and ")),
            };
            writeln!(
                out,
                "every call is decided; continue the request with{add}:"
            )?;
            let command = hint::resume_command(run, revision, &args.session, agent.as_ref());
            writeln!(out, "  {command}")?;
        }
        None => {}
    }
    Ok(())
}

/// The next call of the request to decide, or the run to resume.
async fn next_step(session: &AgentSession, request: RequestId) -> Option<Next> {
    let waiting: Vec<PendingApproval> = session
        .pending_approvals()
        .await
        .ok()?
        .into_iter()
        .filter(|p| p.request_id == request)
        .collect();
    let count = waiting.len();
    if let Some(first) = waiting.into_iter().next() {
        return Some(Next::Decide(first, count));
    }
    let admission = session.admission().await.ok()?;
    let active = admission.active?;
    (active.request_id == request).then_some(Next::Resume(active.run_id, admission.revision))
}

fn idle_model() -> std::sync::Arc<dyn turnstile::agent::Model> {
    std::sync::Arc::new(turnstile::agent::ScriptedModel::new(Vec::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names_are_checked_sorted_and_deduplicated() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            checked(&names(&["word_count", "add", "add"])).unwrap(),
            names(&["add", "word_count"])
        );
        assert!(checked(&[]).unwrap().is_empty());
        for bad in [&["nope"][..], &[""], &["add", "Add"]] {
            assert!(
                matches!(checked(&names(bad)), Err(CliError::Usage(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn one_line_escapes_line_breaks_and_control_characters() {
        assert_eq!(one_line("{\"a\":\n1}"), "{\"a\":\\u{a}1}");
        assert_eq!(one_line("x\u{1b}[2Jy\t"), "x\\u{1b}[2Jy\\u{9}");
        assert_eq!(one_line("plain"), "plain");
    }
}
