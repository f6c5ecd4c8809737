//! The commands printed with a stopped run's error, and with a run that
//! waits for approval: the same database, conversation and agent (model and
//! `--require-approval`), quoted so that they paste and run, with no secret
//! in them.

use turnstile::checkpoint::CheckpointPhase;
use turnstile::ids::{Namespace, RequestId, Revision, RunId};
use turnstile::session::AgentSession;
use turnstile::LeasePolicy;

use super::args::SessionArgs;
use super::budget_args::raise;
use super::exit::{CliError, NextSteps};
use super::mcp::{self, McpArgs};
use super::model::{ModelArgs, ModelSpec, ReplayArg};
pub(super) use super::text::quote;

/// The options that rebuild a run's agent in a printed command: its model
/// and the tools whose calls need approval (both are part of the agent
/// fingerprint a continued request is checked against), and the lease the
/// run held, so that the continued run holds one too.
#[derive(Clone, Copy, Debug)]
pub(super) struct AgentFlags<'a> {
    pub model: &'a ModelSpec,
    pub base_url: Option<&'a str>,
    pub api_key_env: Option<&'a str>,
    pub reasoning_replay: Option<ReplayArg>,
    pub thinking_budget: Option<u32>,
    pub mcp_stdio: &'a [String],
    pub mcp_http: &'a [String],
    /// Checked, sorted, without repeats.
    pub require_approval: &'a [String],
    pub lease: Option<LeasePolicy>,
}

impl<'a> AgentFlags<'a> {
    pub(super) fn new(
        model: &'a ModelArgs,
        require_approval: &'a [String],
        mcp: &'a McpArgs,
    ) -> Self {
        Self {
            model: &model.model,
            base_url: model.base_url.as_deref(),
            api_key_env: model.api_key_env.as_deref(),
            reasoning_replay: model.reasoning_replay,
            thinking_budget: model.thinking_budget,
            mcp_stdio: &mcp.stdio,
            mcp_http: &mcp.http,
            require_approval,
            lease: None,
        }
    }

    /// The same, for a run that held `lease`.
    pub(super) fn leased(self, lease: Option<LeasePolicy>) -> Self {
        Self { lease, ..self }
    }

    fn words(&self) -> Vec<String> {
        let mut words = vec!["--model".to_owned(), quote(&self.model.to_arg())];
        if let Some(url) = self.base_url {
            words.extend(["--base-url".into(), quote(&turnstile::redacted_url(url))]);
        }
        if let Some(var) = self.api_key_env {
            words.extend(["--api-key-env".into(), quote(var)]);
        }
        if let Some(replay) = self.reasoning_replay {
            words.extend(["--reasoning-replay".into(), replay.as_str().into()]);
        }
        if let Some(budget) = self.thinking_budget {
            words.extend(["--thinking-budget".into(), budget.to_string()]);
        }
        for server in self.mcp_stdio {
            words.extend(["--mcp-stdio".into(), quote(server)]);
        }
        for server in self.mcp_http {
            words.extend(["--mcp-http".into(), quote(&mcp::redacted_http_flag(server))]);
        }
        if !self.require_approval.is_empty() {
            words.extend([
                "--require-approval".into(),
                quote(&self.require_approval.join(",")),
            ]);
        }
        if let Some(lease) = self.lease {
            words.extend([
                "--lease".into(),
                "--lease-renew".into(),
                quote(&humantime::format_duration(lease.renew_every()).to_string()),
                "--lease-expire".into(),
                quote(&humantime::format_duration(lease.ttl()).to_string()),
            ]);
        }
        words
    }
}

/// A stopped run's error with the command that continues it (the run id
/// and revision it carries; the same database, conversation and agent).
///
/// A run that failed in the store (a full disk, an I/O error) carries no
/// run id: if its request still holds the admission, the admission says
/// which run and revision continue it. A database server that went away
/// cannot be asked: the run and revision it started with continue it, with
/// `--retry-interrupted`, once the server is back. A run that waits for
/// approval is left as it is: its revision moves with each decision, and
/// the decisions print the command that continues it.
pub(super) async fn with_hint<T>(
    result: Result<T, CliError>,
    agent_session: &AgentSession,
    started: Option<(RunId, Revision)>,
    session: &SessionArgs,
    agent: &AgentFlags<'_>,
) -> Result<T, CliError> {
    let error = match result {
        Ok(value) => return Ok(value),
        Err(error) => error,
    };
    let error = match (error, started) {
        (CliError::Turnstile(source), Some((run, revision))) if matches!(&source, turnstile::Error::Store(e) if e.is_unreachable()) =>
        {
            let mut resume = resume_command(run, revision, session, Some(agent));
            resume.push_str(" --retry-interrupted");
            return Err(CliError::Unreachable {
                source,
                run_id: run,
                revision,
                resume,
            });
        }
        (error, _) => error,
    };
    let stopped = match &error {
        CliError::Turnstile(turnstile::Error::Store(_)) => match started {
            Some((run, _)) => held_by(agent_session, run).await,
            None => None,
        },
        CliError::Turnstile(turnstile::Error::AwaitingApproval { .. }) => None,
        CliError::Turnstile(source) => source
            .stopped_run()
            .map(|(run, revision)| (run, revision, false)),
        _ => None,
    };
    Err(match (error, stopped) {
        (CliError::Turnstile(source), Some((run, revision, in_flight))) => {
            // A quota that was too small would stop the resumed run too:
            // the command leaves it out (the user may give a larger one).
            let full = matches!(&source, turnstile::Error::Store(e) if e.is_full());
            let unbounded;
            let session = match (full, session.max_db_bytes) {
                (true, Some(_)) => {
                    unbounded = SessionArgs {
                        max_db_bytes: None,
                        ..session.clone()
                    };
                    &unbounded
                }
                _ => session,
            };
            let mut resume = resume_command(run, revision, session, Some(agent));
            if in_flight {
                resume.push_str(" --retry-interrupted");
            }
            // A spent budget is stored with the request: the same resume
            // would be refused, so the command raises it, or gives up.
            let mut give_up = None;
            if let turnstile::Error::BudgetExceeded { kind, limit, .. } = &source {
                if let Some((flag, raised)) = raise(*kind, *limit) {
                    resume.push_str(&format!(" {flag} {raised}"));
                }
                give_up = holder(agent_session, run)
                    .await
                    .map(|request| abandon_command(request, revision, session));
            }
            CliError::Stopped {
                source,
                run_id: run,
                revision,
                next: Box::new(NextSteps { resume, give_up }),
            }
        }
        (error, _) => error,
    })
}

/// The revision, while `run` (the one this command started) still owns the
/// admission: never a run another process started. And whether its last
/// checkpoint has a turn in flight (a step that failed could not record
/// its stop), which a resume must be told to retry.
async fn held_by(session: &AgentSession, run: RunId) -> Option<(RunId, Revision, bool)> {
    let state = session.admission().await.ok()?;
    let active = state.active?;
    if active.run_id != run {
        return None;
    }
    let last = session.store().latest_checkpoint(run).await.ok()?;
    let in_flight = last.is_some_and(|c| {
        matches!(
            c.phase,
            CheckpointPhase::TurnInFlight | CheckpointPhase::ToolsInFlight
        )
    });
    Some((run, state.revision, in_flight))
}

/// The request `run` runs, while it holds the admission.
async fn holder(session: &AgentSession, run: RunId) -> Option<RequestId> {
    let active = session.admission().await.ok()?.active?;
    (active.run_id == run).then_some(active.request_id)
}

/// `turnstile abandon REQUEST --revision N` on the same database and
/// conversation.
pub(super) fn abandon_command(
    request: RequestId,
    revision: Revision,
    session: &SessionArgs,
) -> String {
    let mut words = vec![
        "turnstile".to_owned(),
        "abandon".into(),
        request.to_string(),
        "--revision".into(),
        revision.to_string(),
    ];
    words.extend(session_words(session));
    words.join(" ")
}

/// `turnstile resume RUN --revision N` on the same database and
/// conversation, with the agent's options when they are known.
pub(super) fn resume_command(
    run: RunId,
    revision: Revision,
    session: &SessionArgs,
    agent: Option<&AgentFlags<'_>>,
) -> String {
    let mut words = vec![
        "turnstile".to_owned(),
        "resume".into(),
        run.to_string(),
        "--revision".into(),
        revision.to_string(),
    ];
    words.extend(session_words(session));
    if let Some(agent) = agent {
        words.extend(agent.words());
    }
    words.join(" ")
}

/// How a tool call waiting for approval is decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Decision {
    Approve,
    Reject,
}

/// `turnstile approve REQUEST CALL --revision N …` (or `reject …
/// --reason`), with the agent's options when they are known, so the command it prints
/// next pastes too. A rejection's reason is the user's to write: `--reason`
/// comes last with no value, so the command pasted as printed is refused
/// (a value is required) rather than sending a placeholder to the model.
pub(super) fn decide_command(
    decision: Decision,
    request: RequestId,
    call_id: &str,
    revision: Revision,
    session: &SessionArgs,
    agent: Option<&AgentFlags<'_>>,
) -> String {
    let verb = match decision {
        Decision::Approve => "approve",
        Decision::Reject => "reject",
    };
    let mut words = vec!["turnstile".to_owned(), verb.into(), request.to_string()];
    // A call id that looks like an option goes last, after `--`.
    let hyphen = call_id.starts_with('-');
    if !hyphen {
        words.push(quote(call_id));
    }
    words.extend(["--revision".into(), revision.to_string()]);
    words.extend(session_words(session));
    if let Some(agent) = agent {
        words.extend(agent.words());
    }
    if decision == Decision::Reject {
        // Before a `--`, which clap never takes as its value.
        words.push("--reason".into());
    }
    if hyphen {
        words.extend(["--".into(), quote(call_id)]);
    }
    words.join(" ")
}

/// `--db … --conversation …` and the session options given.
fn session_words(session: &SessionArgs) -> Vec<String> {
    let mut words = vec![
        "--db".to_owned(),
        // A URL without its password: PGPASSWORD or ~/.pgpass supply it.
        quote(&session.db.to_string()),
        "--conversation".into(),
        session.conversation.to_string(),
    ];
    if session.namespace.as_str() != Namespace::DEFAULT {
        words.extend(["--namespace".into(), quote(session.namespace.as_str())]);
    }
    if let Some(bytes) = session.max_db_bytes {
        words.extend(["--max-db-bytes".into(), bytes.to_string()]);
    }
    if let Some(wait) = session.busy_timeout {
        words.extend([
            "--busy-timeout".into(),
            quote(&humantime::format_duration(wait).to_string()),
        ]);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnstile::ids::ConversationId;

    fn session() -> SessionArgs {
        SessionArgs {
            db: super::super::DbLocation::File("my db.sqlite".into()),
            conversation: ConversationId::new(),
            namespace: Namespace::default(),
            max_db_bytes: None,
            busy_timeout: None,
        }
    }

    #[test]
    fn line_breaks_are_ansi_c_quoted_so_a_command_stays_on_one_line() {
        assert_eq!(quote("c1"), "c1");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("a\nb"), r"$'a\nb'");
        assert_eq!(quote("it's\x1b"), r"$'it\'s\x1b'");
    }

    #[test]
    fn decide_commands_carry_the_agent_and_put_an_option_like_call_id_last() {
        let session = session();
        let request = RequestId::new();
        let model = ModelSpec::Scripted("s.json".into());
        let tools = ["add".to_owned(), "clock".to_owned()];
        let agent = AgentFlags {
            model: &model,
            base_url: None,
            api_key_env: None,
            reasoning_replay: None,
            thinking_budget: None,
            mcp_stdio: &[],
            mcp_http: &[],
            require_approval: &tools,
            lease: None,
        };
        let approve = decide_command(
            Decision::Approve,
            request,
            "c1",
            Revision(4),
            &session,
            Some(&agent),
        );
        assert_eq!(
            approve,
            format!(
                "turnstile approve {request} c1 --revision 4 --db 'my db.sqlite' \
                 --conversation {} --model scripted:s.json --require-approval add,clock",
                session.conversation
            )
        );
        let reject = decide_command(Decision::Reject, request, "-x", Revision(4), &session, None);
        assert!(reject.contains(" --revision 4 --db "), "{reject}");
        assert!(reject.ends_with(" --reason -- -x"), "{reject}");
        let resume = resume_command(RunId::new(), Revision(5), &session, None);
        assert!(
            resume.contains(" --revision 5 --db 'my db.sqlite' "),
            "{resume}"
        );
        assert!(!resume.contains("--model"), "{resume}");
    }

    #[test]
    fn a_resume_command_carries_the_lease_its_run_held() {
        let session = session();
        let model = ModelSpec::Scripted("s.json".into());
        let lease = LeasePolicy::new(
            std::time::Duration::from_millis(2500),
            std::time::Duration::from_secs(9),
        )
        .expect("renewed more often than it expires");
        let agent = AgentFlags {
            model: &model,
            base_url: None,
            api_key_env: None,
            reasoning_replay: None,
            thinking_budget: None,
            mcp_stdio: &[],
            mcp_http: &[],
            require_approval: &[],
            lease: None,
        }
        .leased(Some(lease));
        let run = RunId::new();
        let resume = resume_command(run, Revision(3), &session, Some(&agent));
        assert!(
            resume.ends_with(
                " --model scripted:s.json --lease --lease-renew '2s 500ms' --lease-expire 9s"
            ),
            "{resume}"
        );
        let unleased = AgentFlags {
            lease: None,
            ..agent
        };
        let resume = resume_command(run, Revision(3), &session, Some(&unleased));
        assert!(!resume.contains("--lease"), "{resume}");
    }
}
