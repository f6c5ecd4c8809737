//! Many steps of one kind as one statement (the `*_batches` views of
//! migration 0011; those of claims and commits recreated in 0013): one
//! round trip to sqlx's worker thread for every claim, turn write or
//! commit of a group transaction, instead of one each. A row
//! is a step's values as a JSON object (`*Step::row` in `admission.rs`,
//! `turns.rs`, `commit.rs`); ids and hashes are hex, which the statement
//! `unhex`es back into the blobs the single statements bind. A row whose
//! step would be refused is skipped and returns nothing; the group writer
//! runs it alone, which names the refusal.
//!
//! Each statement turns every row into JSONB once (`steps`, materialized)
//! and reads its fields from that. `json_each` hands out a row's `value`
//! as text made anew at each mention, and the mentions' parsing of it
//! again was about a third of a shared statement's instructions (SQLite
//! 3.46, which has no `jsonb_each`).

use sqlx::SqliteConnection;

use serde::Serialize;

use super::codec::{db, hex, to_i64};
use super::steps::raised;
use turnstile_core::store::Fence;
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

/// Why a shared statement wrote nothing.
pub(super) enum Failed {
    /// A step trigger refused one row by raising: SQLite undid the
    /// statement alone and the transaction goes on.
    Refused,
    /// Anything else, which may have ended the transaction.
    Error(Error),
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
        BatchKind::Claim => claims(conn, &rows).await,
        BatchKind::TurnWrite => turn_writes(conn, &rows).await,
        BatchKind::ToolResult => tool_results(conn, &rows).await,
        BatchKind::Commit => commits(conn, &rows).await,
    };
    let returned = written.map_err(|e| match raised(&e) {
        Some(_) => Failed::Refused,
        None => Failed::Error(db("write steps together")(e)),
    })?;
    returned
        .into_iter()
        .map(|(step, applied)| match usize::try_from(step) {
            Ok(step) => Ok((step, applied)),
            Err(_) => Err(Failed::Error(Error::Store(
                turnstile_core::StoreError::new("a shared statement returned no step", None),
            ))),
        })
        .collect()
}

async fn claims(
    conn: &mut SqliteConnection,
    rows: &str,
) -> Result<Vec<(i64, Applied)>, sqlx::Error> {
    let returned = sqlx::query!(
        r#"WITH steps AS MATERIALIZED (SELECT key, jsonb(value) AS fields FROM json_each(?1))
           INSERT INTO claim_batches (step, conversation_id, request_id, run_id,
               expected_revision, input_sha256, agent_fingerprint, now, input_role,
               input_content, input_meta, turn, phase, input_tokens, output_tokens,
               cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count,
               message_count, reports, deadline_at)
           SELECT key, unhex(fields ->> '$.conversation'), unhex(fields ->> '$.request'),
               unhex(fields ->> '$.run'), fields ->> '$.expected_revision',
               unhex(fields ->> '$.input_sha256'), fields ->> '$.agent_fingerprint',
               fields ->> '$.now', fields ->> '$.input_role', fields ->> '$.input_content',
               fields ->> '$.input_meta', fields ->> '$.turn', fields ->> '$.phase',
               fields ->> '$.input_tokens', fields ->> '$.output_tokens',
               fields ->> '$.cache_read_tokens', fields ->> '$.cache_write_tokens',
               fields ->> '$.tool_calls_count', fields ->> '$.reports_count',
               fields ->> '$.message_count', fields -> '$.reports', fields ->> '$.deadline_at'
           FROM steps
           RETURNING CAST(step AS INTEGER) AS "step!: i64",
               (SELECT revision FROM admissions
                WHERE conversation_id = claim_batches.conversation_id) AS "revision!: i64""#,
        rows
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(returned
        .into_iter()
        .map(|r| {
            (
                r.step,
                Applied::Claim {
                    revision: r.revision,
                },
            )
        })
        .collect())
}

async fn turn_writes(
    conn: &mut SqliteConnection,
    rows: &str,
) -> Result<Vec<(i64, Applied)>, sqlx::Error> {
    let returned = sqlx::query_scalar!(
        r#"WITH steps AS MATERIALIZED (SELECT key, jsonb(value) AS fields FROM json_each(?1))
           INSERT INTO turn_write_batches (step, conversation_id, request_id, run_id, revision,
               now, checkpoints, reports, turn, first_seq, messages, calls, compact, failure)
           SELECT key, unhex(fields ->> '$.conversation'), unhex(fields ->> '$.request'),
               unhex(fields ->> '$.run'), fields ->> '$.revision', fields ->> '$.now',
               fields -> '$.checkpoints', fields -> '$.reports', fields ->> '$.turn',
               fields ->> '$.first_seq', fields -> '$.messages', fields -> '$.calls',
               fields ->> '$.compact', fields ->> '$.failure'
           FROM steps
           RETURNING CAST(step AS INTEGER) AS "step!: i64""#,
        rows
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(returned
        .into_iter()
        .map(|step| (step, Applied::TurnWrite))
        .collect())
}

async fn tool_results(
    conn: &mut SqliteConnection,
    rows: &str,
) -> Result<Vec<(i64, Applied)>, sqlx::Error> {
    let returned = sqlx::query_scalar!(
        r#"WITH steps AS MATERIALIZED (SELECT key, jsonb(value) AS fields FROM json_each(?1))
           INSERT INTO tool_result_batches (step, conversation_id, request_id, run_id, revision,
               turn, call_id, status, result, now)
           SELECT key, unhex(fields ->> '$.conversation'), unhex(fields ->> '$.request'),
               unhex(fields ->> '$.run'), fields ->> '$.revision', fields ->> '$.turn',
               fields ->> '$.call_id', fields ->> '$.status', fields ->> '$.result',
               fields ->> '$.now'
           FROM steps
           RETURNING CAST(step AS INTEGER) AS "step!: i64""#,
        rows
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(returned
        .into_iter()
        .map(|step| (step, Applied::ToolResult))
        .collect())
}

async fn commits(
    conn: &mut SqliteConnection,
    rows: &str,
) -> Result<Vec<(i64, Applied)>, sqlx::Error> {
    // The RETURNING subqueries read the request row as its trigger left it.
    let returned = sqlx::query!(
        r#"WITH steps AS MATERIALIZED (SELECT key, jsonb(value) AS fields FROM json_each(?1))
           INSERT INTO commit_batches (step, conversation_id, request_id, run_id, revision, now,
               turn, phase, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
               tool_calls_count, reports_count, message_count, reports, answer_role,
               answer_content, answer_meta, final_seq)
           SELECT key, unhex(fields ->> '$.conversation'), unhex(fields ->> '$.request'),
               unhex(fields ->> '$.run'), fields ->> '$.revision', fields ->> '$.now',
               fields ->> '$.turn', fields ->> '$.phase', fields ->> '$.input_tokens',
               fields ->> '$.output_tokens', fields ->> '$.cache_read_tokens',
               fields ->> '$.cache_write_tokens', fields ->> '$.tool_calls_count',
               fields ->> '$.reports_count', fields ->> '$.message_count', fields -> '$.reports',
               fields ->> '$.answer_role', fields ->> '$.answer_content',
               fields ->> '$.answer_meta', fields ->> '$.final_seq'
           FROM steps
           RETURNING CAST(step AS INTEGER) AS "step!: i64",
               (SELECT conversation_version FROM requests
                WHERE request_id = commit_batches.request_id) AS "version!: i64",
               (SELECT first_seq FROM requests
                WHERE request_id = commit_batches.request_id) AS "first_seq!: i64",
               (SELECT end_seq FROM requests
                WHERE request_id = commit_batches.request_id) AS "end_seq!: i64""#,
        rows
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(returned
        .into_iter()
        .map(|r| {
            (
                r.step,
                Applied::Commit {
                    version: r.version,
                    first_seq: r.first_seq,
                    end_seq: r.end_seq,
                },
            )
        })
        .collect())
}

/// A run owner's fence in a step's row: the ids as hex, and the revision.
#[derive(Serialize)]
pub(super) struct FenceKeys {
    conversation: String,
    request: String,
    run: String,
    revision: i64,
}

impl FenceKeys {
    pub(super) fn of(fence: &Fence) -> Self {
        Self {
            conversation: hex(fence.conversation_id.as_uuid().as_bytes()),
            request: hex(fence.request_id.as_uuid().as_bytes()),
            run: hex(fence.run_id.as_uuid().as_bytes()),
            revision: to_i64(fence.revision.0),
        }
    }
}
