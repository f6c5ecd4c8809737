//! Many steps of one kind as one statement (the `*_batches` views of
//! migration 0011): one round trip to sqlx's worker thread for every claim,
//! turn write or commit of a group transaction, instead of one each. A row
//! is a step's values as a JSON object (`*Step::row` in `admission.rs`,
//! `turns.rs`, `commit.rs`); ids and hashes are hex, which the statement
//! `unhex`es back into the blobs the single statements bind. A row whose
//! step would be refused is skipped and returns nothing; the group writer
//! runs it alone, which names the refusal.

use sqlx::SqliteConnection;

use serde::Serialize;

use super::codec::{db, hex, raised, to_i64};
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
        r#"INSERT INTO claim_batches (step, conversation_id, request_id, run_id,
               expected_revision, input_sha256, agent_fingerprint, now, input_role,
               input_content, input_meta, turn, phase, input_tokens, output_tokens,
               cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count,
               message_count, reports, deadline_at)
           SELECT key, unhex(value ->> '$.conversation'), unhex(value ->> '$.request'),
               unhex(value ->> '$.run'), value ->> '$.expected_revision',
               unhex(value ->> '$.input_sha256'), value ->> '$.agent_fingerprint',
               value ->> '$.now', value ->> '$.input_role', value ->> '$.input_content',
               value ->> '$.input_meta', value ->> '$.turn', value ->> '$.phase',
               value ->> '$.input_tokens', value ->> '$.output_tokens',
               value ->> '$.cache_read_tokens', value ->> '$.cache_write_tokens',
               value ->> '$.tool_calls_count', value ->> '$.reports_count',
               value ->> '$.message_count', value -> '$.reports', value ->> '$.deadline_at'
           FROM json_each(?1)
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
        r#"INSERT INTO turn_write_batches (step, conversation_id, request_id, run_id, revision,
               now, checkpoints, reports, turn, first_seq, messages, calls, compact, failure)
           SELECT key, unhex(value ->> '$.conversation'), unhex(value ->> '$.request'),
               unhex(value ->> '$.run'), value ->> '$.revision', value ->> '$.now',
               value -> '$.checkpoints', value -> '$.reports', value ->> '$.turn',
               value ->> '$.first_seq', value -> '$.messages', value -> '$.calls',
               value ->> '$.compact', value ->> '$.failure'
           FROM json_each(?1)
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
        r#"INSERT INTO tool_result_batches (step, conversation_id, request_id, run_id, revision,
               turn, call_id, status, result, now)
           SELECT key, unhex(value ->> '$.conversation'), unhex(value ->> '$.request'),
               unhex(value ->> '$.run'), value ->> '$.revision', value ->> '$.turn',
               value ->> '$.call_id', value ->> '$.status', value ->> '$.result',
               value ->> '$.now'
           FROM json_each(?1)
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
        r#"INSERT INTO commit_batches (step, conversation_id, request_id, run_id, revision, now,
               turn, phase, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
               tool_calls_count, reports_count, message_count, reports, answer_role,
               answer_content, answer_meta, final_seq)
           SELECT key, unhex(value ->> '$.conversation'), unhex(value ->> '$.request'),
               unhex(value ->> '$.run'), value ->> '$.revision', value ->> '$.now',
               value ->> '$.turn', value ->> '$.phase', value ->> '$.input_tokens',
               value ->> '$.output_tokens', value ->> '$.cache_read_tokens',
               value ->> '$.cache_write_tokens', value ->> '$.tool_calls_count',
               value ->> '$.reports_count', value ->> '$.message_count', value -> '$.reports',
               value ->> '$.answer_role', value ->> '$.answer_content',
               value ->> '$.answer_meta', value ->> '$.final_seq'
           FROM json_each(?1)
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
