//! The commit: one statement (an `INSERT` into the `commits` view of
//! migration 0005) whose trigger, fenced, appends the request's messages to
//! the transcript, bumps the conversation version, stores the outcome for
//! replay, releases the admission and completes the run. There is no moment
//! where the answer is committed but the conversation is still held.

use sqlx::SqliteConnection;

use super::codec::{db, now_ms, raised, to_i64, to_json, Raised, Row};
use super::turns::{checkpoint_rows, fenced, new_reports};
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
    let final_seq = to_i64(final_seq);

    // The committed turn's checkpoint holds the outcome's totals.
    let completed = LoopCheckpoint {
        phase: CheckpointPhase::Completed,
        ..checkpoint.clone()
    };
    let checkpoints = checkpoint_rows(&[&completed])?;
    let reports = new_reports(&[&completed])?;
    let answer = to_json(std::slice::from_ref(final_message))?;
    // The RETURNING subqueries read the request row as the trigger left it.
    let placed = sqlx::query!(
        r#"INSERT INTO commits (conversation_id, request_id, run_id, revision, now,
               checkpoints, reports, answer, final_seq)
           VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
           RETURNING
               (SELECT conversation_version FROM requests WHERE request_id = ?2) AS "version!: i64",
               (SELECT first_seq FROM requests WHERE request_id = ?2) AS "first_seq!: i64",
               (SELECT end_seq FROM requests WHERE request_id = ?2) AS "end_seq!: i64""#,
        conversation,
        request,
        run,
        revision,
        now,
        checkpoints,
        reports,
        answer,
        final_seq
    )
    .fetch_one(&mut *tx)
    .await
    .map_err(|e| match raised(&e) {
        Some(Raised::Fenced) => fenced(fence),
        _ => db("commit request")(e),
    })?;
    let key = Row {
        table: "requests",
        key: &fence.request_id,
    };
    Ok(StoredOutcome {
        run_id: fence.run_id,
        usage: checkpoint.usage,
        turns: checkpoint.turn,
        tool_calls: checkpoint.tool_calls_count,
        verification_reports: checkpoint.verification_reports.clone(),
        conversation_version: key.u64("conversation_version", placed.version)?,
        first_seq: key.u64("first_seq", placed.first_seq)?,
        end_seq: key.u64("end_seq", placed.end_seq)?,
    })
}
