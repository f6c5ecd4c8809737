//! The writes of a run's owner during its turns. Each is one transaction
//! that starts with the fence: if the admission moved past the owner's
//! revision, nothing is written and the owner gets [`Error::Fenced`].

use sqlx::SqliteConnection;

use super::codec::{db, now_ms, to_i64, to_json};
use super::SqliteStore;
use crate::checkpoint::LoopCheckpoint;
use crate::message::Message;
use crate::store::{Fence, ToolResult};
use crate::Error;

impl SqliteStore {
    pub(super) async fn begin_turn_impl(
        &self,
        fence: &Fence,
        checkpoint: &LoopCheckpoint,
    ) -> Result<(), Error> {
        let (fence, checkpoint) = (*fence, checkpoint.clone());
        self.group
            .write(move |conn| {
                Box::pin(async move {
                    check_fence(conn, &fence, &checkpoint).await?;
                    upsert_checkpoint(conn, &fence, &checkpoint).await
                })
            })
            .await
    }

    pub(super) async fn record_model_response_impl(
        &self,
        fence: &Fence,
        checkpoint: &LoopCheckpoint,
        assistant: &Message,
    ) -> Result<(), Error> {
        let (fence, checkpoint) = (*fence, checkpoint.clone());
        let calls = to_json(assistant.tool_calls())?;
        let assistant = assistant.clone();
        self.group
            .write(move |conn| {
                Box::pin(async move {
                    check_fence(conn, &fence, &checkpoint).await?;
                    insert_messages(
                        conn,
                        &fence,
                        checkpoint.turn,
                        checkpoint.message_count,
                        std::slice::from_ref(&assistant),
                    )
                    .await?;
                    let request = fence.request_id.as_uuid();
                    let run = fence.run_id.as_uuid();
                    let turn = i64::from(checkpoint.turn);
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
                    upsert_checkpoint(conn, &fence, &checkpoint).await
                })
            })
            .await
    }

    pub(super) async fn record_tool_result_impl(
        &self,
        fence: &Fence,
        turn: u32,
        call_id: &str,
        result: &ToolResult,
    ) -> Result<(), Error> {
        let fence = *fence;
        let call_id = call_id.to_owned();
        let result = result.clone();
        self.group
            .write(move |conn| {
                Box::pin(async move {
                    check_fence_only(conn, &fence).await?;
                    let request = fence.request_id.as_uuid();
                    let turn = i64::from(turn);
                    let status = if result.is_error {
                        "failed"
                    } else {
                        "completed"
                    };
                    let now = now_ms();
                    let journaled = sqlx::query!(
                        "UPDATE tool_calls SET status = ?1, result = ?2, completed_at = ?3
                         WHERE request_id = ?4 AND turn = ?5 AND call_id = ?6
                             AND status = 'requested'",
                        status,
                        result.content,
                        now,
                        request,
                        turn,
                        call_id
                    )
                    .execute(&mut *conn)
                    .await
                    .map_err(db("journal tool result"))?;
                    if journaled.rows_affected() != 1 {
                        return Err(Error::InvalidInput(format!(
                            "no requested tool call {call_id:?} in turn {turn} of request {}",
                            fence.request_id
                        )));
                    }
                    Ok(())
                })
            })
            .await
    }

    pub(super) async fn finish_turn_impl(
        &self,
        fence: &Fence,
        checkpoint: &LoopCheckpoint,
        messages: &[Message],
        next: Option<&LoopCheckpoint>,
    ) -> Result<(), Error> {
        let first_seq = checkpoint
            .message_count
            .checked_sub(messages.len() as u64)
            .ok_or_else(|| {
                Error::InvalidInput("checkpoint message_count is below the turn's messages".into())
            })?;
        let (fence, checkpoint) = (*fence, checkpoint.clone());
        let messages = messages.to_vec();
        let next = next.cloned();
        self.group
            .write(move |conn| {
                Box::pin(async move {
                    // The fence records the usage of the latest checkpoint
                    // written: the next turn's write-ahead when there is one.
                    check_fence(conn, &fence, next.as_ref().unwrap_or(&checkpoint)).await?;
                    insert_messages(conn, &fence, checkpoint.turn, first_seq, &messages).await?;
                    upsert_checkpoint(conn, &fence, &checkpoint).await?;
                    // The turn's calls and results are messages now: keep
                    // only the journal's record of what ran.
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
                    if let Some(next) = &next {
                        upsert_checkpoint(conn, &fence, next).await?;
                    }
                    Ok(())
                })
            })
            .await
    }

    pub(super) async fn fail_run_impl(
        &self,
        fence: &Fence,
        error: &str,
        settled: Option<&LoopCheckpoint>,
    ) -> Result<(), Error> {
        let fence = *fence;
        let error = error.to_owned();
        let settled = settled.cloned();
        self.group
            .write(move |conn| {
                Box::pin(async move {
                    // A settled checkpoint may count usage the last write did
                    // not (an answer refused as malformed): the admission
                    // reports it too.
                    match &settled {
                        Some(checkpoint) => check_fence(conn, &fence, checkpoint).await?,
                        None => check_fence_only(conn, &fence).await?,
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
                    if let Some(checkpoint) = &settled {
                        upsert_checkpoint(conn, &fence, checkpoint).await?;
                    }
                    Ok(())
                })
            })
            .await
    }
}

/// The fence, also recording the checkpoint's usage as the request's latest
/// persisted usage (what `recovery_usage` reports).
pub(super) async fn check_fence(
    conn: &mut SqliteConnection,
    fence: &Fence,
    checkpoint: &LoopCheckpoint,
) -> Result<(), Error> {
    let conversation = fence.conversation_id.as_uuid();
    let request = fence.request_id.as_uuid();
    let run = fence.run_id.as_uuid();
    let revision = to_i64(fence.revision.0);
    let usage = checkpoint.usage;
    let (input, output) = (to_i64(usage.input_tokens), to_i64(usage.output_tokens));
    let (cache_read, cache_write) = (
        to_i64(usage.cache_read_tokens),
        to_i64(usage.cache_write_tokens),
    );
    let now = now_ms();
    let updated = sqlx::query!(
        "UPDATE admissions SET input_tokens = ?1, output_tokens = ?2, cache_read_tokens = ?3,
             cache_write_tokens = ?4, updated_at = ?5
         WHERE conversation_id = ?6 AND revision = ?7 AND run_id = ?8 AND active_request_id = ?9",
        input,
        output,
        cache_read,
        cache_write,
        now,
        conversation,
        revision,
        run,
        request
    )
    .execute(&mut *conn)
    .await
    .map_err(db("fence"))?;
    fenced_unless_one(fence, updated.rows_affected())
}

/// The fence for writes that carry no usage.
pub(super) async fn check_fence_only(
    conn: &mut SqliteConnection,
    fence: &Fence,
) -> Result<(), Error> {
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
    fenced_unless_one(fence, updated.rows_affected())
}

fn fenced_unless_one(fence: &Fence, rows: u64) -> Result<(), Error> {
    if rows == 1 {
        Ok(())
    } else {
        Err(Error::Fenced {
            run_id: fence.run_id,
            revision: fence.revision,
        })
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

/// Saves a checkpoint row, and the verification reports of its turn (the
/// earlier ones are already stored: a row only counts them).
pub(super) async fn upsert_checkpoint(
    conn: &mut SqliteConnection,
    fence: &Fence,
    checkpoint: &LoopCheckpoint,
) -> Result<(), Error> {
    let reports = &checkpoint.verification_reports;
    let first_new = reports
        .iter()
        .position(|r| r.turn == checkpoint.turn)
        .unwrap_or(reports.len());
    if first_new < reports.len() {
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
    }
    // The fence's run, whatever the checkpoint says: an owner writes only
    // its own run's rows.
    let run = fence.run_id.as_uuid();
    let turn = i64::from(checkpoint.turn);
    let phase = checkpoint.phase.as_str();
    let usage = checkpoint.usage;
    let (input, output) = (to_i64(usage.input_tokens), to_i64(usage.output_tokens));
    let (cache_read, cache_write) = (
        to_i64(usage.cache_read_tokens),
        to_i64(usage.cache_write_tokens),
    );
    let tool_calls = to_i64(checkpoint.tool_calls_count);
    let reports_count = to_i64(reports.len() as u64);
    let message_count = to_i64(checkpoint.message_count);
    let now = now_ms();
    sqlx::query!(
        "INSERT INTO loop_checkpoints (run_id, turn, phase, input_tokens, output_tokens,
             cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count,
             message_count, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
         ON CONFLICT (run_id, turn) DO UPDATE SET phase = excluded.phase,
             input_tokens = excluded.input_tokens, output_tokens = excluded.output_tokens,
             cache_read_tokens = excluded.cache_read_tokens,
             cache_write_tokens = excluded.cache_write_tokens,
             tool_calls_count = excluded.tool_calls_count,
             reports_count = excluded.reports_count,
             message_count = excluded.message_count, created_at = excluded.created_at",
        run,
        turn,
        phase,
        input,
        output,
        cache_read,
        cache_write,
        tool_calls,
        reports_count,
        message_count,
        now
    )
    .execute(&mut *conn)
    .await
    .map_err(db("save checkpoint"))?;
    Ok(())
}
