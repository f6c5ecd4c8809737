//! Exit codes of the `turnstile` command and the command's error type.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success (a replayed request included) |
//! | 1 | any other failure: a stopped run (model error, budget, deadline, Ctrl-C), a failed integrity check (`doctor`), the database (a PostgreSQL server that cannot be reached, or went away mid-run, included), I/O; a command whose work committed but whose write-ahead log could not be folded back at close (keep the `-wal` file) |
//! | 2 | usage: a bad argument, unreadable script, empty input, a request bound to another input, conversation, namespace or agent, an abandoned request id; a `--db` that holds no database (a directory, a FIFO, a text file, random bytes) |
//! | 3 | busy: the conversation is held by an active request, or another process held the database's write lock past the busy timeout |
//! | 4 | not found: database file (or PostgreSQL database, or its turnstile schema), conversation, request or run; a deleted conversation (the message says so) |
//! | 5 | fenced, conflict (stale `--revision`, a stale `delete --version`, or stale metadata `--version` of `meta`), ambiguous checkpoint, request not active, a tool call that awaits no decision (`approve`/`reject` of a call decided already or never asked about) |
//! | 6 | awaiting approval: the run stopped cleanly (admission held) until tool calls are approved or rejected; it printed them and the commands that decide them |
//! | 7 | `doctor` could not open the database to check it (no permission, not a regular file, a read-only directory, a server that cannot be reached): nothing is known about its health |
//!
//! `recover-expired` takes over several requests: it exits with the code of
//! the first one it could not finish (0 when none failed).
//!
//! Scripts can tell "retry later" (3), "fix the command" (2), "look it up"
//! (4), "re-read the state and decide" (5) and "a human must decide" (6)
//! apart without parsing text; with `--json` a failure also prints an
//! [`ErrorDocument`] on stdout.

use std::fmt;

use serde::Serialize;
use turnstile::ids::{ConversationId, RequestId, Revision, RunId};
use turnstile::Error;

/// Success is 0 (`ExitCode::SUCCESS`). Any failure not listed below.
pub const FAILURE: u8 = 1;
/// Bad usage or input, or a mismatch with what is stored.
pub const USAGE: u8 = 2;
/// The conversation is busy with an active request, or another process held
/// the database's write lock past the busy timeout.
pub const BUSY: u8 = 3;
/// Something named does not exist.
pub const NOT_FOUND: u8 = 4;
/// The state moved: fenced, conflicting revision, ambiguous checkpoint.
pub const CONFLICT: u8 = 5;
/// The run stopped to wait for a human's approval of tool calls.
pub const AWAITING_APPROVAL: u8 = 6;
/// The database could not be opened to be checked (`doctor`): no
/// permission, not a regular file, a read-only directory. Says nothing
/// about its health.
pub const CANNOT_OPEN: u8 = 7;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CliError {
    /// Bad arguments or input, detected before anything was written.
    #[error("{0}")]
    Usage(String),
    /// A command that needs an existing database was pointed at none: a
    /// file path, or a URL (without its password).
    #[error("database {0} not found")]
    MissingDatabase(String),
    /// A command that needs an existing database was pointed at a
    /// PostgreSQL database (shown without its password) that turnstile
    /// never wrote to.
    #[error(
        "database {0} has no turnstile schema (not found): a writing command \
         such as `turnstile run` creates it"
    )]
    MissingSchema(String),
    /// The library refused or failed.
    #[error(transparent)]
    Turnstile(#[from] Error),
    /// Reading or writing a file, a pipe or the terminal failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// Anything else, in words.
    #[error("{0}")]
    Failed(String),
    /// A database that could not be opened to be examined.
    #[error("{0}")]
    CannotOpen(String),
    /// A run stopped with its admission held (cancelled, budget, deadline,
    /// model error): the error, the run and revision that continue it, and
    /// the command that does; for a spent budget, the command that gives
    /// the request up instead.
    #[error("{source}; continue it with: {next}")]
    Stopped {
        #[source]
        source: Error,
        run_id: RunId,
        revision: Revision,
        next: Box<NextSteps>,
    },
    /// A run whose database server could not be reached past the busy
    /// timeout: it may have written (a step can be applied before its
    /// answer is lost) and it still holds the admission; the command that
    /// continues it once the server is back.
    #[error(
        "{source}; the database server could not be reached, so the run stopped: it may have \
         written before the server went away, and it still holds the conversation; once the \
         server is back, continue it with: {resume}"
    )]
    Unreachable {
        #[source]
        source: Error,
        run_id: RunId,
        revision: Revision,
        resume: String,
    },
    /// The command's work is done (committed), but closing the database
    /// could not fold its write-ahead log back into the file (a full disk):
    /// the file alone lacks the latest commits, which are in the `-wal`
    /// file beside it. `database` is the file, when the command named one.
    #[error("{}", unfolded_message(database.as_deref(), source))]
    Unfolded {
        #[source]
        source: Error,
        database: Option<std::path::PathBuf>,
    },
    /// A library error with what to change to get past it.
    #[error("{source}: {advice}")]
    Advised {
        #[source]
        source: Error,
        advice: &'static str,
    },
    /// Requests `recover-expired` took over (or tried to) and did not
    /// commit: how many of those listed, and the first one's error (whose
    /// exit code is the command's).
    #[error("{failed} of {listed} expired requests were not recovered; the first: {first}")]
    Unrecovered {
        failed: usize,
        listed: usize,
        #[source]
        first: Error,
    },
    /// A failure of a request whose id (or whose new conversation's id) was
    /// generated: the ids are named so the request can be retried or
    /// recovered.
    #[error("{source} ({}request {request_id})", conversation_id.map_or(String::new(), |c| format!("conversation {c}, ")))]
    ForRequest {
        request_id: turnstile::ids::RequestId,
        /// The conversation, when the command started a new one.
        conversation_id: Option<ConversationId>,
        #[source]
        source: Box<CliError>,
    },
}

impl CliError {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| CliError::Io { context, source }
    }

    /// The documented exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => USAGE,
            CliError::MissingDatabase(_) | CliError::MissingSchema(_) => NOT_FOUND,
            CliError::Turnstile(e)
            | CliError::Stopped { source: e, .. }
            | CliError::Unreachable { source: e, .. }
            | CliError::Advised { source: e, .. }
            | CliError::Unrecovered { first: e, .. } => code_for(e),
            CliError::Io { .. } | CliError::Failed(_) | CliError::Unfolded { .. } => FAILURE,
            CliError::CannotOpen(_) => CANNOT_OPEN,
            CliError::ForRequest { source, .. } => source.exit_code(),
        }
    }

    /// Whether another process kept the database locked past the busy
    /// timeout.
    fn is_locked_out(&self) -> bool {
        match self {
            CliError::Turnstile(Error::Store(e))
            | CliError::Stopped {
                source: Error::Store(e),
                ..
            } => e.is_busy(),
            CliError::ForRequest { source, .. } => source.is_locked_out(),
            _ => false,
        }
    }

    /// What to do next, for an error whose message does not say it already
    /// (a stopped run names its `resume` command instead).
    fn next_step(&self) -> Option<&'static str> {
        match self {
            CliError::MissingDatabase(_) => Some(
                "check the path (a PostgreSQL URL starts with postgres://); `turnstile run` \
                 creates a new database",
            ),
            CliError::Turnstile(e) => next_step_for(e),
            CliError::ForRequest { source, .. } => source.next_step(),
            _ => None,
        }
    }

    /// Whether a run of this command stopped holding its admission (and
    /// the error names the command that continues it).
    fn holds_a_stopped_run(&self) -> bool {
        match self {
            CliError::Stopped { .. } | CliError::Unreachable { .. } => true,
            CliError::ForRequest { source, .. } => source.holds_a_stopped_run(),
            _ => false,
        }
    }

    /// Whether the command failed only because its standard output was
    /// closed (a pipe's reader exited).
    pub fn is_closed_output(&self) -> bool {
        match self {
            CliError::Io { source, .. } => source.kind() == std::io::ErrorKind::BrokenPipe,
            CliError::ForRequest { source, .. } => source.is_closed_output(),
            _ => false,
        }
    }

    /// The message on one line, with the causes a summary would hide
    /// (a database error's driver message) appended.
    pub fn one_line(&self) -> String {
        let mut line = self.to_string();
        if self.is_locked_out() {
            // A stopped run kept what it wrote before the step that waited.
            let written = match self.holds_a_stopped_run() {
                true => "this step was not written (the run's earlier steps are kept)",
                false => "nothing was written, retry later",
            };
            line.insert_str(
                0,
                &format!(
                    "busy: another process held the database's write lock past the busy \
                     timeout (--busy-timeout); {written}: "
                ),
            );
        }
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            let text = cause.to_string();
            if !line.contains(&text) {
                line.push_str(": ");
                line.push_str(&text);
            }
            source = cause.source();
        }
        if let Some(step) = self.next_step() {
            line.push_str("; ");
            line.push_str(step);
        }
        // Line breaks (a driver's multi-line message) become spaces; runs of
        // spaces stay, since the resume hint's quoted words keep theirs.
        line.split(['\n', '\r'])
            .filter(|part| !part.is_empty())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// What `--json` prints on stdout when a command fails before printing
/// anything else: one document a script can act on without parsing the
/// `error:` line. The ids and revision are those the error names (or the
/// command was given); `next` is the command that continues a stopped run.
#[derive(Debug, Serialize)]
pub struct ErrorDocument {
    /// Always `"error"` (a run that waits for approval prints
    /// `"awaiting_approval"` instead, with exit 6).
    pub status: &'static str,
    /// What went wrong, as a stable word: see [`CliError::kind`].
    pub kind: &'static str,
    /// The process's exit code.
    pub exit_code: u8,
    /// The `error:` line's text, without the `error: ` prefix (control and
    /// reordering characters escaped as there).
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conversation_id: Option<ConversationId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<RequestId>,
    /// The request that holds the conversation (busy): with `revision`,
    /// what `recover`, `abandon` or `delete --revision` need.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder_request_id: Option<RequestId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<RunId>,
    /// The admission revision to pass as `--revision` to continue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<Revision>,
    /// The command that continues the request, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// The command that gives the request up instead (a spent budget).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub give_up: Option<String>,
}

/// The ids a failed command was given, filled into its error document
/// where the error itself names none.
#[derive(Clone, Copy, Debug, Default)]
pub struct Given {
    pub conversation_id: Option<ConversationId>,
    pub request_id: Option<RequestId>,
}

impl CliError {
    /// The same error naming `database`, the file the command worked on,
    /// where it says which files to keep.
    pub fn on_database(self, database: Option<&std::path::Path>) -> Self {
        match self {
            CliError::Unfolded { source, .. } => CliError::Unfolded {
                source,
                database: database.map(std::path::Path::to_path_buf),
            },
            error => error,
        }
    }
}

impl CliError {
    /// The error as a JSON document (see [`ErrorDocument`]).
    pub fn document(&self, given: Given) -> ErrorDocument {
        let mut doc = ErrorDocument {
            status: "error",
            kind: self.kind(),
            exit_code: self.exit_code(),
            message: super::text::plain(&self.one_line()).into_owned(),
            conversation_id: None,
            request_id: None,
            holder_request_id: None,
            run_id: None,
            revision: None,
            next: None,
            give_up: None,
        };
        self.fill(&mut doc);
        doc.conversation_id = doc.conversation_id.or(given.conversation_id);
        doc.request_id = doc.request_id.or(given.request_id);
        doc
    }

    fn fill(&self, doc: &mut ErrorDocument) {
        match self {
            CliError::Turnstile(e) | CliError::Advised { source: e, .. } => fill_from(e, doc),
            CliError::Unrecovered { first, .. } => fill_from(first, doc),
            CliError::Stopped {
                source,
                run_id,
                revision,
                next,
            } => {
                fill_from(source, doc);
                doc.run_id = Some(*run_id);
                doc.revision = Some(*revision);
                doc.next = Some(next.resume.clone());
                doc.give_up = next.give_up.clone();
            }
            CliError::Unreachable {
                source,
                run_id,
                revision,
                resume,
            } => {
                fill_from(source, doc);
                doc.run_id = Some(*run_id);
                doc.revision = Some(*revision);
                doc.next = Some(resume.clone());
            }
            CliError::ForRequest {
                request_id,
                conversation_id,
                source,
            } => {
                source.fill(doc);
                doc.request_id = Some(*request_id);
                doc.conversation_id = doc.conversation_id.or(*conversation_id);
            }
            _ => {}
        }
    }

    /// A stable word for what went wrong: `usage`, `not_found`, `deleted`,
    /// `busy`, `locked` (another process held the database), `unreachable`,
    /// `full`, `conflict`, `fenced`, `ambiguous_checkpoint`, `not_active`,
    /// `stopped` (a run stopped with its admission held), `unfolded` (the
    /// work is committed, but the `-wal` file must be kept), `cannot_open`,
    /// `integrity`, `io` or `failure`.
    pub fn kind(&self) -> &'static str {
        match self {
            CliError::Usage(_) => "usage",
            CliError::MissingDatabase(_) | CliError::MissingSchema(_) => "not_found",
            CliError::Turnstile(e)
            | CliError::Advised { source: e, .. }
            | CliError::Unrecovered { first: e, .. } => kind_of(e),
            CliError::Unreachable { .. } => "unreachable",
            CliError::Stopped { source, .. } => match kind_of(source) {
                "failure" => "stopped",
                kind => kind,
            },
            CliError::Io { .. } => "io",
            CliError::Unfolded { .. } => "unfolded",
            CliError::Failed(_) => "failure",
            CliError::CannotOpen(_) => "cannot_open",
            CliError::ForRequest { source, .. } => source.kind(),
        }
    }
}

/// The commands a stopped run's error names: the `resume` that continues
/// it and, for a spent budget, the `abandon` that gives the request up.
/// Boxed: errors travel in every `Result` of the CLI.
#[derive(Debug)]
pub struct NextSteps {
    pub resume: String,
    pub give_up: Option<String>,
}

impl fmt::Display for NextSteps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.resume)?;
        match &self.give_up {
            Some(command) => write!(f, "; or give the request up with: {command}"),
            None => Ok(()),
        }
    }
}

/// What [`CliError::Unfolded`] says: what is where, what to keep and what
/// to do.
fn unfolded_message(database: Option<&std::path::Path>, source: &Error) -> String {
    let (db, wal) = match database {
        Some(path) => {
            let mut wal = path.as_os_str().to_owned();
            wal.push("-wal");
            let quote = |p: &std::path::Path| super::text::quote(&p.display().to_string());
            (quote(path), quote(std::path::Path::new(&wal)))
        }
        None => ("the database file".to_owned(), "its -wal file".to_owned()),
    };
    format!(
        "the command's work is committed, but closing the database could not fold its \
         write-ahead log back into {db} ({source}): {db} alone lacks the latest commits, which \
         are in {wal}; keep {wal} with {db} (copy or move them together), make room, then run \
         any turnstile command on it (such as `turnstile doctor --db {db}`) to fold it"
    )
}

/// What to do after a library error (see [`CliError::one_line`]).
fn next_step_for(error: &Error) -> Option<&'static str> {
    Some(match error {
        Error::Busy { .. } => {
            "retry once that request finishes; if its owner is gone, continue it with \
             `turnstile recover` (or `turnstile resume` of its run), give it up with \
             `turnstile abandon`, or delete the conversation with `turnstile delete \
             --revision`, each at the revision above"
        }
        Error::AmbiguousCheckpoint { .. } => {
            "add --retry-interrupted to re-run that turn (tool calls whose results are \
             journaled are not run again), or give the request up with `turnstile abandon`"
        }
        Error::Conflict { .. } => {
            "re-read the current revision (`turnstile show CONVERSATION` or `turnstile ls \
             requests`) and pass it as --revision"
        }
        Error::VersionConflict { .. } => {
            "re-read the conversation's version (`turnstile show CONVERSATION`) and pass it \
             as --version"
        }
        Error::MetaVersionConflict { .. } => {
            "re-read the metadata (`turnstile meta CONVERSATION`) and pass its version as \
             --version"
        }
        Error::RequestMismatch { .. } | Error::RequestAbandoned { .. } => {
            "a new input needs a new request id: pass another --request, or leave it out"
        }
        Error::NamespaceMismatch { .. } => "pass the conversation's own --namespace",
        Error::Store(e) if e.is_full() => {
            "make room (or raise --max-db-bytes), then run the same command again"
        }
        _ => return None,
    })
}

/// The kind of a library error (see [`CliError::kind`]).
fn kind_of(error: &Error) -> &'static str {
    match error {
        Error::Busy { .. } => "busy",
        Error::Store(e) if e.is_busy() => "locked",
        Error::Store(e) if e.is_full() => "full",
        Error::Store(e) if e.is_unreachable() => "unreachable",
        Error::NotFound { .. } => "not_found",
        Error::Deleted { .. } => "deleted",
        Error::Fenced { .. } => "fenced",
        Error::AmbiguousCheckpoint { .. } => "ambiguous_checkpoint",
        Error::NotActive { .. } => "not_active",
        Error::AwaitingApproval { .. } => "awaiting_approval",
        Error::Conflict { .. }
        | Error::VersionConflict { .. }
        | Error::MetaVersionConflict { .. }
        | Error::NoPendingApproval { .. } => "conflict",
        _ if error.stopped_run().is_some() => "stopped",
        _ => match code_for(error) {
            USAGE => "usage",
            _ => "failure",
        },
    }
}

/// The ids and revision a library error names.
fn fill_from(error: &Error, doc: &mut ErrorDocument) {
    if let Some((run_id, revision)) = error.stopped_run() {
        doc.run_id = Some(run_id);
        doc.revision = Some(revision);
    }
    match error {
        Error::Busy {
            conversation_id,
            request_id,
            revision,
        } => {
            doc.conversation_id = Some(*conversation_id);
            doc.holder_request_id = Some(*request_id);
            doc.revision = Some(*revision);
        }
        Error::Conflict {
            conversation_id,
            actual,
            ..
        } => {
            doc.conversation_id = Some(*conversation_id);
            doc.revision = Some(*actual);
        }
        Error::Fenced { run_id, revision } => {
            doc.run_id = Some(*run_id);
            doc.revision = Some(*revision);
        }
        Error::AmbiguousCheckpoint { run_id, .. } => doc.run_id = Some(*run_id),
        Error::AwaitingApproval { request_id, .. }
        | Error::RequestMismatch { request_id, .. }
        | Error::RequestAbandoned { request_id }
        | Error::NotActive { request_id }
        | Error::ConfigurationMismatch { request_id }
        | Error::NoPendingApproval { request_id, .. } => doc.request_id = Some(*request_id),
        Error::NamespaceMismatch {
            conversation_id, ..
        }
        | Error::Deleted { conversation_id }
        | Error::VersionConflict {
            conversation_id, ..
        }
        | Error::MetaVersionConflict {
            conversation_id, ..
        } => doc.conversation_id = Some(*conversation_id),
        _ => {}
    }
}

impl From<std::io::Error> for CliError {
    fn from(source: std::io::Error) -> Self {
        CliError::Io {
            context: "write output".into(),
            source,
        }
    }
}

/// The exit code of a library error.
pub fn code_for(error: &Error) -> u8 {
    match error {
        Error::Busy { .. } => BUSY,
        Error::RequestMismatch { .. }
        | Error::RequestAbandoned { .. }
        | Error::NamespaceMismatch { .. }
        | Error::ConfigurationMismatch { .. }
        | Error::InvalidInput(_) => USAGE,
        Error::NotFound { .. } | Error::Deleted { .. } => NOT_FOUND,
        Error::Fenced { .. }
        | Error::VersionConflict { .. }
        | Error::Conflict { .. }
        | Error::AmbiguousCheckpoint { .. }
        | Error::NotActive { .. }
        | Error::NoPendingApproval { .. }
        | Error::MetaVersionConflict { .. } => CONFLICT,
        Error::AwaitingApproval { .. } => AWAITING_APPROVAL,
        // Another process held the database past the busy timeout: retry
        // later, like a busy conversation.
        Error::Store(e) if e.is_busy() => BUSY,
        _ => FAILURE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_errors_map_to_documented_codes() {
        let conversation_id = ConversationId::new();
        let request_id = RequestId::new();
        let busy = Error::Busy {
            conversation_id,
            request_id,
            revision: Revision(3),
        };
        assert_eq!(code_for(&busy), BUSY);
        let conflict = Error::Conflict {
            conversation_id,
            expected: Revision(1),
            actual: Revision(2),
        };
        assert_eq!(code_for(&conflict), CONFLICT);
        let ambiguous = Error::AmbiguousCheckpoint {
            run_id: RunId::new(),
            turn: 2,
        };
        assert_eq!(code_for(&ambiguous), CONFLICT);
        let missing = Error::NotFound {
            what: "run",
            id: "x".into(),
        };
        assert_eq!(code_for(&missing), NOT_FOUND);
        assert_eq!(code_for(&Error::InvalidInput("x".into())), USAGE);
        let awaiting = Error::AwaitingApproval {
            request_id,
            run_id: RunId::new(),
            revision: Revision(4),
            pending: Vec::new(),
        };
        assert_eq!(code_for(&awaiting), AWAITING_APPROVAL);
        let decided = Error::NoPendingApproval {
            request_id,
            call_id: "c1".into(),
        };
        assert_eq!(code_for(&decided), CONFLICT, "the state moved");
        assert_eq!(
            code_for(&Error::RequestAbandoned { request_id }),
            USAGE,
            "a burned request id is fixed by using another one"
        );
        assert_eq!(
            CliError::MissingDatabase("x.db".into()).exit_code(),
            NOT_FOUND
        );
    }

    #[test]
    fn one_line_joins_causes_and_newlines() {
        let io = std::io::Error::other("disk\nfull");
        let e = CliError::io("write x")(io);
        assert_eq!(e.one_line(), "write x: disk full");
    }
}
