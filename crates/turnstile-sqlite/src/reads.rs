//! Reads: requests, runs, transcript, checkpoints, pending messages, journal.

use sqlx::sqlite::SqlitePool;
use sqlx::SqliteConnection;

use super::codec::{db, decode_message, to_i64, Row};
use turnstile_core::checkpoint::{CheckpointPhase, LoopCheckpoint};
use turnstile_core::ids::{ConversationId, RequestId, RunId};
use turnstile_core::message::{Message, VerificationReport};
use turnstile_core::store::columns::CheckpointRow;
use turnstile_core::store::{
    JournalEntry, JournalStatus, RequestRecord, RequestStatus, RunRecord, RunStatus, StoredOutcome,
    ToolResult, TranscriptEntry,
};
use turnstile_core::Error;

pub(super) async fn load_run(
    reader: &SqlitePool,
    run_id: RunId,
) -> Result<Option<RunRecord>, Error> {
    let uuid = run_id.as_uuid();
    let Some(row) = sqlx::query!(
        "SELECT request_id, resumed_from, status, error, started_at, ended_at FROM runs WHERE run_id = ?1",
        uuid
    )
    .fetch_optional(reader)
    .await
    .map_err(db("load run"))?
    else {
        return Ok(None);
    };
    let key = Row {
        table: "runs",
        key: &run_id,
    };
    Ok(Some(RunRecord {
        run_id,
        request_id: key.id::<RequestId>("request_id", &row.request_id)?,
        resumed_from: row
            .resumed_from
            .map(|r| key.id("resumed_from", &r))
            .transpose()?,
        status: RunStatus::parse(&row.status)
            .ok_or_else(|| key.corrupt(format!("unknown status {:?}", row.status)))?,
        error: row.error,
        started_at: row.started_at,
        ended_at: row.ended_at,
    }))
}

pub(super) async fn load_transcript_window(
    reader: &SqlitePool,
    conversation_id: ConversationId,
    limit: u32,
) -> Result<Vec<TranscriptEntry>, Error> {
    let uuid = conversation_id.as_uuid();
    let limit = i64::from(limit);
    let rows = sqlx::query!(
        "SELECT seq, request_id, role, content, meta FROM transcript WHERE conversation_id = ?1
         ORDER BY seq DESC LIMIT ?2",
        uuid,
        limit
    )
    .fetch_all(reader)
    .await
    .map_err(db("load transcript window"))?;
    let mut entries = rows
        .into_iter()
        .map(|r| {
            transcript_entry(
                conversation_id,
                r.seq,
                &r.request_id,
                &r.role,
                r.content,
                r.meta.as_deref(),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    entries.reverse();
    Ok(entries)
}

pub(super) async fn load_transcript_range(
    reader: &SqlitePool,
    conversation_id: ConversationId,
    from: u64,
    to: u64,
) -> Result<Vec<TranscriptEntry>, Error> {
    let uuid = conversation_id.as_uuid();
    let (from, to) = (to_i64(from), to_i64(to));
    let rows = sqlx::query!(
        "SELECT seq, request_id, role, content, meta FROM transcript
         WHERE conversation_id = ?1 AND seq >= ?2 AND seq < ?3 ORDER BY seq",
        uuid,
        from,
        to
    )
    .fetch_all(reader)
    .await
    .map_err(db("load transcript range"))?;
    rows.into_iter()
        .map(|r| {
            transcript_entry(
                conversation_id,
                r.seq,
                &r.request_id,
                &r.role,
                r.content,
                r.meta.as_deref(),
            )
        })
        .collect()
}

/// A run's checkpoints, oldest first; only the latest if `latest_only`.
pub(super) async fn load_checkpoints(
    reader: &SqlitePool,
    run_id: RunId,
    latest_only: bool,
) -> Result<Vec<LoopCheckpoint>, Error> {
    let uuid = run_id.as_uuid();
    // Latest first, so LIMIT 1 is the latest; all rows when not limited.
    let limit: i64 = if latest_only { 1 } else { -1 };
    let rows = sqlx::query!(
        "SELECT c.turn, c.phase, c.input_tokens, c.output_tokens, c.cache_read_tokens,
                c.cache_write_tokens, c.tool_calls_count, c.reports_count, c.message_count,
                c.created_at, r.request_id
         FROM loop_checkpoints c JOIN runs r ON r.run_id = c.run_id
         WHERE c.run_id = ?1 ORDER BY c.turn DESC LIMIT ?2",
        uuid,
        limit
    )
    .fetch_all(reader)
    .await
    .map_err(db("load checkpoints"))?;
    let Some(first) = rows.first() else {
        return Ok(Vec::new());
    };
    let run_key = Row {
        table: "runs",
        key: &run_id,
    };
    let request_id = run_key.id::<RequestId>("request_id", &first.request_id)?;
    let most = rows.iter().map(|r| r.reports_count).max().unwrap_or(0);
    let reports = if most > 0 {
        let mut conn = reader.acquire().await.map_err(db("acquire reader"))?;
        load_reports(&mut conn, request_id, most).await?
    } else {
        Vec::new()
    };
    let mut checkpoints = rows
        .into_iter()
        .map(|r| {
            CheckpointRow {
                turn: r.turn,
                phase: r.phase,
                input_tokens: r.input_tokens,
                output_tokens: r.output_tokens,
                cache_read_tokens: r.cache_read_tokens,
                cache_write_tokens: r.cache_write_tokens,
                tool_calls_count: r.tool_calls_count,
                reports_count: r.reports_count,
                message_count: r.message_count,
                created_at: r.created_at,
            }
            // `reports` holds the most any row counts: each row's prefix.
            .decode(run_id, &reports)
        })
        .collect::<Result<Vec<_>, Error>>()?;
    checkpoints.reverse();
    Ok(checkpoints)
}

pub(super) async fn load_request_messages(
    reader: &SqlitePool,
    request_id: RequestId,
    count: u64,
) -> Result<Vec<Message>, Error> {
    let uuid = request_id.as_uuid();
    let count = to_i64(count);
    let rows = sqlx::query!(
        "SELECT seq, role, content, meta FROM run_messages
         WHERE request_id = ?1 AND seq < ?2 ORDER BY seq",
        uuid,
        count
    )
    .fetch_all(reader)
    .await
    .map_err(db("load run messages"))?;
    rows.into_iter()
        .enumerate()
        .map(|(i, r)| {
            let key = format!("{request_id}/{}", r.seq);
            let row = Row {
                table: "run_messages",
                key: &key,
            };
            // A gap means a message of the request is missing: never
            // resume from a transcript with a hole in it.
            if r.seq != i as i64 {
                return Err(row.corrupt(format!("expected seq {i}")));
            }
            decode_message(&row, &r.role, r.content, r.meta.as_deref())
        })
        .collect()
}

pub(super) async fn load_journal(
    reader: &SqlitePool,
    request_id: RequestId,
    turn: u32,
) -> Result<Vec<JournalEntry>, Error> {
    let uuid = request_id.as_uuid();
    let turn = i64::from(turn);
    let rows = sqlx::query!(
        "SELECT turn, call_id, run_id, name, arguments, status, result FROM tool_calls
         WHERE request_id = ?1 AND turn = ?2 ORDER BY position",
        uuid,
        turn
    )
    .fetch_all(reader)
    .await
    .map_err(db("load tool journal"))?;
    rows.into_iter()
        .map(|r| {
            let key = format!("{request_id}/{}/{}", r.turn, r.call_id);
            let row = Row {
                table: "tool_calls",
                key: &key,
            };
            let status = JournalStatus::parse(&r.status)
                .ok_or_else(|| row.corrupt(format!("unknown status {:?}", r.status)))?;
            let result = match (status, r.result) {
                (JournalStatus::Requested, _) | (_, None) => None,
                (_, Some(content)) => Some(ToolResult {
                    content,
                    is_error: status == JournalStatus::Failed,
                }),
            };
            Ok(JournalEntry {
                turn: row.u32("turn", r.turn)?,
                call_id: r.call_id,
                run_id: row.id::<RunId>("run_id", &r.run_id)?,
                name: r.name,
                arguments: r.arguments,
                status,
                result,
            })
        })
        .collect()
}

pub(super) async fn load_request(
    conn: &mut SqliteConnection,
    request_id: RequestId,
) -> Result<Option<RequestRecord>, Error> {
    let uuid = request_id.as_uuid();
    // A completed request's outcome: its columns plus the totals of the
    // committing run's `completed` checkpoint.
    let Some(row) = sqlx::query!(
        r#"SELECT r.conversation_id, r.input_sha256, r.status, r.committed_run_id,
                  r.conversation_version, r.first_seq, r.end_seq, r.created_at, r.completed_at,
                  c.turn AS "turn?", c.phase AS "phase?", c.input_tokens AS "input_tokens?",
                  c.output_tokens AS "output_tokens?", c.cache_read_tokens AS "cache_read_tokens?",
                  c.cache_write_tokens AS "cache_write_tokens?",
                  c.tool_calls_count AS "tool_calls_count?", c.reports_count AS "reports_count?"
           FROM requests r
           LEFT JOIN loop_checkpoints c ON c.run_id = r.committed_run_id
               AND c.turn = (SELECT MAX(turn) FROM loop_checkpoints WHERE run_id = r.committed_run_id)
           WHERE r.request_id = ?1"#,
        uuid
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("load request"))?
    else {
        return Ok(None);
    };
    let key = Row {
        table: "requests",
        key: &request_id,
    };
    let status = RequestStatus::parse(&row.status)
        .ok_or_else(|| key.corrupt(format!("unknown status {:?}", row.status)))?;
    let outcome = if status == RequestStatus::Completed {
        let missing = |what: &str| key.corrupt(format!("completed without {what}"));
        let run = row
            .committed_run_id
            .as_deref()
            .ok_or_else(|| missing("committed_run_id"))?;
        // The committing run's last checkpoint is its `completed` one.
        let turn = row.turn.ok_or_else(|| missing("a completed checkpoint"))?;
        if row.phase.as_deref() != Some(CheckpointPhase::Completed.as_str()) {
            return Err(missing("a completed checkpoint as its run's last"));
        }
        let reports_count = key.u64("reports_count", row.reports_count.unwrap_or(0))?;
        Some(StoredOutcome {
            run_id: key.id::<RunId>("committed_run_id", run)?,
            usage: key.usage(
                row.input_tokens.unwrap_or(0),
                row.output_tokens.unwrap_or(0),
                row.cache_read_tokens.unwrap_or(0),
                row.cache_write_tokens.unwrap_or(0),
            )?,
            turns: key.u32("turn", turn)?,
            tool_calls: key.u64("tool_calls_count", row.tool_calls_count.unwrap_or(0))?,
            verification_reports: load_reports(conn, request_id, to_i64(reports_count)).await?,
            conversation_version: key.u64(
                "conversation_version",
                row.conversation_version
                    .ok_or_else(|| missing("conversation_version"))?,
            )?,
            first_seq: key.u64(
                "first_seq",
                row.first_seq.ok_or_else(|| missing("first_seq"))?,
            )?,
            end_seq: key.u64("end_seq", row.end_seq.ok_or_else(|| missing("end_seq"))?)?,
        })
    } else {
        None
    };
    Ok(Some(RequestRecord {
        request_id,
        conversation_id: key.id("conversation_id", &row.conversation_id)?,
        input_sha256: key.hash("input_sha256", &row.input_sha256)?,
        status,
        outcome,
        created_at: row.created_at,
        completed_at: row.completed_at,
    }))
}

/// The first `count` verification reports of a request; fewer is corrupt.
async fn load_reports(
    conn: &mut SqliteConnection,
    request_id: RequestId,
    count: i64,
) -> Result<Vec<VerificationReport>, Error> {
    if count <= 0 {
        return Ok(Vec::new());
    }
    let uuid = request_id.as_uuid();
    let rows = sqlx::query!(
        "SELECT seq, turn, passed, detail FROM verification_reports
         WHERE request_id = ?1 AND seq < ?2 ORDER BY seq",
        uuid,
        count
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db("load verification reports"))?;
    if rows.len() as i64 != count {
        return Err(Error::Corrupt {
            table: "verification_reports",
            key: request_id.to_string(),
            reason: format!("expected {count} reports, found {}", rows.len()),
        });
    }
    rows.into_iter()
        .map(|r| {
            let key = format!("{request_id}/{}", r.seq);
            let row = Row {
                table: "verification_reports",
                key: &key,
            };
            Ok(VerificationReport {
                turn: row.u32("turn", r.turn)?,
                passed: r.passed != 0,
                detail: r.detail,
            })
        })
        .collect()
}

fn transcript_entry(
    conversation_id: ConversationId,
    seq: i64,
    request_id: &[u8],
    role: &str,
    content: String,
    meta: Option<&str>,
) -> Result<TranscriptEntry, Error> {
    let key = format!("{conversation_id}/{seq}");
    let row = Row {
        table: "transcript",
        key: &key,
    };
    Ok(TranscriptEntry {
        seq: row.u64("seq", seq)?,
        request_id: row.id::<RequestId>("request_id", request_id)?,
        message: decode_message(&row, role, content, meta)?,
    })
}
