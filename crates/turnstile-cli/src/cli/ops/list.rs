//! `ls conversations|requests|runs`: one row per item, newest first (stuck
//! ones stalest first), or with `--json` one object with the items and
//! `next`: `{"conversations": [...], "next": CURSOR|null}`, and so
//! `requests` and `runs` (whose `next` is always `null`: they are not
//! paged, `--limit` caps them). An
//! admission held by a request awaiting approval is shown as such, not as
//! stuck, and `--stuck` leaves it out (the store says which:
//! `HeldAdmission::awaiting_approval`).

use std::io::Write;

use serde::Serialize;

use super::args::{ListKind, LsArgs};
use super::columns::{columns, utc};
use crate::cli::access::Access;
use crate::cli::exit::CliError;
use crate::cli::output::{self, Style};
use crate::cli::store::open_store;
use turnstile::admin::{
    CheckpointMark, ConversationSummary, HeldAdmission, ListFilter, RequestSummary, RunSummary,
};

/// `ls requests --json`: the shape of a conversation page.
#[derive(Serialize)]
struct RequestPage<'a> {
    requests: &'a [RequestSummary],
    next: Option<String>,
}

/// `ls runs --json`: the shape of a conversation page.
#[derive(Serialize)]
struct RunPage<'a> {
    runs: &'a [RunSummary],
    next: Option<String>,
}

pub(in crate::cli) async fn ls(
    args: LsArgs,
    out: &mut dyn Write,
    style: Style,
    json: bool,
) -> Result<(), CliError> {
    let store = open_store(&args.db, Access::Read).await?;
    let result = async {
        if args.kind != ListKind::Conversations && args.search.any() {
            return Err(CliError::Usage(
                "--owner, --meta, --created-*, --updated-* and --after filter conversations only"
                    .into(),
            ));
        }
        let filter = args.search.apply(ListFilter {
            namespace: args.namespace,
            conversation_id: args.conversation,
            stuck_only: args.stuck,
            stale_after: args.stale_after,
            limit: args.limit,
            ..ListFilter::default()
        });
        match args.kind {
            ListKind::Conversations => {
                let page = store.list_conversations(&filter).await?;
                if json {
                    return output::json(out, &page);
                }
                conversations(out, style, &page.conversations)?;
                if let Some(next) = page.next {
                    writeln!(out, "more: --after {next}")?;
                }
                Ok(())
            }
            ListKind::Requests => {
                let rows = store.list_requests(&filter).await?;
                if json {
                    let page = RequestPage {
                        requests: &rows,
                        next: None,
                    };
                    return output::json(out, &page);
                }
                requests(out, style, &rows)
            }
            ListKind::Runs => {
                let rows = store.list_runs(&filter).await?;
                if json {
                    let page = RunPage {
                        runs: &rows,
                        next: None,
                    };
                    return output::json(out, &page);
                }
                runs(out, style, &rows)
            }
        }
    }
    .await;
    crate::cli::store::closed(store.as_ref(), result).await
}

fn conversations(
    out: &mut dyn Write,
    style: Style,
    rows: &[ConversationSummary],
) -> Result<(), CliError> {
    if rows.is_empty() {
        return none(out, "conversations");
    }
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|c| {
            vec![
                c.id.to_string(),
                c.namespace.to_string(),
                c.version.to_string(),
                c.revision.to_string(),
                c.transcript_entries.to_string(),
                state(style, c.held.as_ref()),
                c.held
                    .as_ref()
                    .map_or("-".into(), |h| h.request_id.to_string()),
                mark(c.held.as_ref().and_then(|h| h.last_checkpoint.as_ref())),
                utc(c.created_at),
                utc(c.last_activity_at),
                c.meta
                    .owner
                    .as_deref()
                    .map_or("-".into(), |o| output::clip(o, 40)),
                c.meta
                    .title
                    .as_deref()
                    .map_or("-".into(), |t| output::clip(t, 40)),
            ]
        })
        .collect();
    columns(
        out,
        &[
            "CONVERSATION",
            "NAMESPACE",
            "VERSION",
            "REVISION",
            "MESSAGES",
            "STATE",
            "ACTIVE REQUEST",
            "CHECKPOINT",
            "CREATED (UTC)",
            "LAST ACTIVITY (UTC)",
            "OWNER",
            "TITLE",
        ],
        &table,
    )
}

fn requests(out: &mut dyn Write, style: Style, rows: &[RequestSummary]) -> Result<(), CliError> {
    if rows.is_empty() {
        return none(out, "requests");
    }
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let status = match r.held.as_ref() {
                Some(held) if held.awaiting_approval => style.yellow("active, awaiting approval"),
                Some(held) if held.stuck => style.red("active, stuck"),
                _ => r.status.as_str().to_owned(),
            };
            vec![
                r.request_id.to_string(),
                r.conversation_id.to_string(),
                status,
                r.held
                    .as_ref()
                    .map_or("-".into(), |h| h.revision.to_string()),
                r.runs.to_string(),
                r.latest_run.map_or("-".into(), |run| run.to_string()),
                r.latest_run_status
                    .map_or("-".into(), |s| s.as_str().to_owned()),
                mark(r.last_checkpoint.as_ref()),
                utc(r.created_at),
                r.completed_at.map_or("-".into(), utc),
            ]
        })
        .collect();
    columns(
        out,
        &[
            "REQUEST",
            "CONVERSATION",
            "STATUS",
            "REVISION",
            "RUNS",
            "LATEST RUN",
            "RUN STATUS",
            "CHECKPOINT",
            "CREATED (UTC)",
            "FINISHED (UTC)",
        ],
        &table,
    )
}

fn runs(out: &mut dyn Write, style: Style, rows: &[RunSummary]) -> Result<(), CliError> {
    if rows.is_empty() {
        return none(out, "runs");
    }
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let admission = match r.held.as_ref() {
                Some(held) if held.awaiting_approval => {
                    style.yellow(&format!("held at {}, awaiting approval", held.revision))
                }
                Some(held) if held.stuck => style.red(&format!("held at {}, stuck", held.revision)),
                Some(held) => format!("held at {}", held.revision),
                None => "-".into(),
            };
            vec![
                r.run_id.to_string(),
                r.request_id.to_string(),
                r.status.as_str().to_owned(),
                admission,
                r.checkpoints.to_string(),
                mark(r.last_checkpoint.as_ref()),
                utc(r.started_at),
                r.ended_at.map_or("-".into(), utc),
                r.error
                    .as_deref()
                    .map_or("-".into(), |e| output::clip(e, 60)),
            ]
        })
        .collect();
    columns(
        out,
        &[
            "RUN",
            "REQUEST",
            "STATUS",
            "ADMISSION",
            "CHECKPOINTS",
            "LAST CHECKPOINT",
            "STARTED (UTC)",
            "ENDED (UTC)",
            "ERROR",
        ],
        &table,
    )
}

fn none(out: &mut dyn Write, what: &str) -> Result<(), CliError> {
    writeln!(out, "no {what}")?;
    Ok(())
}

/// `idle`, `active`, `awaiting approval` or `stuck`.
fn state(style: Style, held: Option<&HeldAdmission>) -> String {
    match held {
        None => "idle".into(),
        Some(held) if held.awaiting_approval => style.yellow("awaiting approval"),
        Some(held) if held.stuck => style.red("stuck"),
        Some(_) => style.yellow("active"),
    }
}

/// `turn 2 · ready`, or `-` for a run without a checkpoint.
pub(super) fn mark(mark: Option<&CheckpointMark>) -> String {
    match mark {
        Some(m) => format!("turn {} · {}", m.turn, m.phase.as_str()),
        None => "-".into(),
    }
}
