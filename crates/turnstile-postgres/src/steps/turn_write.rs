//! The writes of a run's owner during its turns: a turn's write-ahead
//! checkpoint (`begin_turn`), the model's answer (`record_model_response`),
//! a turn's end (`finish_turn`) and a run's failure (`fail_run`). Each is
//! one statement (`write_step`) that commits on its own: one round trip per
//! step. The statement starts with its fence, an update of the admission
//! row that matches only while the admission still names the owner's run
//! and revision (and holds the row's lock until the statement commits);
//! every other part of the statement writes only rows joined to that
//! fence. The fence also records the step as the admission's latest
//! activity, and a checkpoint's usage as the request's latest usage (what
//! SQLite's trigger does). A retry whose first attempt committed finds its
//! messages stored, and is done.
//!
//! A run folded into its request's row (the claim's, migration 0027) keeps
//! its latest checkpoint there and its earlier turns' in
//! `first_run_checkpoints`; the step logs the end of its turns itself.
//!
//! Refusal: a replaced owner is [`Error::Fenced`]; nothing is written.

use sqlx::PgConnection;

use super::{check_fence, fenced, CheckpointColumns, MessageColumns, ReportColumns};
use crate::codec::{db, now_ms, to_i64};
use turnstile_core::checkpoint::LoopCheckpoint;
use turnstile_core::message::{Message, ToolCall};
use turnstile_core::store::Fence;
use turnstile_core::Error;

/// What one step writes besides its fence.
#[derive(Default)]
pub(crate) struct Step<'a> {
    /// Checkpoint rows, each replacing its turn's (a turn's, and the next
    /// turn's write-ahead); the last one's usage becomes the admission's.
    pub checkpoints: &'a [&'a LoopCheckpoint],
    /// Pending messages appended at `first_seq..`, of turn `turn`.
    pub messages: Option<Appended<'a>>,
    /// Tool calls journaled as requested, in turn `turn`.
    pub tool_calls: Option<(u32, &'a [ToolCall])>,
    /// A turn whose journal rows lose their arguments and results (its
    /// calls and results are messages now).
    pub compact_turn: Option<u32>,
    /// The run stopped: it is marked failed with this error.
    pub failure: Option<&'a str>,
}

/// Messages appended to the request's, the first of them its `first_seq`th.
pub(crate) struct Appended<'a> {
    pub first_seq: u64,
    pub messages: &'a [Message],
}

/// A turn's write-ahead checkpoint.
pub(crate) async fn begin_turn(
    conn: &mut PgConnection,
    fence: &Fence,
    checkpoint: &LoopCheckpoint,
) -> Result<(), Error> {
    write_step(
        conn,
        fence,
        &Step {
            checkpoints: &[checkpoint],
            ..Step::default()
        },
    )
    .await
}

/// The model's answer, its checkpoint and its tool calls journaled as
/// requested.
pub(crate) async fn record_model_response(
    conn: &mut PgConnection,
    fence: &Fence,
    checkpoint: &LoopCheckpoint,
    assistant: &Message,
    retry: bool,
) -> Result<(), Error> {
    // A retry of a step whose commit was acknowledged too late finds its
    // answer stored: the step is done (if the owner still owns it).
    if retry && message_stored(conn, fence, checkpoint.message_count).await? {
        return check_fence(conn, fence).await;
    }
    let written = write_step(
        conn,
        fence,
        &Step {
            checkpoints: &[checkpoint],
            messages: Some(Appended {
                first_seq: checkpoint.message_count,
                messages: std::slice::from_ref(assistant),
            }),
            tool_calls: Some((checkpoint.turn, assistant.tool_calls())),
            ..Step::default()
        },
    )
    .await;
    landed_meanwhile(conn, fence, checkpoint.message_count, retry, written).await
}

/// A turn's end: its checkpoint and the next turn's write-ahead, the turn's
/// `messages` at `first_seq..`, and the journal compacted.
pub(crate) async fn finish_turn(
    conn: &mut PgConnection,
    fence: &Fence,
    checkpoint: &LoopCheckpoint,
    first_seq: u64,
    messages: &[Message],
    next: Option<&LoopCheckpoint>,
    retry: bool,
) -> Result<(), Error> {
    // Stored already by a first attempt whose acknowledgement was lost: the
    // rest of the step is idempotent.
    let stored = retry && !messages.is_empty() && message_stored(conn, fence, first_seq).await?;
    let both;
    let one;
    let checkpoints: &[&LoopCheckpoint] = match next {
        Some(next) => {
            both = [checkpoint, next];
            &both
        }
        None => {
            one = [checkpoint];
            &one
        }
    };
    let written = write_step(
        conn,
        fence,
        &Step {
            checkpoints,
            messages: (!stored).then_some(Appended {
                first_seq,
                messages,
            }),
            compact_turn: Some(checkpoint.turn),
            ..Step::default()
        },
    )
    .await;
    landed_meanwhile(conn, fence, first_seq, retry, written).await
}

/// A run's failure, with its settled checkpoint when it has one.
pub(crate) async fn fail_run(
    conn: &mut PgConnection,
    fence: &Fence,
    error: &str,
    settled: Option<&LoopCheckpoint>,
) -> Result<(), Error> {
    let settled: Vec<&LoopCheckpoint> = settled.into_iter().collect();
    write_step(
        conn,
        fence,
        &Step {
            checkpoints: &settled,
            failure: Some(error),
            ..Step::default()
        },
    )
    .await
}

/// Whether the request has its `seq`th message, in the transcript after
/// the committed entries.
async fn message_stored(conn: &mut PgConnection, fence: &Fence, seq: u64) -> Result<bool, Error> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM transcript t
               JOIN conversations c ON c.conversation_id = t.conversation_id
               WHERE t.conversation_id = $1 AND t.request_id = $2
                 AND t.seq = c.transcript_length + $3) AS "stored!""#,
        fence.conversation_id.as_uuid(),
        fence.request_id.as_uuid(),
        to_i64(seq)
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(db("read the request's messages"))
}

/// A retry whose first attempt was still running on the server, and
/// committed while the retry waited for the admission's lock, finds the
/// step's messages taken (a unique violation): the step is done.
async fn landed_meanwhile(
    conn: &mut PgConnection,
    fence: &Fence,
    seq: u64,
    retry: bool,
    written: Result<(), Error>,
) -> Result<(), Error> {
    match written {
        Err(Error::Store(e))
            if retry
                && is_unique_violation_error(&e)
                && message_stored(conn, fence, seq).await? =>
        {
            Ok(())
        }
        other => other,
    }
}

fn is_unique_violation_error(error: &turnstile_core::StoreError) -> bool {
    std::error::Error::source(error)
        .and_then(|source| source.downcast_ref::<sqlx::Error>())
        .is_some_and(crate::codec::is_unique_violation)
}

/// One step of a run's owner as one statement: the fence, then everything
/// `step` asks for, each part writing only rows joined to the fence.
pub(crate) async fn write_step(
    conn: &mut PgConnection,
    fence: &Fence,
    step: &Step<'_>,
) -> Result<(), Error> {
    let checkpoints = CheckpointColumns::of(step.checkpoints);
    let reports = ReportColumns::of(step.checkpoints);
    let usage = step.checkpoints.last().map(|c| c.usage);
    let appended = step.messages.as_ref();
    let messages = MessageColumns::of(appended.map_or(&[], |m| m.messages))?;
    let calls = step.tool_calls.map_or(&[][..], |(_, calls)| calls);
    let call_ids: Vec<&[u8]> = calls.iter().map(|c| c.id.as_bytes()).collect();
    let call_names: Vec<&[u8]> = calls.iter().map(|c| c.name.as_bytes()).collect();
    let call_arguments: Vec<&[u8]> = calls.iter().map(|c| c.arguments.as_bytes()).collect();
    let fenced_rows = sqlx::query_scalar!(
        r#"WITH folded AS (
               -- The run folded into its request's row (migration 0027), with
               -- that row's checkpoint; no row for a run in `runs`.
               SELECT q.turn, q.phase, q.input_tokens, q.output_tokens, q.cache_read_tokens,
                   q.cache_write_tokens, q.tool_calls_count, q.reports_count, q.message_count,
                   q.checkpoint_at, q.xmin AS row_version
               FROM requests q
               WHERE q.conversation_id = $1 AND q.request_id = $4 AND $3 = $4
                 AND q.run_status IS NOT NULL
           ), given AS (
               SELECT * FROM UNNEST($10::bigint[], $11::text[], $12::bigint[], $13::bigint[],
                   $14::bigint[], $15::bigint[], $16::bigint[], $17::bigint[], $18::bigint[])
                   WITH ORDINALITY AS c(turn, phase, input, output, cache_read, cache_write,
                        tool_calls, reports, messages, position)
           ), latest AS (
               -- The folded row's checkpoint after this write: the given one of
               -- the latest turn, unless the row holds a later turn.
               SELECT g.* FROM given g, folded fo
               WHERE fo.turn IS NULL OR fo.turn <= g.turn
               ORDER BY g.turn DESC, g.position DESC LIMIT 1
           ), ended AS (
               -- A folded run's turn this write turns `ready`, logged here
               -- (kind 9) as the trigger on `loop_checkpoints` logs a run's
               -- of its own: the checkpoint may leave the request's row.
               SELECT r.turn
               FROM (SELECT g.turn FROM given g, folded fo WHERE g.phase = 'ready'
                     ORDER BY g.turn DESC LIMIT 1) r
               WHERE EXISTS (SELECT 1 FROM all_checkpoints k
                             WHERE k.conversation_id = $1 AND k.run_id = $3 AND k.turn = r.turn
                               AND k.phase <> 'ready')
           ), fence AS (
               UPDATE admissions
               SET input_tokens = COALESCE($5, input_tokens),
                   output_tokens = COALESCE($6, output_tokens),
                   cache_read_tokens = COALESCE($7, cache_read_tokens),
                   cache_write_tokens = COALESCE($8, cache_write_tokens), updated_at = $9,
                   event_seq = event_seq + (SELECT COUNT(*) FROM ended)
               WHERE conversation_id = $1 AND revision = $2 AND run_id = $3
                 AND active_request_id = $4
               RETURNING conversation_id, event_seq
           ), turn_ended AS (
               INSERT INTO events (conversation_id, seq, kind, request_id, run_id, turn,
                   entry_seq, call_id, at)
               SELECT f.conversation_id, f.event_seq, 9, $4, NULLIF($3, $4), e.turn, NULL, NULL,
                   $9
               FROM fence f, ended e
           ), saved AS (
               INSERT INTO loop_checkpoints (conversation_id, run_id, turn, phase, input_tokens,
                   output_tokens, cache_read_tokens, cache_write_tokens, tool_calls_count,
                   reports_count, message_count, created_at)
               SELECT f.conversation_id, $3, c.turn, c.phase, c.input, c.output, c.cache_read,
                   c.cache_write, c.tool_calls, c.reports, c.messages, $9
               FROM fence f, given c
               WHERE NOT EXISTS (SELECT 1 FROM folded)
               ON CONFLICT (conversation_id, run_id, turn) DO UPDATE SET
                   phase = EXCLUDED.phase, input_tokens = EXCLUDED.input_tokens,
                   output_tokens = EXCLUDED.output_tokens,
                   cache_read_tokens = EXCLUDED.cache_read_tokens,
                   cache_write_tokens = EXCLUDED.cache_write_tokens,
                   tool_calls_count = EXCLUDED.tool_calls_count,
                   reports_count = EXCLUDED.reports_count,
                   message_count = EXCLUDED.message_count, created_at = EXCLUDED.created_at
           ), earlier AS (
               -- A folded run's turns before the row's: the row's own
               -- checkpoint when this write brings a later turn, and given
               -- checkpoints of turns before the latest.
               INSERT INTO first_run_checkpoints (conversation_id, request_id, turn, phase,
                   input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
                   tool_calls_count, reports_count, message_count, created_at)
               SELECT f.conversation_id, $4, fo.turn, fo.phase, fo.input_tokens,
                   fo.output_tokens, fo.cache_read_tokens, fo.cache_write_tokens,
                   fo.tool_calls_count, fo.reports_count, fo.message_count, fo.checkpoint_at
               FROM fence f, folded fo, latest l
               WHERE fo.turn < l.turn AND fo.turn NOT IN (SELECT turn FROM given)
               UNION ALL
               SELECT f.conversation_id, $4, g.turn, g.phase, g.input, g.output, g.cache_read,
                   g.cache_write, g.tool_calls, g.reports, g.messages, $9
               FROM fence f, folded fo, given g
               WHERE g.turn < GREATEST(fo.turn, (SELECT MAX(turn) FROM given))
               ON CONFLICT (conversation_id, request_id, turn) DO UPDATE SET
                   phase = EXCLUDED.phase, input_tokens = EXCLUDED.input_tokens,
                   output_tokens = EXCLUDED.output_tokens,
                   cache_read_tokens = EXCLUDED.cache_read_tokens,
                   cache_write_tokens = EXCLUDED.cache_write_tokens,
                   tool_calls_count = EXCLUDED.tool_calls_count,
                   reports_count = EXCLUDED.reports_count,
                   message_count = EXCLUDED.message_count, created_at = EXCLUDED.created_at
           ), folded_row AS (
               -- The folded run's latest checkpoint, and its failure.
               UPDATE requests q
               SET turn = COALESCE(l.turn, q.turn), phase = COALESCE(l.phase, q.phase),
                   input_tokens = COALESCE(l.input, q.input_tokens),
                   output_tokens = COALESCE(l.output, q.output_tokens),
                   cache_read_tokens = COALESCE(l.cache_read, q.cache_read_tokens),
                   cache_write_tokens = COALESCE(l.cache_write, q.cache_write_tokens),
                   tool_calls_count = COALESCE(l.tool_calls, q.tool_calls_count),
                   reports_count = COALESCE(l.reports, q.reports_count),
                   message_count = COALESCE(l.messages, q.message_count),
                   checkpoint_at = CASE WHEN l.turn IS NULL THEN q.checkpoint_at ELSE $9 END,
                   run_status = CASE WHEN $32::bytea IS NULL THEN q.run_status ELSE 'failed' END,
                   run_error = COALESCE($32::bytea, q.run_error),
                   run_ended_at = CASE WHEN $32::bytea IS NULL THEN q.run_ended_at ELSE $9 END
               FROM fence f, folded fo LEFT JOIN latest l ON true
               WHERE q.conversation_id = f.conversation_id AND q.request_id = $4
                 AND (l.turn IS NOT NULL OR $32::bytea IS NOT NULL)
                 -- The row version this statement's snapshot read, or the row
                 -- changed while the fence waited: see the end.
                 AND q.xmin = fo.row_version
               RETURNING 1
           ), reports AS (
               INSERT INTO verification_reports (conversation_id, request_id, seq, turn, passed,
                   detail)
               SELECT f.conversation_id, $4, r.seq, r.turn, r.passed, r.detail
               FROM fence f, UNNEST($19::bigint[], $20::bigint[], $21::boolean[], $22::bytea[])
                   AS r(seq, turn, passed, detail)
               ON CONFLICT DO NOTHING
           ), messages AS (
               -- the request's messages follow the conversation's committed entries
               INSERT INTO transcript (conversation_id, seq, request_id, role, content, meta)
               SELECT f.conversation_id, c.transcript_length + $23 + m.position - 1, $4, m.role,
                   m.content, NULLIF(m.meta, '')
               FROM fence f JOIN conversations c ON c.conversation_id = f.conversation_id,
                   UNNEST($24::text[], $25::bytea[], $26::text[])
                   WITH ORDINALITY AS m(role, content, meta, position)
           ), calls AS (
               INSERT INTO tool_calls (conversation_id, request_id, turn, call_id, position,
                   run_id, name, arguments, status, created_at)
               SELECT f.conversation_id, $4, $27, c.id, c.position - 1, $3, c.name, c.arguments,
                   'requested', $9
               FROM fence f, UNNEST($28::bytea[], $29::bytea[], $30::bytea[])
                   WITH ORDINALITY AS c(id, name, arguments, position)
           ), compacted AS (
               UPDATE tool_calls t SET arguments = NULL, result = NULL, result_parts = NULL
               FROM fence f
               WHERE t.conversation_id = f.conversation_id AND t.request_id = $4
                 AND t.turn = $31
           ), failed AS (
               UPDATE runs r SET status = 'failed', error = $32::bytea, ended_at = $9
               FROM fence f
               WHERE r.conversation_id = f.conversation_id AND r.run_id = $3 AND $32::bytea IS NOT NULL
           )
           -- A folded row that changed since the snapshot was not written:
           -- the statement stops as a serialization failure (migration 0027),
           -- and is retried with a fresh snapshot.
           SELECT COUNT(*) AS "fenced!" FROM fence
           WHERE CASE WHEN EXISTS (SELECT 1 FROM folded)
                           AND (EXISTS (SELECT 1 FROM latest) OR $32::bytea IS NOT NULL)
                           AND NOT EXISTS (SELECT 1 FROM folded_row)
                      THEN turnstile_row_moved() ELSE true END"#,
        fence.conversation_id.as_uuid(),
        to_i64(fence.revision.0),
        fence.run_id.as_uuid(),
        fence.request_id.as_uuid(),
        usage.map(|u| to_i64(u.input_tokens)),
        usage.map(|u| to_i64(u.output_tokens)),
        usage.map(|u| to_i64(u.cache_read_tokens)),
        usage.map(|u| to_i64(u.cache_write_tokens)),
        now_ms(),
        &checkpoints.turns,
        &checkpoints.phases as &[&str],
        &checkpoints.inputs,
        &checkpoints.outputs,
        &checkpoints.cache_reads,
        &checkpoints.cache_writes,
        &checkpoints.tool_calls,
        &checkpoints.reports,
        &checkpoints.message_counts,
        &reports.seqs,
        &reports.turns,
        &reports.passed,
        &reports.details as &[&[u8]],
        to_i64(appended.map_or(0, |m| m.first_seq)),
        &messages.roles,
        &messages.contents() as &[&[u8]],
        &messages.metas,
        i64::from(step.tool_calls.map_or(0, |(turn, _)| turn)),
        &call_ids as &[&[u8]],
        &call_names as &[&[u8]],
        &call_arguments as &[&[u8]],
        // No journal turn is negative: -1 compacts nothing.
        step.compact_turn.map_or(-1, i64::from),
        step.failure.map(str::as_bytes)
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(db("write step"))?;
    if fenced_rows == 0 {
        return Err(fenced(fence));
    }
    Ok(())
}
