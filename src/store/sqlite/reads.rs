//! Reads: requests, runs, transcript, checkpoints, pending messages, journal.

use sqlx::SqliteConnection;

use super::codec::{db, to_i64, Row};
use super::SqliteStore;
use crate::checkpoint::{CheckpointPhase, LoopCheckpoint};
use crate::ids::{ConversationId, RequestId, RunId};
use crate::message::{Message, VerificationReport};
use crate::store::{
    JournalEntry, JournalStatus, RequestRecord, RequestStatus, RunRecord, RunStatus, ToolResult,
    TranscriptEntry,
};
use crate::Error;

impl SqliteStore {
    pub(super) async fn request_impl(
        &self,
        request_id: RequestId,
    ) -> Result<Option<RequestRecord>, Error> {
        let mut conn = self.reader.acquire().await.map_err(db("acquire reader"))?;
        load_request(&mut conn, request_id).await
    }

    pub(super) async fn run_impl(&self, run_id: RunId) -> Result<Option<RunRecord>, Error> {
        let uuid = run_id.as_uuid();
        let Some(row) = sqlx::query!(
            "SELECT request_id, resumed_from, status, error, started_at, ended_at FROM runs WHERE run_id = ?1",
            uuid
        )
        .fetch_optional(&self.reader)
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
            request_id: RequestId::from_db(key.uuid("request_id", &row.request_id)?),
            resumed_from: row
                .resumed_from
                .map(|r| key.uuid("resumed_from", &r).map(RunId::from_db))
                .transpose()?,
            status: RunStatus::parse(&row.status)
                .ok_or_else(|| key.corrupt(format!("unknown status {:?}", row.status)))?,
            error: row.error,
            started_at: row.started_at,
            ended_at: row.ended_at,
        }))
    }

    pub(super) async fn transcript_window_impl(
        &self,
        conversation_id: ConversationId,
        limit: u32,
    ) -> Result<Vec<TranscriptEntry>, Error> {
        let uuid = conversation_id.as_uuid();
        let limit = i64::from(limit);
        let rows = sqlx::query!(
            "SELECT seq, request_id, message FROM transcript WHERE conversation_id = ?1
             ORDER BY seq DESC LIMIT ?2",
            uuid,
            limit
        )
        .fetch_all(&self.reader)
        .await
        .map_err(db("load transcript window"))?;
        let mut entries = rows
            .into_iter()
            .map(|r| transcript_entry(conversation_id, r.seq, &r.request_id, &r.message))
            .collect::<Result<Vec<_>, _>>()?;
        entries.reverse();
        Ok(entries)
    }

    pub(super) async fn transcript_range_impl(
        &self,
        conversation_id: ConversationId,
        from: u64,
        to: u64,
    ) -> Result<Vec<TranscriptEntry>, Error> {
        let uuid = conversation_id.as_uuid();
        let (from, to) = (to_i64(from), to_i64(to));
        let rows = sqlx::query!(
            "SELECT seq, request_id, message FROM transcript
             WHERE conversation_id = ?1 AND seq >= ?2 AND seq < ?3 ORDER BY seq",
            uuid,
            from,
            to
        )
        .fetch_all(&self.reader)
        .await
        .map_err(db("load transcript range"))?;
        rows.into_iter()
            .map(|r| transcript_entry(conversation_id, r.seq, &r.request_id, &r.message))
            .collect()
    }

    pub(super) async fn latest_checkpoint_impl(
        &self,
        run_id: RunId,
    ) -> Result<Option<LoopCheckpoint>, Error> {
        Ok(self.checkpoint_rows(run_id, true).await?.pop())
    }

    pub(super) async fn checkpoints_impl(
        &self,
        run_id: RunId,
    ) -> Result<Vec<LoopCheckpoint>, Error> {
        self.checkpoint_rows(run_id, false).await
    }

    async fn checkpoint_rows(
        &self,
        run_id: RunId,
        latest_only: bool,
    ) -> Result<Vec<LoopCheckpoint>, Error> {
        let uuid = run_id.as_uuid();
        // Latest first, so LIMIT 1 is the latest; all rows when not limited.
        let limit: i64 = if latest_only { 1 } else { -1 };
        let rows = sqlx::query!(
            "SELECT turn, phase, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
                    tool_calls_count, verification_reports, message_count, created_at
             FROM loop_checkpoints WHERE run_id = ?1 ORDER BY turn DESC LIMIT ?2",
            uuid,
            limit
        )
        .fetch_all(&self.reader)
        .await
        .map_err(db("load checkpoints"))?;
        let mut checkpoints = rows
            .into_iter()
            .map(|r| {
                let key = format!("{run_id}/{}", r.turn);
                let row = Row {
                    table: "loop_checkpoints",
                    key: &key,
                };
                Ok(LoopCheckpoint {
                    run_id,
                    turn: row.u32("turn", r.turn)?,
                    phase: CheckpointPhase::parse(&r.phase)
                        .ok_or_else(|| row.corrupt(format!("unknown phase {:?}", r.phase)))?,
                    usage: row.usage(
                        r.input_tokens,
                        r.output_tokens,
                        r.cache_read_tokens,
                        r.cache_write_tokens,
                    )?,
                    tool_calls_count: row.u64("tool_calls_count", r.tool_calls_count)?,
                    verification_reports: row.json::<Vec<VerificationReport>>(
                        "verification_reports",
                        &r.verification_reports,
                    )?,
                    message_count: row.u64("message_count", r.message_count)?,
                    created_at: r.created_at,
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        checkpoints.reverse();
        Ok(checkpoints)
    }

    pub(super) async fn request_messages_impl(
        &self,
        request_id: RequestId,
        count: u64,
    ) -> Result<Vec<Message>, Error> {
        let uuid = request_id.as_uuid();
        let count = to_i64(count);
        let rows = sqlx::query!(
            "SELECT seq, message FROM run_messages WHERE request_id = ?1 AND seq < ?2 ORDER BY seq",
            uuid,
            count
        )
        .fetch_all(&self.reader)
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
                row.json("message", &r.message)
            })
            .collect()
    }

    pub(super) async fn journal_impl(
        &self,
        request_id: RequestId,
        turn: u32,
    ) -> Result<Vec<JournalEntry>, Error> {
        let uuid = request_id.as_uuid();
        let turn = i64::from(turn);
        let rows = sqlx::query!(
            "SELECT turn, call_id, run_id, name, arguments, status, result FROM tool_calls
             WHERE request_id = ?1 AND turn = ?2 ORDER BY rowid",
            uuid,
            turn
        )
        .fetch_all(&self.reader)
        .await
        .map_err(db("load tool journal"))?;
        rows.into_iter()
            .map(|r| {
                let key = format!("{request_id}/{}/{}", r.turn, r.call_id);
                let row = Row {
                    table: "tool_calls",
                    key: &key,
                };
                let status = match r.status.as_str() {
                    "requested" => JournalStatus::Requested,
                    "completed" => JournalStatus::Completed,
                    "failed" => JournalStatus::Failed,
                    other => return Err(row.corrupt(format!("unknown status {other:?}"))),
                };
                let result = match (status, r.result) {
                    (JournalStatus::Requested, _) => None,
                    (_, Some(content)) => Some(ToolResult {
                        content,
                        is_error: status == JournalStatus::Failed,
                    }),
                    (_, None) => return Err(row.corrupt("finished call without a result")),
                };
                Ok(JournalEntry {
                    turn: row.u32("turn", r.turn)?,
                    call_id: r.call_id,
                    run_id: RunId::from_db(row.uuid("run_id", &r.run_id)?),
                    name: r.name,
                    arguments: r.arguments,
                    status,
                    result,
                })
            })
            .collect()
    }
}

pub(super) async fn load_request(
    conn: &mut SqliteConnection,
    request_id: RequestId,
) -> Result<Option<RequestRecord>, Error> {
    let uuid = request_id.as_uuid();
    let Some(row) = sqlx::query!(
        "SELECT conversation_id, input_sha256, status, outcome, created_at, completed_at
         FROM requests WHERE request_id = ?1",
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
    let outcome = match (status, row.outcome) {
        (RequestStatus::Completed, Some(text)) => Some(key.json("outcome", &text)?),
        (RequestStatus::Completed, None) => return Err(key.corrupt("completed without an outcome")),
        _ => None,
    };
    Ok(Some(RequestRecord {
        request_id,
        conversation_id: ConversationId::from_db(
            key.uuid("conversation_id", &row.conversation_id)?,
        ),
        input_sha256: key.hash("input_sha256", &row.input_sha256)?,
        status,
        outcome,
        created_at: row.created_at,
        completed_at: row.completed_at,
    }))
}

fn transcript_entry(
    conversation_id: ConversationId,
    seq: i64,
    request_id: &[u8],
    message: &str,
) -> Result<TranscriptEntry, Error> {
    let key = format!("{conversation_id}/{seq}");
    let row = Row {
        table: "transcript",
        key: &key,
    };
    Ok(TranscriptEntry {
        seq: row.u64("seq", seq)?,
        request_id: RequestId::from_db(row.uuid("request_id", request_id)?),
        message: row.json("message", message)?,
    })
}
