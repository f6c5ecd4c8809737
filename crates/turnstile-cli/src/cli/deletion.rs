//! `delete` (a conversation and everything of it, its id and request ids
//! left as tombstones) and `fork` (a new conversation from a prefix of
//! another's committed history).

use std::io::Write;

use clap::Args;
use serde::Serialize;

use super::access::{Access, Limits};
use super::args::parse_revision;
use super::db::DbLocation;
use super::exit::CliError;
use super::output;
use super::store::{closed, open_store};
use super::Style;
use turnstile::ids::{ConversationId, Namespace, Revision};

#[derive(Args, Debug)]
pub struct DeleteArgs {
    /// The conversation to delete.
    #[arg(value_name = "CONVERSATION")]
    pub conversation: ConversationId,
    /// The database: a SQLite file, or a PostgreSQL URL.
    #[arg(long, value_name = "PATH|URL")]
    pub db: DbLocation,
    /// The conversation version you saw (`show`, `ls`): a request committed
    /// since refuses the delete (exit 5).
    #[arg(long, value_name = "N")]
    pub version: u64,
    /// The admission revision of the active request holding the
    /// conversation: deletes it anyway (without it, a held conversation is
    /// busy, exit 3). Its run, if still alive, is fenced.
    #[arg(long, value_name = "N", value_parser = parse_revision)]
    pub revision: Option<Revision>,
    /// The tenant namespace of the conversation.
    #[arg(long, value_name = "NS", default_value = Namespace::DEFAULT)]
    pub namespace: Namespace,
}

#[derive(Args, Debug)]
pub struct ForkArgs {
    /// The conversation to fork (left untouched).
    #[arg(value_name = "CONVERSATION")]
    pub conversation: ConversationId,
    /// How many committed entries the fork keeps: seqs `0..SEQ`.
    #[arg(long, value_name = "SEQ")]
    pub through: u64,
    /// The new conversation's id (a new one when absent).
    #[arg(long, value_name = "UUID")]
    pub new_conversation: Option<ConversationId>,
    /// The database: a SQLite file, or a PostgreSQL URL.
    #[arg(long, value_name = "PATH|URL")]
    pub db: DbLocation,
    /// The tenant namespace of both conversations.
    #[arg(long, value_name = "NS", default_value = Namespace::DEFAULT)]
    pub namespace: Namespace,
}

pub(super) async fn delete(
    args: DeleteArgs,
    out: &mut dyn Write,
    style: Style,
    json: bool,
) -> Result<(), CliError> {
    let store = open_store(&args.db, Access::Write(Limits::default())).await?;
    let result = store
        .delete_conversation(
            &args.namespace,
            args.conversation,
            args.version,
            args.revision,
        )
        .await
        .map_err(CliError::from);
    let report = closed(store.as_ref(), result).await?;
    if json {
        return output::json(out, &report);
    }
    writeln!(
        out,
        "{} conversation {}: {} rows; {} request id(s) kept as tombstones; {} page(s) given back",
        style.bold("deleted"),
        report.conversation_id,
        report.deleted.total() + report.summaries,
        report.tombstoned_requests,
        report.pages_freed
    )?;
    let mut rows: Vec<(&str, String)> = report
        .deleted
        .rows()
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|&(table, n)| (table, n.to_string()))
        .collect();
    if report.summaries > 0 {
        rows.push(("summaries", report.summaries.to_string()));
    }
    output::table(out, "  ", &rows)
}

/// What `fork --json` prints.
#[derive(Serialize)]
struct Forked {
    conversation_id: ConversationId,
    entries: u64,
}

pub(super) async fn fork(args: ForkArgs, out: &mut dyn Write, json: bool) -> Result<(), CliError> {
    let new_id = args.new_conversation.unwrap_or_else(ConversationId::new);
    let store = open_store(&args.db, Access::Write(Limits::default())).await?;
    let result = store
        .fork_conversation(&args.namespace, args.conversation, args.through, new_id)
        .await
        .map_err(CliError::from);
    let outcome = closed(store.as_ref(), result).await?;
    if json {
        return output::json(
            out,
            &Forked {
                conversation_id: outcome.conversation_id,
                entries: outcome.entries,
            },
        );
    }
    writeln!(out, "{}", outcome.conversation_id)?;
    Ok(())
}
