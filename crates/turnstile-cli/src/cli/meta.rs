//! `turnstile meta CONV`: shows a conversation's title, owner and metadata,
//! or changes them with one compare-and-swap on their version.

use std::io::Write;

use clap::Args;
use serde::Serialize;

use super::access::Access;
use super::db::DbLocation;
use super::exit::CliError;
use super::ops::utc;
use super::output::{self, Style};
use super::store::{closed, open_store};
use super::text::echoed;
use turnstile::ids::{ConversationId, Namespace};
use turnstile::store::{ConversationMeta, MetaUpdate};
use turnstile::Error;

#[derive(Args, Debug)]
pub struct MetaArgs {
    /// The conversation.
    #[arg(value_name = "CONVERSATION")]
    pub conversation: ConversationId,
    /// The database: a SQLite file, or a PostgreSQL URL.
    #[arg(long, value_name = "PATH|URL")]
    pub db: DbLocation,
    /// The conversation's namespace.
    #[arg(long, value_name = "NS", default_value = Namespace::DEFAULT)]
    pub namespace: Namespace,
    /// Set metadata key K to the string V (repeatable).
    #[arg(long, value_name = "K=V")]
    pub set: Vec<String>,
    /// Set metadata key K to a JSON value (repeatable): `--set-json n=3`.
    #[arg(long, value_name = "K=JSON")]
    pub set_json: Vec<String>,
    /// Remove metadata key K (repeatable).
    #[arg(long, value_name = "K")]
    pub unset: Vec<String>,
    /// Set the title.
    #[arg(long, value_name = "TITLE", conflicts_with = "no_title")]
    pub title: Option<String>,
    /// Clear the title.
    #[arg(long)]
    pub no_title: bool,
    /// Set the owner.
    #[arg(long, value_name = "OWNER", conflicts_with = "no_owner")]
    pub owner: Option<String>,
    /// Clear the owner.
    #[arg(long)]
    pub no_owner: bool,
    /// The metadata version the change is based on (a compare-and-swap:
    /// exit 5 if it moved). Without it, the current version is read first.
    #[arg(long, value_name = "N")]
    pub version: Option<u64>,
    /// Create the conversation (with this metadata) if it does not exist,
    /// instead of exiting 4.
    #[arg(long)]
    pub create: bool,
}

/// What `--json` prints: the metadata, with the conversation it is of.
#[derive(Serialize)]
struct Shown<'a> {
    conversation_id: ConversationId,
    namespace: &'a Namespace,
    #[serde(flatten)]
    meta: &'a ConversationMeta,
}

pub(super) async fn run(
    args: MetaArgs,
    out: &mut dyn Write,
    style: Style,
    json: bool,
) -> Result<(), CliError> {
    let update = update_of(&args)?;
    let access = match (update.is_empty(), args.create) {
        (true, _) => Access::Read,
        (false, true) => Access::Create(Default::default()),
        (false, false) => Access::Write(Default::default()),
    };
    let store = open_store(&args.db, access).await?;
    let (ns, id) = (&args.namespace, args.conversation);
    let result = async {
        let meta = if update.is_empty() {
            store.conversation_meta(ns, id).await?
        } else {
            let expected = match (args.version, store.conversation_meta(ns, id).await) {
                (Some(version), Ok(_)) => version,
                (None, Ok(current)) => current.meta_version,
                // Version 0 creates it.
                (Some(0) | None, Err(Error::NotFound { .. })) if args.create => 0,
                (_, Err(e)) => return Err(e.into()),
            };
            store
                .set_conversation_meta(ns, id, expected, &update)
                .await?
        };
        if json {
            return output::json(
                out,
                &Shown {
                    conversation_id: id,
                    namespace: ns,
                    meta: &meta,
                },
            );
        }
        show(out, style, id, &meta)
    }
    .await;
    closed(store.as_ref(), result).await
}

/// The change the flags ask for; bad pairs are usage errors (exit 2).
fn update_of(args: &MetaArgs) -> Result<MetaUpdate, CliError> {
    let mut update = MetaUpdate {
        title: match (&args.title, args.no_title) {
            (Some(title), _) => Some(Some(title.clone())),
            (None, true) => Some(None),
            (None, false) => None,
        },
        owner: match (&args.owner, args.no_owner) {
            (Some(owner), _) => Some(Some(owner.clone())),
            (None, true) => Some(None),
            (None, false) => None,
        },
        unset: args.unset.clone(),
        ..MetaUpdate::default()
    };
    for pair in &args.set {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| CliError::Usage(format!("--set expects K=V, got {}", echoed(pair))))?;
        update
            .set
            .insert(key.to_owned(), serde_json::Value::String(value.to_owned()));
    }
    for pair in &args.set_json {
        let (key, value) = set_json(pair).map_err(CliError::Usage)?;
        update.set.insert(key, value);
    }
    Ok(update)
}

/// `--set-json K=JSON`, refused in the words the user typed.
fn set_json(pair: &str) -> Result<(String, serde_json::Value), String> {
    let (key, json) = pair
        .split_once('=')
        .ok_or_else(|| format!("--set-json expects K=JSON, got {}", echoed(pair)))?;
    let value = serde_json::from_str(json).map_err(|e| {
        format!(
            "--set-json {}: the value after = is not JSON ({e}); a string is quoted: \
             --set-json 'k=\"text\"', or use --set k=text",
            echoed(pair)
        )
    })?;
    Ok((key.to_owned(), value))
}

fn show(
    out: &mut dyn Write,
    style: Style,
    id: ConversationId,
    meta: &ConversationMeta,
) -> Result<(), CliError> {
    let text = |v: &Option<String>| v.as_deref().map_or("-".into(), |t| output::clip(t, 200));
    let mut rows = vec![
        ("conversation", id.to_string()),
        ("title", text(&meta.title)),
        ("owner", text(&meta.owner)),
        ("meta version", meta.meta_version.to_string()),
        ("updated (UTC)", utc(meta.updated_at)),
    ];
    for (key, value) in &meta.metadata {
        rows.push((key.as_str(), output::clip(&value.to_string(), 200)));
    }
    output::table(out, "", &rows[..5])?;
    if !meta.metadata.is_empty() {
        writeln!(out, "{}", style.bold("metadata"))?;
        output::table(out, "  ", &rows[5..])?;
    }
    Ok(())
}
