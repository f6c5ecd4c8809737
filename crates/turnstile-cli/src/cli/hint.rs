//! The `turnstile resume …` command printed with a stopped run's error:
//! the same database, conversation and model, quoted so that it pastes
//! and runs, with no secret in it.

use turnstile::ids::{Revision, RunId};
use turnstile::session::AgentSession;

use super::exit::CliError;
use super::model::{ModelArgs, ModelSpec};
use super::{output, SessionArgs};

/// A stopped run's error with the command that continues it (the run id
/// and revision it carries; the same database, conversation and model).
///
/// A run that failed in the store (a full disk, an I/O error) carries no
/// run id: if its request still holds the admission, the admission says
/// which run and revision continue it.
pub(super) async fn with_hint<T>(
    result: Result<T, CliError>,
    agent_session: &AgentSession,
    started: Option<RunId>,
    session: &SessionArgs,
    model: &ModelArgs,
) -> Result<T, CliError> {
    let error = match result {
        Ok(value) => return Ok(value),
        Err(error) => error,
    };
    let stopped = match &error {
        CliError::Turnstile(turnstile::Error::Store(_)) => match started {
            Some(run) => held_by(agent_session, run).await,
            None => None,
        },
        CliError::Turnstile(source) => source.stopped_run(),
        _ => None,
    };
    Err(match (error, stopped) {
        (CliError::Turnstile(source), Some(stopped)) => resumable(source, stopped, session, model),
        (error, _) => error,
    })
}

/// The revision, while `run` (the one this command started) still owns the
/// admission: never a run another process started.
async fn held_by(session: &AgentSession, run: RunId) -> Option<(RunId, Revision)> {
    let state = session.admission().await.ok()?;
    let active = state.active?;
    (active.run_id == run).then_some((run, state.revision))
}

fn resumable(
    source: turnstile::Error,
    (run, revision): (RunId, Revision),
    session: &SessionArgs,
    model: &ModelArgs,
) -> CliError {
    let mut words = vec![
        "turnstile".to_owned(),
        "resume".into(),
        run.to_string(),
        "--revision".into(),
        revision.to_string(),
        "--db".into(),
        // A URL without its password: PGPASSWORD or ~/.pgpass supply it.
        quote(&session.db.to_string()),
        "--conversation".into(),
        session.conversation.to_string(),
    ];
    if session.namespace.as_str() != "default" {
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
    let spec = match &model.model {
        ModelSpec::Scripted(path) => format!("scripted:{}", path.display()),
        ModelSpec::OpenAi(name) => format!("openai:{name}"),
    };
    words.extend(["--model".into(), quote(&spec)]);
    if let Some(url) = &model.base_url {
        words.extend(["--base-url".into(), quote(&turnstile::redacted_url(url))]);
    }
    if let Some(var) = &model.api_key_env {
        words.extend(["--api-key-env".into(), quote(var)]);
    }
    CliError::Stopped {
        source,
        resume: words.join(" "),
    }
}

/// A shell word that pastes and runs: as it is when it is plain,
/// single-quoted when it has spaces or shell characters, and ANSI-C quoted
/// (`$'…'`, bash and zsh) when it has control or reordering characters, so
/// that a path with a newline, a tab or a bidi mark still fits the
/// one-line error, which shows such characters escaped.
fn quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else if word.chars().any(output::unsafe_for_terminal) {
        let mut quoted = String::from("$'");
        for c in word.chars() {
            match c {
                '\'' => quoted.push_str("\\'"),
                '\\' => quoted.push_str("\\\\"),
                '\n' => quoted.push_str("\\n"),
                '\t' => quoted.push_str("\\t"),
                c if u32::from(c) < 0x80 && c.is_control() => {
                    quoted.push_str(&format!("\\x{:02x}", u32::from(c)))
                }
                c if output::unsafe_for_terminal(c) => {
                    quoted.push_str(&format!("\\u{:04x}", u32::from(c)))
                }
                c => quoted.push(c),
            }
        }
        quoted.push('\'');
        quoted
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}
