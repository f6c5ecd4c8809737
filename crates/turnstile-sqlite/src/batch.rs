//! Many steps of one kind as one statement (the `*_batches` views of the
//! step files, `steps/*.sql`): one round trip to sqlx's worker thread for
//! every claim, turn write, tool result or commit of a group transaction,
//! instead of one each. A row is a step's values as a JSON object (its
//! step's `row`), and the statement is its step's `batch` (both in
//! `steps/*.rs`); ids and hashes are hex, which the statement `unhex`es
//! back into the blobs the single statements bind. A row whose step would
//! be refused is skipped and returns nothing; the group writer runs it
//! alone, which names the refusal.
//!
//! Each statement turns every row into JSONB once (`steps`, materialized)
//! and reads its fields from that. `json_each` hands out a row's `value`
//! as text made anew at each mention, and the mentions' parsing of it
//! again was about a third of a shared statement's instructions (SQLite
//! 3.46, which has no `jsonb_each`).

use sqlx::SqliteConnection;

use super::codec::db;
use super::steps::{claim, commit, raised, tool_result, turn_write};
use turnstile_core::Error;

/// The kinds of step that share a statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum BatchKind {
    Claim,
    TurnWrite,
    ToolResult,
    Commit,
}

impl BatchKind {
    /// Every kind, in the order a group transaction sends them. Steps in
    /// one batch are concurrent (a session waits for each of its steps; a
    /// lease renewal runs beside its run's steps and is fenced if it comes
    /// after the commit), so any order is one they could have had.
    pub(super) const ALL: [BatchKind; 4] =
        [Self::Claim, Self::TurnWrite, Self::ToolResult, Self::Commit];
}

/// What an applied step's row returned.
#[derive(Debug)]
pub(super) enum Applied {
    Claim {
        revision: i64,
    },
    TurnWrite,
    ToolResult,
    Commit {
        version: i64,
        first_seq: i64,
        end_seq: i64,
    },
}

/// Why a shared statement's steps were not answered from its rows.
pub(super) enum Failed {
    /// A step trigger refused one row by raising: SQLite undid the
    /// statement alone and the transaction goes on.
    Refused,
    /// SQLite failed the statement, which wrote nothing; the error may
    /// have ended the transaction.
    Error(Error),
    /// The statement ran, then what it returned could not be read: inside
    /// a transaction its writes are still undone with it, outside one they
    /// are committed.
    Unread(Error),
}

/// Writes `rows` (each a JSON object) as one statement; returns each
/// applied row's position and what it returned.
pub(super) async fn write(
    conn: &mut SqliteConnection,
    kind: BatchKind,
    rows: &[String],
) -> Result<Vec<(usize, Applied)>, Failed> {
    let rows = format!("[{}]", rows.join(","));
    let written = match kind {
        BatchKind::Claim => claim::batch(conn, &rows).await,
        BatchKind::TurnWrite => turn_write::batch(conn, &rows).await,
        BatchKind::ToolResult => tool_result::batch(conn, &rows).await,
        BatchKind::Commit => commit::batch(conn, &rows).await,
    };
    let returned = written.map_err(|e| match (raised(&e), &e) {
        (Some(_), _) => Failed::Refused,
        (None, sqlx::Error::Database(_)) => Failed::Error(db("write steps together")(e)),
        // A row sqlx could not decode, or its worker gone: maybe after
        // the statement wrote.
        (None, _) => Failed::Unread(db("read the steps written together")(e)),
    })?;
    returned
        .into_iter()
        .map(|(step, applied)| match usize::try_from(step) {
            Ok(step) => Ok((step, applied)),
            Err(_) => Err(Failed::Unread(Error::Store(
                turnstile_core::StoreError::new("a shared statement returned no step", None),
            ))),
        })
        .collect()
}
