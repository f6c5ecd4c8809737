//! `recover-expired`: takes over the requests whose lease expired (their
//! owner frozen or gone, in any process or on any machine) with the agent
//! `recover` builds, continues each from its latest checkpoint, and prints
//! what became of each. The continued runs hold a lease in turn.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use serde::Serialize;

use super::access::{Access, Limits};
use super::agent::agent_session;
use super::agent_args::AgentArgs;
use super::args::ContinueArgs;
use super::db::DbLocation;
use super::exit::{code_for, CliError};
use super::interrupt::Interrupt;
use super::lease::LeaseTiming;
use super::model;
use super::ops::{columns, parse_duration, utc};
use super::output::{self, Style};
use super::store::{closed, open_store};
use turnstile::agent::{AgentUpgrade, RunContext};
use turnstile::ids::{ConversationId, Namespace, RequestId, Revision, RunId};
use turnstile::outcome::Outcome;
use turnstile::session::{recover_expired, Recovery, ResumePolicy};
use turnstile::store::ExpiredLease;
use turnstile::Error;

#[derive(Args, Debug)]
pub struct RecoverExpiredArgs {
    /// The database: a SQLite file, or a PostgreSQL URL.
    #[arg(long, value_name = "PATH|URL")]
    pub db: DbLocation,
    /// At most this many requests, soonest expired first.
    #[arg(long, value_name = "N", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: u32,
    #[command(flatten)]
    pub continuing: ContinueArgs,
    /// How long a write waits for another process's lock on the database
    /// before it fails busy. Default 30s.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub busy_timeout: Option<Duration>,
    #[command(flatten)]
    pub agent: AgentArgs,
    #[command(flatten)]
    pub lease: LeaseTiming,
}

/// What became of one expired request.
#[derive(Serialize)]
struct Taken {
    conversation_id: ConversationId,
    namespace: Namespace,
    request_id: RequestId,
    /// The run whose lease expired.
    expired_run_id: RunId,
    /// The revision the takeover was a compare-and-swap on.
    revision: Revision,
    lease_expires_at: i64,
    status: Status,
    /// For `completed`: the committed outcome.
    #[serde(skip_serializing_if = "Option::is_none")]
    outcome: Option<Outcome>,
    /// For `skipped` and `failed`: why.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// For `failed`: the exit code of its error.
    #[serde(skip_serializing_if = "Option::is_none")]
    exit_code: Option<u8>,
}

#[derive(Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum Status {
    /// Taken over, continued and committed here.
    Completed,
    /// Another recoverer, or the owner's own commit, moved it on first.
    Skipped,
    /// Taken over (or refused) and not committed: the error says why.
    Failed,
}

#[derive(Serialize)]
struct Report {
    requests: Vec<Taken>,
}

pub(super) async fn run(
    args: RecoverExpiredArgs,
    out: &mut dyn Write,
    style: Style,
    json: bool,
) -> Result<(), CliError> {
    let approval = args.agent.approval.tools()?;
    let lease = args.lease.policy()?;
    let model = model::load(&args.agent.model)?;
    let mcp = args.agent.mcp.connect().await?;
    let limits = Limits {
        max_db_bytes: None,
        busy_timeout: args.busy_timeout,
    };
    let store = open_store(&args.db, Access::Write(limits)).await?;
    let result = async {
        let interrupt = Interrupt::watch();
        let token = interrupt.token();
        let upgrade = match args.continuing.accept_agent_change {
            true => AgentUpgrade::Accept,
            false => AgentUpgrade::Refuse,
        };
        let ctx = RunContext::default()
            .with_cancel(interrupt.token())
            .with_agent_upgrade(upgrade)
            .with_budget(args.continuing.budget.as_given());
        let policy = match args.continuing.retry_interrupted {
            true => ResumePolicy::RetryInterruptedTurn,
            false => ResumePolicy::RejectAmbiguous,
        };
        // After Ctrl-C the requests not yet claimed are left alone: a claim
        // that is cancelled at once would only move them to another owner.
        let agent_for = |expired: &ExpiredLease| {
            (!token.is_cancelled()).then(|| {
                agent_session(
                    expired.conversation_id,
                    expired.namespace.clone(),
                    store.clone(),
                    Arc::clone(&model),
                    &approval,
                    &mcp,
                )
                .with_lease(lease)
            })
        };
        let recoveries =
            recover_expired(store.as_ref(), agent_for, ctx, policy, args.limit).await?;
        let (report, first_failure) = report(recoveries);
        match json {
            true => output::json(out, &report)?,
            false => print(out, style, &report)?,
        }
        verdict(&report, first_failure)
    }
    .await;
    closed(store.as_ref(), result).await
}

/// The report, and the first failure's error (it sets the exit code).
fn report(recoveries: Vec<Recovery>) -> (Report, Option<Error>) {
    let mut first_failure = None;
    let requests = recoveries
        .into_iter()
        .map(|Recovery { lease, result }| {
            let (status, outcome, error) = match result {
                Ok(outcome) => (Status::Completed, Some(outcome), None),
                Err(
                    e @ (Error::Conflict { .. } | Error::Busy { .. } | Error::NotActive { .. }),
                ) => (Status::Skipped, None, Some(e)),
                Err(e) => (Status::Failed, None, Some(e)),
            };
            let exit_code = (status == Status::Failed)
                .then(|| error.as_ref().map(code_for))
                .flatten();
            let text = error.as_ref().map(ToString::to_string);
            if status == Status::Failed && first_failure.is_none() {
                first_failure = error;
            }
            Taken {
                conversation_id: lease.conversation_id,
                namespace: lease.namespace,
                request_id: lease.request_id,
                expired_run_id: lease.run_id,
                revision: lease.revision,
                lease_expires_at: lease.lease_expires_at,
                status,
                outcome,
                error: text,
                exit_code,
            }
        })
        .collect();
    (Report { requests }, first_failure)
}

fn verdict(report: &Report, first_failure: Option<Error>) -> Result<(), CliError> {
    let Some(first) = first_failure else {
        return Ok(());
    };
    let failed = report
        .requests
        .iter()
        .filter(|t| t.status == Status::Failed)
        .count();
    Err(CliError::Unrecovered {
        failed,
        listed: report.requests.len(),
        first,
    })
}

fn print(out: &mut dyn Write, style: Style, report: &Report) -> Result<(), CliError> {
    if report.requests.is_empty() {
        writeln!(out, "no expired leases")?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = report.requests.iter().map(|t| row(style, t)).collect();
    columns(
        out,
        &[
            "status",
            "request",
            "conversation",
            "lease expired",
            "detail",
        ],
        &rows,
    )?;
    let count = |status| {
        report
            .requests
            .iter()
            .filter(|t| t.status == status)
            .count()
    };
    writeln!(
        out,
        "{} expired: {} completed, {} skipped, {} failed",
        report.requests.len(),
        count(Status::Completed),
        count(Status::Skipped),
        count(Status::Failed)
    )?;
    Ok(())
}

fn row(style: Style, taken: &Taken) -> Vec<String> {
    let (status, detail) = match (&taken.outcome, &taken.error) {
        (Some(outcome), _) => (
            style.green("completed"),
            format!(
                "run {} · version {}",
                outcome.run_id, outcome.conversation_version
            ),
        ),
        (None, error) => {
            let why = output::plain(error.as_deref().unwrap_or_default()).into_owned();
            match taken.exit_code {
                Some(code) => (style.red("failed"), format!("exit {code}: {why}")),
                None => (style.yellow("skipped"), why),
            }
        }
    };
    vec![
        status,
        taken.request_id.to_string(),
        taken.conversation_id.to_string(),
        utc(taken.lease_expires_at),
        detail,
    ]
}
