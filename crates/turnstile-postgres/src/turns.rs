//! The writes of a run's owner during its turns. Each starts with its
//! fence: an update of the admission row that matches only while the
//! admission still names the owner's run and revision, and that holds the
//! row's lock until the step commits. If the admission moved on, nothing is
//! written and the owner gets [`Error::Fenced`]. The fence also records the
//! step as the admission's latest activity, and a checkpoint's usage as the
//! request's latest usage (what SQLite's triggers do).

use sqlx::PgConnection;

use super::codec::{db, now_ms, to_i64};
use turnstile_core::checkpoint::LoopCheckpoint;
use turnstile_core::message::Message;
use turnstile_core::store::columns::message_columns;
use turnstile_core::store::{Fence, ToolResult};
use turnstile_core::Error;

/// The model's answer, its checkpoint and its tool calls journaled as
/// requested, inside the step's transaction.
pub(crate) async fn record_model_response_in(
    conn: &mut PgConnection,
    fence: &Fence,
    checkpoint: &LoopCheckpoint,
    assistant: &Message,
    retry: bool,
) -> Result<(), Error> {
    save_checkpoints(conn, fence, &[checkpoint]).await?;
    // A retry of a step whose commit was acknowledged too late finds its
    // answer stored: the step is done.
    if retry && message_stored(conn, fence, checkpoint.message_count).await? {
        return Ok(());
    }
    insert_messages(
        conn,
        fence,
        checkpoint.turn,
        checkpoint.message_count,
        std::slice::from_ref(assistant),
    )
    .await?;
    let calls = assistant.tool_calls();
    let ids: Vec<&[u8]> = calls.iter().map(|c| c.id.as_bytes()).collect();
    let names: Vec<&[u8]> = calls.iter().map(|c| c.name.as_bytes()).collect();
    let arguments: Vec<&[u8]> = calls.iter().map(|c| c.arguments.as_bytes()).collect();
    sqlx::query!(
        "INSERT INTO tool_calls (conversation_id, request_id, turn, call_id, position, run_id,
             name, arguments, status, created_at)
         SELECT $1, $2, $3, c.id, c.position - 1, $4, c.name, c.arguments, 'requested', $5
         FROM UNNEST($6::bytea[], $7::bytea[], $8::bytea[])
             WITH ORDINALITY AS c(id, name, arguments, position)",
        fence.conversation_id.as_uuid(),
        fence.request_id.as_uuid(),
        i64::from(checkpoint.turn),
        fence.run_id.as_uuid(),
        now_ms(),
        &ids as &[&[u8]],
        &names as &[&[u8]],
        &arguments as &[&[u8]]
    )
    .execute(&mut *conn)
    .await
    .map_err(db("journal tool calls"))?;
    Ok(())
}

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
    let row = sqlx::query!(
        r#"WITH fence AS (
               UPDATE admissions SET updated_at = $5
               WHERE conversation_id = $1 AND revision = $2 AND run_id = $3
                 AND active_request_id = $4
               RETURNING conversation_id
           ), journaled AS (
               UPDATE tool_calls t SET status = $6, result = $7, completed_at = $5
               FROM fence f
               WHERE t.conversation_id = f.conversation_id AND t.request_id = $4 AND t.turn = $8
                 AND t.call_id = $9 AND t.status = 'requested'
               RETURNING 1
           )
           SELECT (SELECT COUNT(*) FROM fence) AS "fenced!",
                  (SELECT COUNT(*) FROM journaled) AS "journaled!""#,
        fence.conversation_id.as_uuid(),
        to_i64(fence.revision.0),
        fence.run_id.as_uuid(),
        fence.request_id.as_uuid(),
        now_ms(),
        status,
        result.content.as_bytes(),
        i64::from(turn),
        call_id.as_bytes()
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
    if retry && result_stored(conn, fence, turn, call_id, status, result).await? {
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
    result: &ToolResult,
) -> Result<bool, Error> {
    let stored = sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM tool_calls
               WHERE conversation_id = $1 AND request_id = $2 AND turn = $3 AND call_id = $4
                 AND status = $5 AND result = $6) AS "stored!""#,
        fence.conversation_id.as_uuid(),
        fence.request_id.as_uuid(),
        i64::from(turn),
        call_id.as_bytes(),
        status,
        result.content.as_bytes()
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(db("read tool result"))?;
    Ok(stored)
}

/// A turn's end, inside its transaction: its checkpoint and the next turn's
/// write-ahead, the turn's `messages` at `first_seq..`, and the journal
/// compacted (the calls and results are messages now).
pub(crate) async fn finish_turn_in(
    conn: &mut PgConnection,
    fence: &Fence,
    checkpoint: &LoopCheckpoint,
    first_seq: u64,
    messages: &[Message],
    next: Option<&LoopCheckpoint>,
    retry: bool,
) -> Result<(), Error> {
    match next {
        Some(next) => save_checkpoints(conn, fence, &[checkpoint, next]).await?,
        None => save_checkpoints(conn, fence, &[checkpoint]).await?,
    }
    // Stored already by a first attempt whose acknowledgement was lost.
    if !(retry && !messages.is_empty() && message_stored(conn, fence, first_seq).await?) {
        insert_messages(conn, fence, checkpoint.turn, first_seq, messages).await?;
    }
    sqlx::query!(
        "UPDATE tool_calls SET arguments = NULL, result = NULL
         WHERE conversation_id = $1 AND request_id = $2 AND turn = $3",
        fence.conversation_id.as_uuid(),
        fence.request_id.as_uuid(),
        i64::from(checkpoint.turn)
    )
    .execute(&mut *conn)
    .await
    .map_err(db("compact tool journal"))?;
    Ok(())
}

/// A run's failure, inside its transaction.
pub(crate) async fn fail_run_in(
    conn: &mut PgConnection,
    fence: &Fence,
    error: &str,
    settled: Option<&LoopCheckpoint>,
) -> Result<(), Error> {
    // A settled checkpoint may count usage the last write did not: saving
    // it is the fence, and the admission reports its usage.
    match settled {
        Some(checkpoint) => save_checkpoints(conn, fence, &[checkpoint]).await?,
        None => check_fence(conn, fence).await?,
    }
    sqlx::query!(
        "UPDATE runs SET status = 'failed', error = $1, ended_at = $2
         WHERE conversation_id = $3 AND run_id = $4",
        error.as_bytes(),
        now_ms(),
        fence.conversation_id.as_uuid(),
        fence.run_id.as_uuid()
    )
    .execute(&mut *conn)
    .await
    .map_err(db("record run failure"))?;
    Ok(())
}

/// The fence on its own, for steps that save no checkpoint.
pub(crate) async fn check_fence(conn: &mut PgConnection, fence: &Fence) -> Result<(), Error> {
    let updated = sqlx::query!(
        "UPDATE admissions SET updated_at = $1
         WHERE conversation_id = $2 AND revision = $3 AND run_id = $4 AND active_request_id = $5",
        now_ms(),
        fence.conversation_id.as_uuid(),
        to_i64(fence.revision.0),
        fence.run_id.as_uuid(),
        fence.request_id.as_uuid()
    )
    .execute(&mut *conn)
    .await
    .map_err(db("fence"))?;
    match updated.rows_affected() {
        1 => Ok(()),
        _ => Err(fenced(fence)),
    }
}

pub(crate) fn fenced(fence: &Fence) -> Error {
    Error::Fenced {
        run_id: fence.run_id,
        revision: fence.revision,
    }
}

/// Whether the request has a pending message at `seq`.
async fn message_stored(conn: &mut PgConnection, fence: &Fence, seq: u64) -> Result<bool, Error> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM run_messages
               WHERE conversation_id = $1 AND request_id = $2 AND seq = $3) AS "stored!""#,
        fence.conversation_id.as_uuid(),
        fence.request_id.as_uuid(),
        to_i64(seq)
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(db("read run messages"))
}

/// Appends messages at `first_seq..` in one statement, whatever their
/// number.
pub(crate) async fn insert_messages(
    conn: &mut PgConnection,
    fence: &Fence,
    turn: u32,
    first_seq: u64,
    messages: &[Message],
) -> Result<(), Error> {
    if messages.is_empty() {
        return Ok(());
    }
    let columns = messages
        .iter()
        .map(message_columns)
        .collect::<Result<Vec<_>, _>>()?;
    let roles: Vec<&str> = columns.iter().map(|c| c.0.as_str()).collect();
    let contents: Vec<&[u8]> = columns.iter().map(|c| c.1.as_bytes()).collect();
    // `meta` is NULL for most messages; an array of text cannot say so
    // through the checked macros, so the empty string stands for it.
    let metas: Vec<&str> = columns
        .iter()
        .map(|c| c.2.as_deref().unwrap_or(""))
        .collect();
    sqlx::query!(
        "INSERT INTO run_messages (conversation_id, request_id, seq, run_id, turn, role, content,
             meta)
         SELECT $1, $2, $3 + m.position - 1, $4, $5, m.role, m.content, NULLIF(m.meta, '')
         FROM UNNEST($6::text[], $7::bytea[], $8::text[])
             WITH ORDINALITY AS m(role, content, meta, position)",
        fence.conversation_id.as_uuid(),
        fence.request_id.as_uuid(),
        to_i64(first_seq),
        fence.run_id.as_uuid(),
        i64::from(turn),
        &roles as &[&str],
        &contents as &[&[u8]],
        &metas as &[&str]
    )
    .execute(&mut *conn)
    .await
    .map_err(db("insert run messages"))?;
    Ok(())
}

/// Saves checkpoint rows (a turn's, and the next turn's write-ahead) in one
/// statement that is also the fence: the rows, and the verification
/// reports new in their turns, are written only while the admission names
/// the owner's run and revision, and `Fenced` otherwise. A row of the same
/// turn is replaced whole.
pub(crate) async fn save_checkpoints(
    conn: &mut PgConnection,
    fence: &Fence,
    checkpoints: &[&LoopCheckpoint],
) -> Result<(), Error> {
    let Some(last) = checkpoints.last() else {
        return check_fence(conn, fence).await;
    };
    let column = |f: fn(&LoopCheckpoint) -> u64| -> Vec<i64> {
        checkpoints.iter().map(|c| to_i64(f(c))).collect()
    };
    let turns = column(|c| u64::from(c.turn));
    let phases: Vec<&str> = checkpoints.iter().map(|c| c.phase.as_str()).collect();
    let inputs = column(|c| c.usage.input_tokens);
    let outputs = column(|c| c.usage.output_tokens);
    let cache_reads = column(|c| c.usage.cache_read_tokens);
    let cache_writes = column(|c| c.usage.cache_write_tokens);
    let tool_calls = column(|c| c.tool_calls_count);
    let reports = column(|c| c.verification_reports.len() as u64);
    let message_counts = column(|c| c.message_count);
    // The reports a checkpoint's own turn added (the earlier ones are
    // stored already: a row only counts them).
    let (mut report_seqs, mut report_turns, mut passed, mut details) =
        (vec![], vec![], vec![], vec![]);
    for checkpoint in checkpoints {
        let all = &checkpoint.verification_reports;
        if let Some(first_new) = all.iter().position(|r| r.turn == checkpoint.turn) {
            for (seq, report) in all.iter().enumerate().skip(first_new) {
                report_seqs.push(seq as i64);
                report_turns.push(i64::from(report.turn));
                passed.push(report.passed);
                details.push(report.detail.as_bytes());
            }
        }
    }
    let usage = last.usage;
    let fenced_rows = sqlx::query_scalar!(
        r#"WITH fence AS (
               UPDATE admissions
               SET input_tokens = $5, output_tokens = $6, cache_read_tokens = $7,
                   cache_write_tokens = $8, updated_at = $9
               WHERE conversation_id = $1 AND revision = $2 AND run_id = $3
                 AND active_request_id = $4
               RETURNING conversation_id
           ), saved AS (
               INSERT INTO loop_checkpoints (conversation_id, run_id, turn, phase, input_tokens,
                   output_tokens, cache_read_tokens, cache_write_tokens, tool_calls_count,
                   reports_count, message_count, created_at)
               SELECT f.conversation_id, $3, c.turn, c.phase, c.input, c.output, c.cache_read,
                   c.cache_write, c.tool_calls, c.reports, c.messages, $9
               FROM fence f, UNNEST($10::bigint[], $11::text[], $12::bigint[], $13::bigint[],
                   $14::bigint[], $15::bigint[], $16::bigint[], $17::bigint[], $18::bigint[])
                   AS c(turn, phase, input, output, cache_read, cache_write, tool_calls, reports,
                        messages)
               ON CONFLICT (conversation_id, run_id, turn) DO UPDATE SET
                   phase = EXCLUDED.phase, input_tokens = EXCLUDED.input_tokens,
                   output_tokens = EXCLUDED.output_tokens,
                   cache_read_tokens = EXCLUDED.cache_read_tokens,
                   cache_write_tokens = EXCLUDED.cache_write_tokens,
                   tool_calls_count = EXCLUDED.tool_calls_count,
                   reports_count = EXCLUDED.reports_count,
                   message_count = EXCLUDED.message_count, created_at = EXCLUDED.created_at
           ), reports AS (
               INSERT INTO verification_reports (conversation_id, request_id, seq, turn, passed,
                   detail)
               SELECT f.conversation_id, $4, r.seq, r.turn, r.passed, r.detail
               FROM fence f, UNNEST($19::bigint[], $20::bigint[], $21::boolean[], $22::bytea[])
                   AS r(seq, turn, passed, detail)
               ON CONFLICT DO NOTHING
           )
           SELECT COUNT(*) AS "fenced!" FROM fence"#,
        fence.conversation_id.as_uuid(),
        to_i64(fence.revision.0),
        fence.run_id.as_uuid(),
        fence.request_id.as_uuid(),
        to_i64(usage.input_tokens),
        to_i64(usage.output_tokens),
        to_i64(usage.cache_read_tokens),
        to_i64(usage.cache_write_tokens),
        now_ms(),
        &turns,
        &phases as &[&str],
        &inputs,
        &outputs,
        &cache_reads,
        &cache_writes,
        &tool_calls,
        &reports,
        &message_counts,
        &report_seqs,
        &report_turns,
        &passed,
        &details as &[&[u8]]
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(db("save checkpoint"))?;
    if fenced_rows == 0 {
        return Err(fenced(fence));
    }
    Ok(())
}
