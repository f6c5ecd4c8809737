//! `resume` (a stopped run) and `recover` (the request of an owner that is
//! gone): each continues a request in a new run, by compare-and-swap on
//! the admission revision.

use std::io::Write;

use clap::Args;

use super::access::Access;
use super::agent::session;
use super::agent_args::AgentArgs;
use super::approvals::report_awaiting;
use super::args::{parse_revision, ContinueArgs, SessionArgs};
use super::committed::show_outcome;
use super::exit::CliError;
use super::follow::follow;
use super::hint::{with_hint, AgentFlags};
use super::input::{read_input, AttachArgs};
use super::interrupt::Interrupt;
use super::lease::{leased, LeaseArgs};
use super::mcp::McpArgs;
use super::model::{self, ModelArgs};
use super::output::Style;
use super::progress::Progress;
use super::store::{closed, open_store};
use turnstile::agent::{AgentUpgrade, RunContext};
use turnstile::ids::{RequestId, Revision, RunId};
use turnstile::session::ResumePolicy;
use turnstile::{Content, LeasePolicy};

#[derive(Args, Debug)]
pub struct ResumeArgs {
    /// The stopped run to continue.
    #[arg(value_name = "RUN_ID")]
    pub run: RunId,
    /// The admission revision you saw (compare-and-swap token).
    #[arg(long, value_name = "N", value_parser = parse_revision, allow_hyphen_values = true)]
    pub revision: Revision,
    #[command(flatten)]
    pub continuing: ContinueArgs,
    #[command(flatten)]
    pub session: SessionArgs,
    #[command(flatten)]
    pub agent: AgentArgs,
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
    #[command(flatten)]
    pub continuing: ContinueArgs,
    #[command(flatten)]
    pub session: SessionArgs,
    #[command(flatten)]
    pub agent: AgentArgs,
    #[command(flatten)]
    pub lease: LeaseArgs,
    /// The files the request was first given, in the same order.
    #[command(flatten)]
    pub attach: AttachArgs,
    /// The request's input, exactly as first given. Read from stdin when
    /// absent (trailing newlines dropped).
    #[arg(value_name = "INPUT")]
    pub input: Option<String>,
}

fn policy(retry_interrupted: bool) -> ResumePolicy {
    if retry_interrupted {
        ResumePolicy::RetryInterruptedTurn
    } else {
        ResumePolicy::RejectAmbiguous
    }
}

pub(super) async fn resume(
    args: ResumeArgs,
    out: &mut dyn Write,
    style: Style,
    json: bool,
) -> Result<(), CliError> {
    let approval = args.agent.approval.tools()?;
    let what = TakeOver::Resume(args.run);
    let target = Target {
        session: &args.session,
        model: &args.agent.model,
        mcp: &args.agent.mcp,
        approval: &approval,
        lease: args.lease.policy()?,
        revision: args.revision,
        continuing: args.continuing,
    };
    take_over(target, what, out, style, json).await
}

pub(super) async fn recover(
    args: RecoverArgs,
    out: &mut dyn Write,
    style: Style,
    json: bool,
) -> Result<(), CliError> {
    let approval = args.agent.approval.tools()?;
    let input = args.attach.content(read_input(args.input)?)?;
    let what = TakeOver::Recover(args.request, input);
    let target = Target {
        session: &args.session,
        model: &args.agent.model,
        mcp: &args.agent.mcp,
        approval: &approval,
        lease: args.lease.policy()?,
        revision: args.revision,
        continuing: args.continuing,
    };
    take_over(target, what, out, style, json).await
}

/// What `resume` and `recover` continue: a stopped run, or the request of
/// an owner that is gone (with its bound input).
enum TakeOver {
    Resume(RunId),
    Recover(RequestId, Content),
}

/// The options `resume` and `recover` share.
struct Target<'a> {
    session: &'a SessionArgs,
    model: &'a ModelArgs,
    mcp: &'a McpArgs,
    /// The tools whose calls need approval (checked).
    approval: &'a [String],
    lease: Option<LeasePolicy>,
    revision: Revision,
    continuing: ContinueArgs,
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
    let mcp = target.mcp.connect().await?;
    let store = open_store(&target.session.db, Access::Write(target.session.limits())).await?;
    let result = async {
        let session = session(target.session, store.clone(), model, target.approval, &mcp);
        let session = leased(session, target.lease);
        let interrupt = Interrupt::watch();
        let upgrade = match target.continuing.accept_agent_change {
            true => AgentUpgrade::Accept,
            false => AgentUpgrade::Refuse,
        };
        let ctx = RunContext::default()
            .with_cancel(interrupt.token())
            .with_agent_upgrade(upgrade)
            .with_budget(target.continuing.budget.as_given());
        let policy = policy(target.continuing.retry_interrupted);
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
        let agent = AgentFlags::new(target.model, target.approval, target.mcp).leased(target.lease);
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
