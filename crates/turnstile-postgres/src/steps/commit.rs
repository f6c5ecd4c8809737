//! The commit of a request by its run's owner: one statement whose fence is
//! the admission's release itself, and which appends the final answer to
//! the request's messages in the transcript and moves the transcript's
//! committed length past it, bumps the conversation version, stores the
//! outcome for replay, completes the run (in the request's own row when it
//! is folded there: migration 0027) and records its `committed` event,
//! numbered by the release (in the request's row; in the log for a request
//! admitted before 0028). There is no moment where the answer
//! is committed but the conversation is still held. A retry whose first
//! attempt committed finds the outcome stored, and returns it.
//!
//! That statement names only the tables every commit writes: a table a
//! statement names costs the server its executor setup and its locks even
//! when no row goes there (`docs/performance.md`, "A claim and a commit
//! that name only the tables they write"). A commit that writes more runs
//! in a transaction, with the admission locked and a statement before and
//! after that one ([`commit_in_a_transaction`]): a run with an id of its
//! own, a turn that brings verification reports, or a request row that
//! asks for more than the statement writes (a run kept in `runs` from
//! before 0027, an admission event logged before 0028, or a checkpoint of
//! the run's earlier turns to keep). Sent alone, the statement releases
//! nothing for the last kind, which only the row tells.
//!
//! Refusal: a replaced owner is [`Error::Fenced`].

use sqlx::PgConnection;

use super::{fenced, ReportColumns};
use crate::codec::{db, now_ms, to_i64, Row};
use turnstile_core::backend::message_columns;
use turnstile_core::checkpoint::LoopCheckpoint;
use turnstile_core::message::Message;
use turnstile_core::store::{Fence, RequestStatus, StoredOutcome};
use turnstile_core::{Error, RunId};

/// The commit: its one statement when nothing more is to be written, or
/// the transaction of [`commit_in_a_transaction`].
pub(crate) async fn commit(
    conn: &mut PgConnection,
    fence: &Fence,
    checkpoint: &LoopCheckpoint,
    final_message: &Message,
    retry: bool,
) -> Result<StoredOutcome, Error> {
    let final_seq = checkpoint.message_count.checked_sub(1).ok_or_else(|| {
        Error::InvalidInput("a commit checkpoint must count the final message".into())
    })?;
    // Committed by the first attempt, acknowledgement lost: the stored
    // outcome is this commit's.
    if retry {
        if let Some(outcome) = committed_by(conn, fence).await? {
            return Ok(outcome);
        }
    }
    let answer = Answer {
        columns: message_columns(final_message)?,
        seq: final_seq,
        now: now_ms(),
    };
    let turn = [checkpoint];
    let reports = ReportColumns::of(&turn);
    if fence.run_id == RunId::first_of(fence.request_id) && reports.seqs.is_empty() {
        if let Some(placed) = release_and_place(conn, fence, checkpoint, &answer, true).await? {
            return outcome(fence, checkpoint, &placed);
        }
    }
    commit_in_a_transaction(conn, fence, checkpoint, &answer, &reports, retry).await
}

/// The final message's columns, its place among the request's messages and
/// the commit's time.
struct Answer {
    columns: (String, String, Option<String>),
    seq: u64,
    now: i64,
}

/// Where the statement placed the answer, and the release's event number.
struct Placed {
    version: i64,
    first_seq: i64,
    pending: i64,
    event_seq: i64,
}

/// A commit that writes more than its statement: the admission locked
/// while the fence holds (so that what follows reads the run's row as its
/// last step left it), the run's earlier checkpoint kept (the statement
/// overwrites the row's), the statement, then the `committed` event of a
/// request admitted before 0028, the `completed` checkpoint and the end of
/// a run kept in `runs`, and the turn's verification reports. A moved fence
/// writes nothing.
async fn commit_in_a_transaction(
    conn: &mut PgConnection,
    fence: &Fence,
    checkpoint: &LoopCheckpoint,
    answer: &Answer,
    reports: &ReportColumns<'_>,
    retry: bool,
) -> Result<StoredOutcome, Error> {
    let mut tx = sqlx::Connection::begin(&mut *conn)
        .await
        .map_err(db("begin the commit"))?;
    let placed = if hold_the_admission(&mut tx, fence).await? {
        keep_earlier_checkpoint(&mut tx, fence, checkpoint, answer.now).await?;
        release_and_place(&mut tx, fence, checkpoint, answer, false).await?
    } else {
        None
    };
    let Some(placed) = placed else {
        tx.rollback().await.map_err(db("roll back the commit"))?;
        // A first attempt still running on the server when this retry
        // started may have committed while this statement waited for its
        // lock: then the outcome is this commit's, not a fence.
        if retry {
            if let Some(outcome) = committed_by(conn, fence).await? {
                return Ok(outcome);
            }
        }
        return Err(fenced(fence));
    };
    write_the_rest(
        &mut tx,
        fence,
        checkpoint,
        reports,
        answer.now,
        placed.event_seq,
    )
    .await?;
    tx.commit().await.map_err(db("commit"))?;
    outcome(fence, checkpoint, &placed)
}

/// The commit's statement. The fence is the release itself. The committed
/// turn's `completed` checkpoint holds the outcome's totals; the request's
/// messages are in the transcript already, after its committed entries: the
/// final answer follows them, and the transcript's length moves past it.
/// `alone`: the statement is the whole commit, so it releases nothing when
/// the request's row asks for more than it writes; `None` then, as for a
/// moved fence.
async fn release_and_place(
    conn: &mut PgConnection,
    fence: &Fence,
    checkpoint: &LoopCheckpoint,
    answer: &Answer,
    alone: bool,
) -> Result<Option<Placed>, Error> {
    let (role, content, meta) = &answer.columns;
    let usage = checkpoint.usage;
    sqlx::query_as!(
        Placed,
        r#"WITH folded AS (
               -- The committing run folded into its request's row (migration
               -- 0027), with that row's checkpoint.
               SELECT true AS yes, q.turn IS NULL OR q.turn <= $10 AS latest, q.turn,
                   q.admitted_event IS NOT NULL AS admitted_in_row, q.xmin AS row_version
               FROM requests q
               WHERE q.conversation_id = $2 AND q.request_id = $5 AND $4 = $5
                 AND q.run_status IS NOT NULL
           ), released AS (
               UPDATE admissions
               SET active_request_id = NULL, input_sha256 = NULL, run_id = NULL,
                   agent_fingerprint = NULL, input_tokens = 0, output_tokens = 0,
                   cache_read_tokens = 0, cache_write_tokens = 0, summary_passes = 0,
                   summary_from_seq = NULL, summary_through_seq = NULL, summary_version = NULL,
                   summary_prompt_sha256 = NULL, revision = revision + 1, updated_at = $1,
                   event_seq = event_seq + 1
               WHERE conversation_id = $2 AND revision = $3 AND run_id = $4
                 AND active_request_id = $5
                 -- Alone, only a folded run whose row keeps its admission
                 -- event and holds no earlier turn to keep.
                 AND (NOT $18 OR EXISTS (
                     SELECT 1 FROM folded
                     WHERE admitted_in_row AND (turn IS NULL OR turn = $10)))
               RETURNING conversation_id, event_seq
           ), pending AS (
               SELECT COUNT(t.seq) AS n FROM conversations c
               LEFT JOIN transcript t
                   ON t.conversation_id = c.conversation_id AND t.seq >= c.transcript_length
               WHERE c.conversation_id = $2
           ), placed AS (
               UPDATE conversations c
               SET version = c.version + 1, transcript_length = c.transcript_length + p.n + 1
               FROM released r, pending p WHERE c.conversation_id = r.conversation_id
               RETURNING c.version, c.transcript_length - p.n - 1 AS first_seq
           ), answer AS (
               INSERT INTO transcript (conversation_id, seq, request_id, role, content, meta)
               SELECT $2, p.first_seq + $6, $5, $7, $8, $9 FROM placed p
           ), request AS (
               UPDATE requests q SET status = 'completed', committed_run_id = $4,
                   conversation_version = p.version, first_seq = p.first_seq,
                   end_seq = p.first_seq + (SELECT n FROM pending) + 1, completed_at = $1,
                   settled_event = CASE WHEN q.admitted_event IS NOT NULL
                                        THEN (SELECT event_seq FROM released) END,
                   -- A folded run completes, and its `completed` checkpoint is
                   -- the row's unless the row holds a later turn.
                   run_status = CASE WHEN fo.yes THEN 'completed' ELSE q.run_status END,
                   run_ended_at = CASE WHEN fo.yes THEN $1 ELSE q.run_ended_at END,
                   turn = CASE WHEN fo.latest THEN $10 ELSE q.turn END,
                   phase = CASE WHEN fo.latest THEN 'completed' ELSE q.phase END,
                   input_tokens = CASE WHEN fo.latest THEN $11 ELSE q.input_tokens END,
                   output_tokens = CASE WHEN fo.latest THEN $12 ELSE q.output_tokens END,
                   cache_read_tokens = CASE WHEN fo.latest THEN $13 ELSE q.cache_read_tokens END,
                   cache_write_tokens = CASE WHEN fo.latest THEN $14 ELSE q.cache_write_tokens END,
                   tool_calls_count = CASE WHEN fo.latest THEN $15 ELSE q.tool_calls_count END,
                   reports_count = CASE WHEN fo.latest THEN $16 ELSE q.reports_count END,
                   message_count = CASE WHEN fo.latest THEN $17 ELSE q.message_count END,
                   checkpoint_at = CASE WHEN fo.latest THEN $1 ELSE q.checkpoint_at END
               FROM placed p LEFT JOIN folded fo ON true
               WHERE q.conversation_id = $2 AND q.request_id = $5
                 -- A folded row at the version this statement's snapshot read,
                 -- or it changed while the release waited: see the end.
                 AND (fo.yes IS NULL OR q.xmin = fo.row_version)
               RETURNING 1
           )
           SELECT p.version AS "version!", p.first_seq AS "first_seq!",
                  (SELECT n FROM pending) AS "pending!",
                  (SELECT event_seq FROM released) AS "event_seq!"
           FROM placed p
           -- A folded row that changed since the snapshot was not written:
           -- the statement stops as a serialization failure (migration 0027),
           -- and is retried with a fresh snapshot.
           WHERE CASE WHEN NOT EXISTS (SELECT 1 FROM request) THEN turnstile_row_moved()
                      ELSE true END"#,
        answer.now,
        fence.conversation_id.as_uuid(),
        to_i64(fence.revision.0),
        fence.run_id.as_uuid(),
        fence.request_id.as_uuid(),
        to_i64(answer.seq),
        role,
        content.as_bytes(),
        meta.as_deref(),
        i64::from(checkpoint.turn),
        to_i64(usage.input_tokens),
        to_i64(usage.output_tokens),
        to_i64(usage.cache_read_tokens),
        to_i64(usage.cache_write_tokens),
        to_i64(checkpoint.tool_calls_count),
        checkpoint.verification_reports.len() as i64,
        to_i64(checkpoint.message_count),
        alone
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("commit"))
}

/// Whether the fence holds; if so, its admission is locked until the
/// transaction ends. Every step of a run's owner starts by updating that
/// row, so none is between this and the commit's statement.
async fn hold_the_admission(conn: &mut PgConnection, fence: &Fence) -> Result<bool, Error> {
    let held = sqlx::query_scalar!(
        r#"SELECT true AS "held!" FROM admissions
           WHERE conversation_id = $1 AND revision = $2 AND run_id = $3
             AND active_request_id = $4
           FOR UPDATE"#,
        fence.conversation_id.as_uuid(),
        to_i64(fence.revision.0),
        fence.run_id.as_uuid(),
        fence.request_id.as_uuid()
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("lock the admission for the commit"))?;
    Ok(held.is_some())
}

/// A folded run's turns before the row's, kept before the commit's
/// statement overwrites the row's checkpoint: the row's own checkpoint when
/// the committed turn is later, or the `completed` checkpoint when the row
/// holds a later turn. After [`hold_the_admission`].
async fn keep_earlier_checkpoint(
    conn: &mut PgConnection,
    fence: &Fence,
    checkpoint: &LoopCheckpoint,
    now: i64,
) -> Result<(), Error> {
    let usage = checkpoint.usage;
    sqlx::query!(
        r#"WITH folded AS (
               SELECT q.turn IS NULL OR q.turn <= $5 AS latest, q.turn, q.phase,
                   q.input_tokens, q.output_tokens,
                   q.cache_read_tokens, q.cache_write_tokens, q.tool_calls_count,
                   q.reports_count, q.message_count, q.checkpoint_at
               FROM requests q
               WHERE q.conversation_id = $2 AND q.request_id = $4 AND $3::uuid = $4::uuid
                 AND q.run_status IS NOT NULL
           )
           INSERT INTO first_run_checkpoints (conversation_id, request_id, turn, phase,
               input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
               tool_calls_count, reports_count, message_count, created_at)
           SELECT $2, $4, fo.turn, fo.phase, fo.input_tokens,
               fo.output_tokens, fo.cache_read_tokens, fo.cache_write_tokens,
               fo.tool_calls_count, fo.reports_count, fo.message_count, fo.checkpoint_at
           FROM folded fo WHERE fo.turn < $5
           UNION ALL
           SELECT $2, $4, $5, 'completed', $6, $7, $8, $9, $10, $11, $12, $1
           FROM folded fo WHERE NOT fo.latest
           ON CONFLICT (conversation_id, request_id, turn) DO UPDATE SET
               phase = EXCLUDED.phase, input_tokens = EXCLUDED.input_tokens,
               output_tokens = EXCLUDED.output_tokens,
               cache_read_tokens = EXCLUDED.cache_read_tokens,
               cache_write_tokens = EXCLUDED.cache_write_tokens,
               tool_calls_count = EXCLUDED.tool_calls_count,
               reports_count = EXCLUDED.reports_count,
               message_count = EXCLUDED.message_count, created_at = EXCLUDED.created_at"#,
        now,
        fence.conversation_id.as_uuid(),
        fence.run_id.as_uuid(),
        fence.request_id.as_uuid(),
        i64::from(checkpoint.turn),
        to_i64(usage.input_tokens),
        to_i64(usage.output_tokens),
        to_i64(usage.cache_read_tokens),
        to_i64(usage.cache_write_tokens),
        to_i64(checkpoint.tool_calls_count),
        checkpoint.verification_reports.len() as i64,
        to_i64(checkpoint.message_count)
    )
    .execute(&mut *conn)
    .await
    .map_err(db("keep the run's earlier checkpoint"))?;
    Ok(())
}

/// What a released commit writes beyond its statement: the `committed`
/// event, numbered by the release, of a request whose admission event is
/// not in its row (admitted before 0028); the `completed` checkpoint and
/// the end of a run kept in `runs`; the turn's verification reports.
async fn write_the_rest(
    conn: &mut PgConnection,
    fence: &Fence,
    checkpoint: &LoopCheckpoint,
    reports: &ReportColumns<'_>,
    now: i64,
    event_seq: i64,
) -> Result<(), Error> {
    let usage = checkpoint.usage;
    sqlx::query!(
        r#"WITH committed AS (
               -- Kind 7, with the committing run unless it is the request's
               -- first.
               INSERT INTO events (conversation_id, seq, kind, request_id, run_id, turn,
                   entry_seq, call_id, at)
               SELECT $2, $5, 7, $4, NULLIF($3::uuid, $4::uuid), NULL, NULL, NULL, $1
               WHERE NOT EXISTS (SELECT 1 FROM requests
                                 WHERE conversation_id = $2 AND request_id = $4
                                   AND admitted_event IS NOT NULL)
           ), completed AS (
               INSERT INTO loop_checkpoints (conversation_id, run_id, turn, phase, input_tokens,
                   output_tokens, cache_read_tokens, cache_write_tokens, tool_calls_count,
                   reports_count, message_count, created_at)
               SELECT $2, $3, $6, 'completed', $7, $8, $9, $10, $11, $12, $13, $1
               WHERE NOT EXISTS (SELECT 1 FROM requests q
                                 WHERE q.conversation_id = $2 AND q.request_id = $4
                                   AND $3::uuid = $4::uuid AND q.run_status IS NOT NULL)
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
               SELECT $2, $4, r.seq, r.turn, r.passed, r.detail
               FROM UNNEST($14::bigint[], $15::bigint[], $16::boolean[],
                   $17::bytea[]) AS r(seq, turn, passed, detail)
               ON CONFLICT DO NOTHING
           )
           UPDATE runs SET status = 'completed', ended_at = $1
           WHERE conversation_id = $2 AND run_id = $3"#,
        now,
        fence.conversation_id.as_uuid(),
        fence.run_id.as_uuid(),
        fence.request_id.as_uuid(),
        event_seq,
        i64::from(checkpoint.turn),
        to_i64(usage.input_tokens),
        to_i64(usage.output_tokens),
        to_i64(usage.cache_read_tokens),
        to_i64(usage.cache_write_tokens),
        to_i64(checkpoint.tool_calls_count),
        checkpoint.verification_reports.len() as i64,
        to_i64(checkpoint.message_count),
        &reports.seqs,
        &reports.turns,
        &reports.passed,
        &reports.details as &[&[u8]]
    )
    .execute(&mut *conn)
    .await
    .map_err(db("commit the rest"))?;
    Ok(())
}

/// The stored outcome of a commit its statement placed.
fn outcome(
    fence: &Fence,
    checkpoint: &LoopCheckpoint,
    placed: &Placed,
) -> Result<StoredOutcome, Error> {
    let key = Row {
        table: "conversations",
        key: &fence.conversation_id,
    };
    let first_seq = key.u64("seq", placed.first_seq)?;
    Ok(StoredOutcome {
        run_id: fence.run_id,
        usage: checkpoint.usage,
        turns: checkpoint.turn,
        tool_calls: checkpoint.tool_calls_count,
        verification_reports: checkpoint.verification_reports.clone(),
        conversation_version: key.u64("version", placed.version)?,
        first_seq,
        end_seq: first_seq + key.u64("seq", placed.pending)? + 1,
    })
}

/// The stored outcome, if this fence's run committed the request.
async fn committed_by(
    conn: &mut PgConnection,
    fence: &Fence,
) -> Result<Option<StoredOutcome>, Error> {
    let record = crate::reads::load_request(conn, fence.request_id).await?;
    Ok(record
        .filter(|r| r.status == RequestStatus::Completed)
        .and_then(|r| r.outcome)
        .filter(|o| o.run_id == fence.run_id))
}
