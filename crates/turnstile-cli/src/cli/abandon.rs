//! `abandon`: releases a request's admission without committing; its id
//! is burned.

use std::io::Write;
use std::sync::Arc;

use clap::Args;
use serde::Serialize;

use super::access::Access;
use super::agent::session;
use super::args::{parse_revision, SessionArgs};
use super::exit::CliError;
use super::output::{self, Style};
use super::store::{closed, open_store};
use turnstile::agent::{Model, ScriptedModel};
use turnstile::ids::{ConversationId, RequestId, Revision};

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
    let abandoned = session(&args.session, store.clone(), idle, &[], &[])
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
