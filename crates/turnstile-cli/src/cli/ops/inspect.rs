//! `show CONVERSATION` and `checkpoints RUN`.

use std::io::Write;
use std::time::Duration;

use serde::Serialize;

use super::args::{CheckpointsArgs, ShowArgs};
use super::columns::{columns, utc};
use super::list::mark;
use super::render;
use crate::cli::access::Access;
use crate::cli::exit::CliError;
use crate::cli::output::{self, Style};
use crate::cli::store::open_store;
use turnstile::admin::{ConversationSummary, RunSummary};
use turnstile::agent::Budget;
use turnstile::checkpoint::LoopCheckpoint;
use turnstile::ids::{ConversationId, Namespace};
use turnstile::message::Message;
use turnstile::store::{BudgetChange, TranscriptEntry};
use turnstile::Error;
use turnstile::StoreAdmin;

/// `show` and `checkpoints` call a `running` owner stuck after this long
/// without a change, as `ls` does by default.
const STALE_AFTER: Duration = Duration::from_secs(300);
/// Transcript entries read per query.
pub(super) const PAGE: u64 = 500;

#[derive(Clone, Copy, Serialize)]
struct SummaryPointer {
    id: i64,
    through_seq: u64,
}

#[derive(Serialize)]
struct Shown<'a> {
    conversation: &'a ConversationSummary,
    /// The latest summary: its id and the last entry it covers.
    summary: Option<SummaryPointer>,
    transcript: &'a [TranscriptEntry],
}

pub(in crate::cli) async fn show(
    args: ShowArgs,
    out: &mut dyn Write,
    style: Style,
    json: bool,
) -> Result<(), CliError> {
    let store = open_store(&args.db, Access::Read).await?;
    let result = async {
        let conversation = find(store.as_ref(), args.conversation, args.namespace.as_ref()).await?;
        let summary = store
            .latest_summary(conversation.id)
            .await
            .map_err(CliError::from)?
            .map(|s| SummaryPointer {
                id: s.id,
                through_seq: s.through_seq,
            });
        let mut transcript = Vec::new();
        for_each_page(store.as_ref(), &conversation, |page| {
            transcript.extend(page);
            Ok(())
        })
        .await?;
        if json {
            let shown = Shown {
                conversation: &conversation,
                summary,
                transcript: &transcript,
            };
            return output::json(out, &shown);
        }
        let admission = match &conversation.held {
            None => format!("{} · idle", conversation.revision),
            Some(held) => {
                let mut text = format!(
                    "{} · held by request {} (run {}, {}, {})",
                    held.revision,
                    held.request_id,
                    held.run_id,
                    held.run_status
                        .map_or("no run row".into(), |s| s.as_str().to_owned()),
                    mark(held.last_checkpoint.as_ref())
                );
                if held.awaiting_approval {
                    text.push_str(
                        &style.yellow(" · awaiting approval (see `turnstile approvals`)"),
                    );
                } else if held.stuck {
                    text.push_str(&style.red(" · stuck"));
                }
                text
            }
        };
        output::table(
            out,
            "",
            &[
                ("conversation", conversation.id.to_string()),
                ("namespace", conversation.namespace.to_string()),
                (
                    "version",
                    format!("{} (committed requests)", conversation.version),
                ),
                ("revision", admission),
                (
                    "transcript",
                    format!("{} messages", conversation.transcript_entries),
                ),
                (
                    "summary",
                    summary.map_or("none".into(), |s| {
                        format!("#{} · covers entries up to {}", s.id, s.through_seq)
                    }),
                ),
                ("created", format!("{} UTC", utc(conversation.created_at))),
                (
                    "last activity",
                    format!("{} UTC", utc(conversation.last_activity_at)),
                ),
            ],
        )?;
        let mut request = None;
        for entry in &transcript {
            if request != Some(entry.request_id) {
                request = Some(entry.request_id);
                writeln!(out)?;
                writeln!(
                    out,
                    "{}",
                    style.dim(&format!("request {}", entry.request_id))
                )?;
            }
            render::message(
                out,
                style,
                &format!("#{}", entry.seq),
                &entry.message,
                args.reasoning,
            )?;
        }
        Ok(())
    }
    .await;
    crate::cli::store::closed(store.as_ref(), result).await
}

#[derive(Serialize)]
struct RunCheckpoints<'a> {
    run: &'a RunSummary,
    /// Set when the run continued its request with another agent.
    agent_change: Option<AgentChangeShown<'a>>,
    /// Set when the run changed its request's budget.
    budget_change: Option<&'a BudgetChange>,
    checkpoints: &'a [LoopCheckpoint],
    /// The messages the request held at the last checkpoint, the input
    /// first, their parts whole (images and files by reference).
    messages: &'a [Message],
    /// Why they could not be read, when they could not.
    messages_error: Option<String>,
}

/// A budget's limits in words: "at most 2 turns, 100 tokens".
fn budget_words(budget: &Budget) -> String {
    let limits: Vec<String> = [
        budget.max_turns.map(|n| format!("{n} turns")),
        budget.max_tool_calls.map(|n| format!("{n} tool calls")),
        budget.max_tokens.map(|n| format!("{n} tokens")),
    ]
    .into_iter()
    .flatten()
    .collect();
    match limits.is_empty() {
        true => "no limits".to_owned(),
        false => format!("at most {}", limits.join(", ")),
    }
}

/// The fingerprints of an accepted agent upgrade.
#[derive(Serialize)]
struct AgentChangeShown<'a> {
    from: &'a str,
    to: &'a str,
}

pub(in crate::cli) async fn checkpoints(
    args: CheckpointsArgs,
    out: &mut dyn Write,
    style: Style,
    json: bool,
) -> Result<(), CliError> {
    let store = open_store(&args.db, Access::Read).await?;
    let result = async {
        // The run's own record first: a run of a deleted conversation
        // answers that it was deleted, as `resume` of it does.
        let record = store.run(args.run).await?;
        let run = store
            .run_summary(args.run, STALE_AFTER)
            .await?
            .ok_or_else(|| Error::NotFound {
                what: "run",
                id: args.run.to_string(),
            })?;
        let rows = store.checkpoints(args.run).await?;
        // The checkpoint rows are shown whatever the messages' state: this
        // command is for looking at runs that went wrong.
        let (messages, messages_error) = match rows.last() {
            None => (Vec::new(), None),
            Some(last) => match messages_at(store.as_ref(), &run, last).await {
                Ok(messages) => (messages, None),
                Err(e) => (Vec::new(), Some(e.to_string())),
            },
        };
        let change = record.as_ref().and_then(|r| r.agent_change.as_ref());
        let budget_change = record.as_ref().and_then(|r| r.budget_change.as_ref());
        if json {
            let shown = RunCheckpoints {
                run: &run,
                budget_change,
                agent_change: change.map(|c| AgentChangeShown {
                    from: &c.from,
                    to: &c.to,
                }),
                checkpoints: &rows,
                messages: &messages,
                messages_error,
            };
            return output::json(out, &shown);
        }
        // Fingerprints are SHA-256 hex: their first 12 digits tell them apart.
        let short = |f: &str| output::plain(&f.chars().take(12).collect::<String>()).into_owned();
        let agent = change.map_or("-".into(), |c| {
            format!("upgraded from {} to {}", short(&c.from), short(&c.to))
        });
        let admission = match run.held.as_ref() {
            Some(held) if held.awaiting_approval => style.yellow(&format!(
                "holds revision {}, awaiting approval",
                held.revision
            )),
            Some(held) if held.stuck => {
                style.red(&format!("holds revision {}, stuck", held.revision))
            }
            Some(held) => format!("holds revision {}", held.revision),
            None => "-".into(),
        };
        output::table(
            out,
            "",
            &[
                ("run", run.run_id.to_string()),
                ("request", run.request_id.to_string()),
                ("conversation", run.conversation_id.to_string()),
                ("status", run.status.as_str().to_owned()),
                (
                    "resumed from",
                    run.resumed_from.map_or("-".into(), |r| r.to_string()),
                ),
                ("admission", admission),
                ("agent", agent),
                (
                    "budget",
                    budget_change.map_or("-".into(), |c| {
                        format!(
                            "changed from {} to {}",
                            budget_words(&c.from),
                            budget_words(&c.to)
                        )
                    }),
                ),
                (
                    "error",
                    run.error
                        .as_deref()
                        .map_or("-".into(), |e| output::clip(e, 200)),
                ),
            ],
        )?;
        writeln!(out)?;
        if rows.is_empty() {
            writeln!(
                out,
                "no checkpoints (the run stopped before its first turn)"
            )?;
            return Ok(());
        }
        let table: Vec<Vec<String>> = rows
            .iter()
            .map(|c| {
                let passed = c.verification_reports.iter().filter(|r| r.passed).count();
                vec![
                    c.turn.to_string(),
                    c.phase.as_str().to_owned(),
                    c.usage.input_tokens.to_string(),
                    c.usage.output_tokens.to_string(),
                    format!(
                        "{}/{}",
                        c.usage.cache_read_tokens, c.usage.cache_write_tokens
                    ),
                    c.tool_calls_count.to_string(),
                    format!("{} ({passed} passed)", c.verification_reports.len()),
                    c.message_count.to_string(),
                    utc(c.created_at),
                ]
            })
            .collect();
        columns(
            out,
            &[
                "TURN",
                "PHASE",
                "INPUT",
                "OUTPUT",
                "CACHE R/W",
                "TOOL CALLS",
                "REPORTS",
                "MESSAGES",
                "SAVED (UTC)",
            ],
            &table,
        )?;
        writeln!(out)?;
        let heading = match (&messages_error, rows.last()) {
            (Some(e), _) => style.red(&format!(
                "its messages cannot be read: {}",
                output::clip(e, 200)
            )),
            (None, Some(last)) if !messages.is_empty() => {
                style.dim(&format!("messages at turn {}", last.turn))
            }
            (None, _) => style.dim("no messages kept for this run"),
        };
        writeln!(out, "{heading}")?;
        for (i, message) in messages.iter().enumerate() {
            render::message(out, style, &format!("#{i}"), message, args.reasoning)?;
        }
        Ok(())
    }
    .await;
    crate::cli::store::closed(store.as_ref(), result).await
}

/// The messages the run's request held at `last`, the run's last
/// checkpoint: its pending messages while it is not committed; once it is,
/// the first of its transcript entries (a later run may have added more,
/// or answered an interrupted turn anew).
async fn messages_at(
    store: &dyn StoreAdmin,
    run: &RunSummary,
    last: &LoopCheckpoint,
) -> Result<Vec<Message>, Error> {
    let count = last.messages_recorded();
    let outcome = || async {
        Ok::<_, Error>(
            store
                .request(run.request_id)
                .await?
                .and_then(|request| request.outcome),
        )
    };
    let mut committed = outcome().await?;
    if committed.is_none() {
        let pending = store.request_messages(run.request_id, count).await?;
        // Fewer than counted: the request may have committed meanwhile,
        // its pending messages moved into the transcript.
        if pending.len() as u64 >= count {
            return Ok(pending);
        }
        committed = outcome().await?;
        if committed.is_none() {
            return Ok(pending);
        }
    }
    let Some(outcome) = committed else {
        return Ok(Vec::new());
    };
    let end = outcome.end_seq.min(outcome.first_seq.saturating_add(count));
    Ok(store
        .transcript_range(run.conversation_id, outcome.first_seq, end)
        .await?
        .into_iter()
        .map(|entry| entry.message)
        .collect())
}

/// The conversation, in `namespace` when one is given.
pub(super) async fn find(
    store: &dyn StoreAdmin,
    id: ConversationId,
    namespace: Option<&Namespace>,
) -> Result<ConversationSummary, CliError> {
    if let Some(namespace) = namespace {
        // The store's own check: not found, or in another namespace.
        store.conversation(namespace, id).await?;
    }
    Ok(store
        .conversation_summary(id, STALE_AFTER)
        .await?
        .ok_or_else(|| Error::NotFound {
            what: "conversation",
            id: id.to_string(),
        })?)
}

/// The transcript in pages of [`PAGE`] entries, oldest first.
async fn for_each_page(
    store: &dyn StoreAdmin,
    conversation: &ConversationSummary,
    mut each: impl FnMut(Vec<TranscriptEntry>) -> Result<(), CliError>,
) -> Result<(), CliError> {
    let end = conversation.transcript_entries;
    let mut from = 0;
    while from < end {
        let to = end.min(from + PAGE);
        each(store.transcript_range(conversation.id, from, to).await?)?;
        from = to;
    }
    Ok(())
}
