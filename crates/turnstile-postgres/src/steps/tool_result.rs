//! A tool call's result journaled by the run's owner: one statement that
//! commits on its own, fenced (the admission row is locked first; its
//! activity time moves only when the result lands, so a refused result
//! writes nothing). A retry whose first attempt committed finds exactly
//! this result journaled, and is done.
//!
//! Refusals: a replaced owner is [`Error::Fenced`]; a call that awaits no
//! result is [`Error::InvalidInput`].

use sqlx::PgConnection;

use super::fenced;
use crate::codec::{db, now_ms, to_i64};
use turnstile_core::backend::tool_result_columns;
use turnstile_core::store::{Fence, ToolResult};
use turnstile_core::Error;

/// One tool call's result: one statement, fenced.
pub(crate) async fn record_tool_result(
    conn: &mut PgConnection,
    fence: &Fence,
    turn: u32,
    call_id: &str,
    result: &ToolResult,
    retry: bool,
) -> Result<(), Error> {
    let status = if result.is_error {
        "failed"
    } else {
        "completed"
    };
    let (text, parts) = tool_result_columns(result)?;
    let row = sqlx::query!(
        r#"WITH fence AS (
               SELECT conversation_id FROM admissions
               WHERE conversation_id = $1 AND revision = $2 AND run_id = $3
                 AND active_request_id = $4
               FOR UPDATE
           ), journaled AS (
               UPDATE tool_calls t SET status = $6, result = $7, completed_at = $5,
                   result_parts = $10
               FROM fence f
               WHERE t.conversation_id = f.conversation_id AND t.request_id = $4 AND t.turn = $8
                 AND t.call_id = $9 AND t.status = 'requested'
               RETURNING 1
           ), touched AS (
               UPDATE admissions SET updated_at = $5
               WHERE conversation_id = $1 AND EXISTS (SELECT 1 FROM journaled)
           )
           SELECT (SELECT COUNT(*) FROM fence) AS "fenced!",
                  (SELECT COUNT(*) FROM journaled) AS "journaled!""#,
        fence.conversation_id.as_uuid(),
        to_i64(fence.revision.0),
        fence.run_id.as_uuid(),
        fence.request_id.as_uuid(),
        now_ms(),
        status,
        text.as_bytes(),
        i64::from(turn),
        call_id.as_bytes(),
        parts.as_deref()
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(db("journal tool result"))?;
    if row.fenced == 0 {
        return Err(fenced(fence));
    }
    if row.journaled == 1 {
        return Ok(());
    }
    if retry
        && result_stored(
            conn,
            fence,
            turn,
            call_id,
            status,
            (&text, parts.as_deref()),
        )
        .await?
    {
        return Ok(());
    }
    Err(Error::InvalidInput(format!(
        "no requested tool call {call_id:?} in turn {turn} of request {}",
        fence.request_id
    )))
}

/// Whether exactly this result is journaled for the call (a retry whose
/// first attempt committed).
async fn result_stored(
    conn: &mut PgConnection,
    fence: &Fence,
    turn: u32,
    call_id: &str,
    status: &str,
    (text, parts): (&str, Option<&str>),
) -> Result<bool, Error> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM tool_calls
               WHERE conversation_id = $1 AND request_id = $2 AND turn = $3 AND call_id = $4
                 AND status = $5 AND result = $6
                 AND result_parts IS NOT DISTINCT FROM $7) AS "stored!""#,
        fence.conversation_id.as_uuid(),
        fence.request_id.as_uuid(),
        i64::from(turn),
        call_id.as_bytes(),
        status,
        text.as_bytes(),
        parts
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(db("read tool result"))
}
