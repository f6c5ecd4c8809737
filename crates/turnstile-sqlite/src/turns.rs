//! The writes of a run's owner during its turns. Each is one step of the
//! group writer (one transaction, or one savepoint of a shared one) whose
//! first statement is also its fence: a checkpoint or a journal row is
//! written only while the admission still names the owner's run and
//! revision. If the admission moved on, nothing is written and the owner
//! gets [`Error::Fenced`]. A turn with one tool call is three steps of seven
//! statements in all.

use sqlx::SqliteConnection;

use super::codec::{db, now_ms, to_i64, to_json};
use turnstile_core::checkpoint::LoopCheckpoint;
use turnstile_core::message::Message;
use turnstile_core::store::{Fence, ToolResult};
use turnstile_core::Error;

/// A turn's write-ahead checkpoint, inside the group transaction.
pub(super) async fn begin_turn_in(
    conn: &mut SqliteConnection,
    fence: &Fence,
    checkpoint: &LoopCheckpoint,
) -> Result<(), Error> {
    save_checkpoints(conn, fence, &[checkpoint]).await
}

/// The model's answer, its checkpoint and its tool calls journaled as
/// requested, inside the group transaction.
pub(super) async fn record_model_response_in(
    conn: &mut SqliteConnection,
    fence: &Fence,
    checkpoint: &LoopCheckpoint,
    assistant: &Message,
) -> Result<(), Error> {
    save_checkpoints(conn, fence, &[checkpoint]).await?;
    insert_messages(
        conn,
        fence,
        checkpoint.turn,
        checkpoint.message_count,
        std::slice::from_ref(assistant),
    )
    .await?;
    let request = fence.request_id.as_uuid();
    let run = fence.run_id.as_uuid();
    let turn = i64::from(checkpoint.turn);
    let calls = to_json(assistant.tool_calls())?;
    let now = now_ms();
    sqlx::query!(
        "INSERT INTO tool_calls (request_id, turn, call_id, position, run_id, name,
             arguments, status, created_at)
         SELECT ?1, ?2, value ->> '$.id', key, ?3, value ->> '$.name',
             value ->> '$.arguments', 'requested', ?4
         FROM json_each(?5)",
        request,
        turn,
        run,
        now,
        calls
    )
    .execute(&mut *conn)
    .await
    .map_err(db("journal tool calls"))?;
    Ok(())
}

/// One tool call's result, inside the group transaction.
pub(super) async fn record_tool_result_in(
    conn: &mut SqliteConnection,
    fence: &Fence,
    turn: u32,
    call_id: &str,
    result: &ToolResult,
) -> Result<(), Error> {
    let conversation = fence.conversation_id.as_uuid();
    let request = fence.request_id.as_uuid();
    let run = fence.run_id.as_uuid();
    let revision = to_i64(fence.revision.0);
    let turn = i64::from(turn);
    let status = if result.is_error {
        "failed"
    } else {
        "completed"
    };
    let now = now_ms();
    // Fenced in the same statement: the result lands only while the
    // admission still names this run.
    let journaled = sqlx::query!(
        "UPDATE tool_calls SET status = ?1, result = ?2, completed_at = ?3
         WHERE request_id = ?4 AND turn = ?5 AND call_id = ?6
             AND status = 'requested'
             AND EXISTS (SELECT 1 FROM admissions
                 WHERE conversation_id = ?7 AND revision = ?8 AND run_id = ?9
                     AND active_request_id = ?4)",
        status,
        result.content,
        now,
        request,
        turn,
        call_id,
        conversation,
        revision,
        run
    )
    .execute(&mut *conn)
    .await
    .map_err(db("journal tool result"))?;
    if journaled.rows_affected() == 1 {
        return Ok(());
    }
    // Nothing written: either the owner was replaced, or there is no such
    // call waiting for its result.
    check_fence(conn, fence).await?;
    Err(Error::InvalidInput(format!(
        "no requested tool call {call_id:?} in turn {turn} of request {}",
        fence.request_id
    )))
}

/// A turn's end, inside the group transaction: its checkpoint, the next
/// turn's write-ahead if any, and the turn's `messages` at `first_seq..`.
pub(super) async fn finish_turn_in(
    conn: &mut SqliteConnection,
    fence: &Fence,
    checkpoint: &LoopCheckpoint,
    first_seq: u64,
    messages: &[Message],
    next: Option<&LoopCheckpoint>,
) -> Result<(), Error> {
    // The turn's checkpoint and the next turn's write-ahead, in one fenced
    // statement.
    match next {
        Some(next) => save_checkpoints(conn, fence, &[checkpoint, next]).await?,
        None => save_checkpoints(conn, fence, &[checkpoint]).await?,
    }
    insert_messages(conn, fence, checkpoint.turn, first_seq, messages).await?;
    // The turn's calls and results are messages now: keep only the
    // journal's record of what ran.
    let request = fence.request_id.as_uuid();
    let turn = i64::from(checkpoint.turn);
    sqlx::query!(
        "UPDATE tool_calls SET arguments = NULL, result = NULL
         WHERE request_id = ?1 AND turn = ?2",
        request,
        turn
    )
    .execute(&mut *conn)
    .await
    .map_err(db("compact tool journal"))?;
    Ok(())
}

/// A run's failure, inside the group transaction.
pub(super) async fn fail_run_in(
    conn: &mut SqliteConnection,
    fence: &Fence,
    error: &str,
    settled: Option<&LoopCheckpoint>,
) -> Result<(), Error> {
    // A settled checkpoint may count usage the last write did not (an
    // answer refused as malformed): saving it is the fence, and the
    // admission reports its usage.
    match settled {
        Some(checkpoint) => save_checkpoints(conn, fence, &[checkpoint]).await?,
        None => check_fence(conn, fence).await?,
    }
    let run = fence.run_id.as_uuid();
    let now = now_ms();
    sqlx::query!(
        "UPDATE runs SET status = 'failed', error = ?1, ended_at = ?2
         WHERE run_id = ?3",
        error,
        now,
        run
    )
    .execute(&mut *conn)
    .await
    .map_err(db("record run failure"))?;
    Ok(())
}

/// The fence on its own, for writes that save no checkpoint: touches the
/// admission only while it still names the owner's run and revision.
pub(super) async fn check_fence(conn: &mut SqliteConnection, fence: &Fence) -> Result<(), Error> {
    let conversation = fence.conversation_id.as_uuid();
    let request = fence.request_id.as_uuid();
    let run = fence.run_id.as_uuid();
    let revision = to_i64(fence.revision.0);
    let now = now_ms();
    let updated = sqlx::query!(
        "UPDATE admissions SET updated_at = ?1
         WHERE conversation_id = ?2 AND revision = ?3 AND run_id = ?4 AND active_request_id = ?5",
        now,
        conversation,
        revision,
        run,
        request
    )
    .execute(&mut *conn)
    .await
    .map_err(db("fence"))?;
    match updated.rows_affected() {
        1 => Ok(()),
        _ => Err(fenced(fence)),
    }
}

pub(super) fn fenced(fence: &Fence) -> Error {
    Error::Fenced {
        run_id: fence.run_id,
        revision: fence.revision,
    }
}

/// Appends messages at `first_seq..` in one statement (a JSON array expanded
/// by `json_each`), whatever their number. Each row keeps the role and text
/// as columns and the message's other fields as `meta`.
pub(super) async fn insert_messages(
    conn: &mut SqliteConnection,
    fence: &Fence,
    turn: u32,
    first_seq: u64,
    messages: &[Message],
) -> Result<(), Error> {
    if messages.is_empty() {
        return Ok(());
    }
    let request = fence.request_id.as_uuid();
    let run = fence.run_id.as_uuid();
    let turn = i64::from(turn);
    let first_seq = to_i64(first_seq);
    let batch = to_json(messages)?;
    sqlx::query!(
        "INSERT INTO run_messages (request_id, seq, run_id, turn, role, content, meta)
         SELECT ?1, ?2 + key, ?3, ?4, value ->> '$.role', value ->> '$.content',
             NULLIF(json_remove(value, '$.role', '$.content'), '{}')
         FROM json_each(?5)",
        request,
        first_seq,
        run,
        turn,
        batch
    )
    .execute(&mut *conn)
    .await
    .map_err(db("insert run messages"))?;
    Ok(())
}

/// Saves checkpoint rows (a turn's, and the next turn's write-ahead) in one
/// statement that is also the fence: the rows are written only while the
/// admission names the owner's run and revision, and `Fenced` otherwise.
/// A row of the same turn is replaced whole (no other table refers to
/// checkpoint rows); the admission takes the last row's usage by trigger
/// (migration 0004).
/// Verification reports new in a checkpoint's turn are saved with it (the
/// earlier ones are already stored: a row only counts them).
pub(super) async fn save_checkpoints(
    conn: &mut SqliteConnection,
    fence: &Fence,
    checkpoints: &[&LoopCheckpoint],
) -> Result<(), Error> {
    let rows: Vec<serde_json::Value> = checkpoints.iter().map(|c| checkpoint_row(c)).collect();
    let rows = to_json(&rows)?;
    let conversation = fence.conversation_id.as_uuid();
    let request = fence.request_id.as_uuid();
    let run = fence.run_id.as_uuid();
    let revision = to_i64(fence.revision.0);
    let now = now_ms();
    let saved = sqlx::query!(
        "INSERT OR REPLACE INTO loop_checkpoints (run_id, turn, phase, input_tokens,
             output_tokens, cache_read_tokens, cache_write_tokens, tool_calls_count,
             reports_count, message_count, created_at)
         SELECT a.run_id, value ->> '$.turn', value ->> '$.phase', value ->> '$.input',
             value ->> '$.output', value ->> '$.cache_read', value ->> '$.cache_write',
             value ->> '$.tool_calls', value ->> '$.reports', value ->> '$.messages', ?1
         FROM admissions a, json_each(?2)
         WHERE a.conversation_id = ?3 AND a.revision = ?4 AND a.run_id = ?5
             AND a.active_request_id = ?6
         ORDER BY key",
        now,
        rows,
        conversation,
        revision,
        run,
        request
    )
    .execute(&mut *conn)
    .await
    .map_err(db("save checkpoint"))?;
    if saved.rows_affected() == 0 {
        return Err(fenced(fence));
    }
    for checkpoint in checkpoints {
        save_new_reports(conn, fence, checkpoint).await?;
    }
    Ok(())
}

/// One checkpoint as the JSON object `save_checkpoints` expands.
fn checkpoint_row(checkpoint: &LoopCheckpoint) -> serde_json::Value {
    let usage = checkpoint.usage;
    serde_json::json!({
        "turn": checkpoint.turn,
        "phase": checkpoint.phase.as_str(),
        "input": to_i64(usage.input_tokens),
        "output": to_i64(usage.output_tokens),
        "cache_read": to_i64(usage.cache_read_tokens),
        "cache_write": to_i64(usage.cache_write_tokens),
        "tool_calls": to_i64(checkpoint.tool_calls_count),
        "reports": checkpoint.verification_reports.len(),
        "messages": to_i64(checkpoint.message_count),
    })
}

/// The verification reports a checkpoint's own turn added.
async fn save_new_reports(
    conn: &mut SqliteConnection,
    fence: &Fence,
    checkpoint: &LoopCheckpoint,
) -> Result<(), Error> {
    let reports = &checkpoint.verification_reports;
    let Some(first_new) = reports.iter().position(|r| r.turn == checkpoint.turn) else {
        return Ok(());
    };
    let request = fence.request_id.as_uuid();
    let first_seq = to_i64(first_new as u64);
    let batch = to_json(&reports[first_new..])?;
    sqlx::query!(
        "INSERT INTO verification_reports (request_id, seq, turn, passed, detail)
         SELECT ?1, ?2 + key, value ->> '$.turn', value ->> '$.passed', value ->> '$.detail'
         FROM json_each(?3) WHERE true
         ON CONFLICT (request_id, seq) DO NOTHING",
        request,
        first_seq,
        batch
    )
    .execute(&mut *conn)
    .await
    .map_err(db("save verification reports"))?;
    Ok(())
}
