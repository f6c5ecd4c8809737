//! `run`: a request on a conversation (a new one when none is named), or
//! its replay when it is already committed. Every argument, the script and
//! the input are checked before the database is opened, so bad input
//! writes nothing (not even a new database file). A run that stops to wait
//! for approval of tool calls exits 6 (see [`super::approvals`]).

use std::io::Write;

use clap::Args;

use super::access::Access;
use super::agent::session;
use super::agent_args::AgentArgs;
use super::approvals::report_awaiting;
use super::args::NewSessionArgs;
use super::budget_args::BudgetArgs;
use super::committed::show_outcome;
use super::exit::CliError;
use super::follow::follow;
use super::hint::{with_hint, AgentFlags};
use super::input::{read_input, AttachArgs};
use super::interrupt::Interrupt;
use super::lease::{leased, LeaseArgs};
use super::model;
use super::output::Style;
use super::progress::Progress;
use super::store::{closed, open_store};
use turnstile::agent::RunContext;
use turnstile::ids::{ConversationId, RequestId};

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub session: NewSessionArgs,
    /// The request id, the idempotency key of this input. Generated (and
    /// printed) when absent; pass it again to replay instead of re-running.
    #[arg(long, value_name = "UUID")]
    pub request: Option<RequestId>,
    #[command(flatten)]
    pub agent: AgentArgs,
    #[command(flatten)]
    pub lease: LeaseArgs,
    #[command(flatten)]
    pub budget: BudgetArgs,
    #[command(flatten)]
    pub attach: AttachArgs,
    /// The user input. Read from stdin when absent (trailing newlines
    /// dropped).
    #[arg(value_name = "INPUT")]
    pub input: Option<String>,
}

pub(super) async fn run(
    args: RunArgs,
    out: &mut dyn Write,
    style: Style,
    json: bool,
) -> Result<(), CliError> {
    let approval = args.agent.approval.tools()?;
    let lease = args.lease.policy()?;
    let model = model::load(&args.agent.model)?;
    let input = args.attach.content(read_input(args.input)?)?;
    let mcp = args.agent.mcp.connect().await?;
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
        let ctx = RunContext::default()
            .with_cancel(interrupt.token())
            .with_budget(args.budget.for_new_request());
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
            session(&args_session, store.clone(), model, &approval, &mcp),
            lease,
        );
        let events = session.stream(request_id, input, ctx);
        // With --json the output is the outcome alone.
        let mut quiet = std::io::sink();
        let shown: &mut dyn Write = if json { &mut quiet } else { &mut *out };
        let mut started = None;
        let progress = &mut Progress::new(style, "  ");
        let followed = follow(events, progress, shown, &mut started).await;
        let agent = AgentFlags::new(&args.agent.model, &approval, &args.agent.mcp).leased(lease);
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
