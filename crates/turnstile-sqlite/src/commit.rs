//! The commit: one transaction that appends the request's messages to the
//! transcript, bumps the conversation version, stores the outcome for replay,
//! releases the admission and completes the run. There is no moment where
//! the answer is committed but the conversation is still held.

use sqlx::SqliteConnection;

use super::codec::{db, now_ms, to_i64, to_json, Row};
use super::turns::{fenced, save_checkpoints};
use turnstile_core::checkpoint::{CheckpointPhase, LoopCheckpoint};
use turnstile_core::message::Message;
use turnstile_core::store::{Fence, StoredOutcome};
use turnstile_core::Error;

/// The commit's writes, inside the group transaction.
pub(super) async fn commit_in(
    tx: &mut SqliteConnection,
    fence: &Fence,
    checkpoint: &LoopCheckpoint,
    final_message: &Message,
) -> Result<StoredOutcome, Error> {
    let conversation = fence.conversation_id.as_uuid();
    let request = fence.request_id.as_uuid();
    let run = fence.run_id.as_uuid();
    let revision = to_i64(fence.revision.0);
    let now = now_ms();
    let final_seq = checkpoint.message_count.checked_sub(1).ok_or_else(|| {
        Error::InvalidInput("a commit checkpoint must count the final message".into())
    })?;

    // The committed turn's checkpoint holds the outcome's totals; saving it
    // is the fence.
    let completed = LoopCheckpoint {
        phase: CheckpointPhase::Completed,
        ..checkpoint.clone()
    };
    save_checkpoints(&mut *tx, fence, &[&completed]).await?;
    let released = sqlx::query!(
        "UPDATE admissions
         SET active_request_id = NULL, input_sha256 = NULL, run_id = NULL, agent_fingerprint = NULL,
             input_tokens = 0, output_tokens = 0, cache_read_tokens = 0, cache_write_tokens = 0,
             summary_passes = 0, summary_from_seq = NULL, summary_through_seq = NULL,
             summary_version = NULL, summary_prompt_sha256 = NULL,
             revision = revision + 1, updated_at = ?1
         WHERE conversation_id = ?2 AND revision = ?3 AND run_id = ?4",
        now,
        conversation,
        revision,
        run
    )
    .execute(&mut *tx)
    .await
    .map_err(db("release admission"))?;
    if released.rows_affected() != 1 {
        return Err(fenced(fence));
    }

    // The new version, and where the request's messages start: after the
    // transcript's current end.
    let placed = sqlx::query!(
        r#"UPDATE conversations SET version = version + 1 WHERE id = ?1
           RETURNING version AS "version!: i64",
               (SELECT COALESCE(MAX(seq) + 1, 0) FROM transcript WHERE conversation_id = ?1)
                   AS "first_seq!: i64""#,
        conversation
    )
    .fetch_one(&mut *tx)
    .await
    .map_err(db("bump conversation version"))?;
    let (version, first_seq) = (placed.version, placed.first_seq);
    // The pending messages and the final answer move to the transcript in
    // one statement.
    let answer = to_json(std::slice::from_ref(final_message))?;
    let final_seq = to_i64(final_seq);
    let moved = sqlx::query!(
        "INSERT INTO transcript (conversation_id, seq, request_id, role, content, meta)
         SELECT ?1, ?2 + seq, request_id, role, content, meta FROM run_messages
         WHERE request_id = ?3
         UNION ALL
         SELECT ?1, ?2 + ?4, ?3, value ->> '$.role', value ->> '$.content',
             NULLIF(json_remove(value, '$.role', '$.content'), '{}')
         FROM json_each(?5)
         ORDER BY 2",
        conversation,
        first_seq,
        request,
        final_seq,
        answer
    )
    .execute(&mut *tx)
    .await
    .map_err(db("append transcript"))?
    .rows_affected();
    sqlx::query!("DELETE FROM run_messages WHERE request_id = ?1", request)
        .execute(&mut *tx)
        .await
        .map_err(db("clear run messages"))?;
    let end_seq = first_seq.saturating_add(i64::try_from(moved).unwrap_or(i64::MAX));
    sqlx::query!(
        "UPDATE requests SET status = 'completed', committed_run_id = ?1,
             conversation_version = ?2, first_seq = ?3, end_seq = ?4, completed_at = ?5
         WHERE request_id = ?6",
        run,
        version,
        first_seq,
        end_seq,
        now,
        request
    )
    .execute(&mut *tx)
    .await
    .map_err(db("complete request"))?;
    sqlx::query!(
        "UPDATE runs SET status = 'completed', ended_at = ?1 WHERE run_id = ?2",
        now,
        run
    )
    .execute(&mut *tx)
    .await
    .map_err(db("complete run"))?;
    let key = Row {
        table: "conversations",
        key: &fence.conversation_id,
    };
    Ok(StoredOutcome {
        run_id: fence.run_id,
        usage: checkpoint.usage,
        turns: checkpoint.turn,
        tool_calls: checkpoint.tool_calls_count,
        verification_reports: checkpoint.verification_reports.clone(),
        conversation_version: key.u64("version", version)?,
        first_seq: key.u64("seq", first_seq)?,
        end_seq: key.u64("seq", end_seq)?,
    })
}
