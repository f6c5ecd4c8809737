//! A tool call's result journaled by the run's owner (`tool_result.sql`).
//! Alone it is one fenced `UPDATE` of the call's journal row, with no view:
//! it lands only while the admission still names the owner's run and
//! revision. In a group transaction it is a row of the
//! `tool_result_batches` view, whose trigger skips a row it would refuse;
//! the writer then runs that result alone to name the refusal.
//!
//! Refusals: a replaced owner is [`Error::Fenced`]; a call that awaits no
//! result is [`Error::InvalidInput`].

use serde::Serialize;
use sqlx::SqliteConnection;

use super::{fenced, FenceKeys};
use crate::batch::Applied;
use crate::codec::{db, now_ms, to_json, FenceColumns};
use turnstile_core::backend::tool_result_columns;
use turnstile_core::store::{Fence, ToolResult};
use turnstile_core::Error;

/// One tool call's result, its values ready for its statement.
pub(crate) struct ToolResultStep {
    fence: Fence,
    turn: i64,
    call_id: String,
    status: &'static str,
    result: String,
    result_parts: Option<String>,
}

/// A [`ToolResultStep`] as its row of a shared statement (`batch.rs`).
#[derive(Serialize)]
struct ToolResultRow<'a> {
    #[serde(flatten)]
    fence: FenceKeys,
    turn: i64,
    call_id: &'a str,
    status: &'a str,
    result: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    result_parts: Option<&'a str>,
    now: i64,
}

impl ToolResultStep {
    pub(crate) fn new(
        fence: &Fence,
        turn: u32,
        call_id: &str,
        result: &ToolResult,
    ) -> Result<Self, Error> {
        let (text, parts) = tool_result_columns(result)?;
        Ok(Self {
            fence: *fence,
            turn: i64::from(turn),
            call_id: call_id.to_owned(),
            status: if result.is_error {
                "failed"
            } else {
                "completed"
            },
            result: text,
            result_parts: parts,
        })
    }

    /// Journals the result as a statement of its own, fenced in the same
    /// statement: it lands only while the admission still names this run.
    pub(crate) async fn write(&self, conn: &mut SqliteConnection) -> Result<(), Error> {
        // When the writer sends the step, not when it was queued.
        let now = now_ms();
        let fence = &self.fence;
        let f = FenceColumns::of(fence);
        let journaled = sqlx::query!(
            "UPDATE tool_calls SET status = ?1, result = ?2, completed_at = ?3, result_parts = ?10
             WHERE request_id = ?4 AND turn = ?5 AND call_id = ?6
                 AND status = 'requested'
                 AND EXISTS (SELECT 1 FROM admissions
                     WHERE conversation_id = ?7 AND revision = ?8 AND run_id = ?9
                         AND active_request_id = ?4)",
            self.status,
            self.result,
            now,
            f.request,
            self.turn,
            self.call_id,
            f.conversation,
            f.revision,
            f.run,
            self.result_parts
        )
        .execute(&mut *conn)
        .await
        .map_err(db("journal tool result"))?;
        if journaled.rows_affected() == 1 {
            return Ok(());
        }
        // Nothing written: either the owner was replaced, or there is no
        // such call waiting for its result.
        if !fence_holds(conn, fence).await? {
            return Err(fenced(fence));
        }
        Err(Error::InvalidInput(format!(
            "no requested tool call {:?} in turn {} of request {}",
            self.call_id, self.turn, fence.request_id
        )))
    }

    /// The step as its row of a shared statement.
    pub(crate) fn row(&self) -> Result<String, Error> {
        to_json(&ToolResultRow {
            fence: FenceKeys::of(&self.fence),
            turn: self.turn,
            call_id: &self.call_id,
            status: self.status,
            result: &self.result,
            result_parts: self.result_parts.as_deref(),
            now: now_ms(),
        })
    }
}

/// Whether the admission still names the owner's request, run and
/// revision. Reads only: for explaining a write that matched nothing.
async fn fence_holds(conn: &mut SqliteConnection, fence: &Fence) -> Result<bool, Error> {
    let f = FenceColumns::of(fence);
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM admissions
               WHERE conversation_id = ?1 AND revision = ?2 AND run_id = ?3
                   AND active_request_id = ?4) AS "holds!: bool""#,
        f.conversation,
        f.revision,
        f.run,
        f.request
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(db("check fence"))
}

/// Many results of one group transaction as one statement: a row each of
/// `tool_result_batches` (`batch.rs`).
pub(crate) async fn batch(
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
