//! The options the session commands share: where the conversation lives
//! and how its store is opened, and the `--revision` they compare against.

use clap::Args;

use super::access::Limits;
use super::budget_args::BudgetArgs;
use super::db::DbLocation;
use super::ops;
use turnstile::ids::{ConversationId, Namespace, Revision};

/// Where a conversation lives: the options every session command shares.
#[derive(Args, Clone, Debug)]
pub struct SessionArgs {
    /// The database: a SQLite file, or a PostgreSQL URL
    /// (`postgres://user@host/db`; a password left out of it comes from
    /// PGPASSWORD or ~/.pgpass).
    #[arg(long, value_name = "PATH|URL")]
    pub db: DbLocation,
    /// The conversation id.
    #[arg(long, value_name = "UUID")]
    pub conversation: ConversationId,
    /// The tenant namespace of the conversation.
    #[arg(long, value_name = "NS", default_value = Namespace::DEFAULT)]
    pub namespace: Namespace,
    /// A size quota for the database file, in bytes: a write past it fails
    /// like a full disk and loses nothing (the run stops, resumable once
    /// there is room). SQLite only.
    #[arg(long, value_name = "BYTES")]
    pub max_db_bytes: Option<u64>,
    /// How long a write waits for another process's lock on the database
    /// before the command exits busy (3). Default 30s. On PostgreSQL: the
    /// wait for a connection, and each statement's `statement_timeout`.
    #[arg(long, value_name = "DURATION", value_parser = ops::parse_duration)]
    pub busy_timeout: Option<std::time::Duration>,
}

impl SessionArgs {
    /// The store settings these flags ask for.
    pub(crate) fn limits(&self) -> Limits {
        Limits {
            max_db_bytes: self.max_db_bytes,
            busy_timeout: self.busy_timeout,
        }
    }
}

/// `run`'s [`SessionArgs`]: the same options, with the conversation
/// optional (a new one is generated when it is absent).
#[derive(Args, Clone, Debug)]
pub struct NewSessionArgs {
    /// The database: a SQLite file, or a PostgreSQL URL
    /// (`postgres://user@host/db`; a password left out of it comes from
    /// PGPASSWORD or ~/.pgpass).
    #[arg(long, value_name = "PATH|URL")]
    pub db: DbLocation,
    /// The conversation id. When absent, a new conversation is started and
    /// its id printed (pass it as --conversation to continue it).
    #[arg(long, value_name = "UUID")]
    pub conversation: Option<ConversationId>,
    /// The tenant namespace of the conversation.
    #[arg(long, value_name = "NS", default_value = Namespace::DEFAULT)]
    pub namespace: Namespace,
    /// A size quota for the database file, in bytes: a write past it fails
    /// like a full disk and loses nothing (the run stops, resumable once
    /// there is room). SQLite only.
    #[arg(long, value_name = "BYTES")]
    pub max_db_bytes: Option<u64>,
    /// How long a write waits for another process's lock on the database
    /// before the command exits busy (3). Default 30s. On PostgreSQL: the
    /// wait for a connection, and each statement's `statement_timeout`.
    #[arg(long, value_name = "DURATION", value_parser = ops::parse_duration)]
    pub busy_timeout: Option<std::time::Duration>,
}

impl NewSessionArgs {
    /// The session options on `conversation`.
    pub(crate) fn on(self, conversation: ConversationId) -> SessionArgs {
        SessionArgs {
            db: self.db,
            conversation,
            namespace: self.namespace,
            max_db_bytes: self.max_db_bytes,
            busy_timeout: self.busy_timeout,
        }
    }
}

/// Parses a `--revision`: a non-negative integer.
pub(super) fn parse_revision(s: &str) -> Result<Revision, String> {
    s.parse::<u64>()
        .map(Revision)
        .map_err(|_| format!("the revision must be a non-negative integer, got {s:?}"))
}

/// How `resume`, `recover` and `recover-expired` continue a request.
#[derive(Args, Clone, Copy, Debug)]
pub struct ContinueArgs {
    #[command(flatten)]
    pub budget: BudgetArgs,
    /// Re-run a turn that was in flight (journaled tool results are reused).
    /// Without it a request whose owner stopped inside a turn is refused
    /// (exit 5) and left held.
    #[arg(long)]
    pub retry_interrupted: bool,
    /// Continue even if the request was run with another agent (model,
    /// tools, approval rules): the run records both agent fingerprints.
    #[arg(long)]
    pub accept_agent_change: bool,
}
