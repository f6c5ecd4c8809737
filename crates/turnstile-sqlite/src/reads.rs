//! Reads: requests, runs, transcript, checkpoints, pending messages, journal.

use super::read_connections::ReadConnections;
use sqlx::SqliteConnection;

use super::admission::AdmissionColumns;
use super::codec::{db, decode_message, to_i64, Row};
use turnstile_core::backend::{
    decode_budget, decode_budget_change, decode_tool_result, CheckpointRow, EntryKey,
};
use turnstile_core::checkpoint::{CheckpointPhase, LoopCheckpoint};
use turnstile_core::ids::{ConversationId, Namespace, RequestId, RunId};
use turnstile_core::message::{Message, VerificationReport};
use turnstile_core::store::{
    AgentChange, ClaimContext, JournalEntry, JournalStatus, RequestRecord, RequestStatus,
    RunRecord, RunStatus, StoredOutcome, TranscriptEntry,
};
use turnstile_core::Error;

pub(super) async fn load_run(
    reader: &ReadConnections,
    run_id: RunId,
) -> Result<Option<RunRecord>, Error> {
    let mut conn = reader.acquire().await?;
    let uuid = run_id.as_uuid();
    let Some(row) = sqlx::query!(
        "SELECT request_id, resumed_from, status, error, started_at, ended_at, agent_fingerprint,
             replaced_fingerprint, budget_change
         FROM all_runs WHERE run_id = ?1",
        uuid
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("load run"))?
    else {
        return match super::deletion::deleted_run(&mut conn, run_id).await? {
            Some(conversation_id) => Err(Error::Deleted { conversation_id }),
            None => Ok(None),
        };
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
        agent_change: match (row.replaced_fingerprint, row.agent_fingerprint) {
            (Some(from), Some(to)) => Some(AgentChange { from, to }),
            (None, None) => None,
            _ => return Err(key.corrupt("one of the two fingerprints of an agent change")),
        },
        budget_change: decode_budget_change(&key, row.budget_change.as_deref())?,
    }))
}

pub(super) async fn load_transcript_window(
    reader: &ReadConnections,
    conversation_id: ConversationId,
    limit: u32,
) -> Result<Vec<TranscriptEntry>, Error> {
    let mut conn = reader.acquire().await?;
    let uuid = conversation_id.as_uuid();
    let limit = i64::from(limit);
    let rows = sqlx::query!(
        "SELECT seq, request_id, role, content, meta FROM transcript
         WHERE conversation_key = (SELECT key FROM conversations WHERE id = ?1)
           AND seq < (SELECT transcript_length FROM conversations WHERE id = ?1)
         ORDER BY seq DESC LIMIT ?2",
        uuid,
        limit
    )
    .fetch_all(&mut *conn)
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
    reader: &ReadConnections,
    conversation_id: ConversationId,
    from: u64,
    to: u64,
) -> Result<Vec<TranscriptEntry>, Error> {
    let mut conn = reader.acquire().await?;
    let uuid = conversation_id.as_uuid();
    let (from, to) = (to_i64(from), to_i64(to));
    let rows = sqlx::query!(
        "SELECT seq, request_id, role, content, meta FROM transcript
         WHERE conversation_key = (SELECT key FROM conversations WHERE id = ?1)
           AND seq >= ?2 AND seq < min(?3, (SELECT transcript_length FROM conversations WHERE id = ?1))
         ORDER BY seq",
        uuid,
        from,
        to
    )
    .fetch_all(&mut *conn)
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
    reader: &ReadConnections,
    run_id: RunId,
    latest_only: bool,
) -> Result<Vec<LoopCheckpoint>, Error> {
    let mut conn = reader.acquire().await?;
    let uuid = run_id.as_uuid();
    // Latest first, so LIMIT 1 is the latest; all rows when not limited.
    let limit: i64 = if latest_only { 1 } else { -1 };
    let rows = sqlx::query!(
        "SELECT c.turn, c.phase, c.input_tokens, c.output_tokens, c.cache_read_tokens,
                c.cache_write_tokens, c.tool_calls_count, c.reports_count, c.message_count,
                c.created_at, (SELECT request_id FROM all_runs WHERE run_id = ?1) AS request_id
         FROM all_checkpoints c
         WHERE c.run_id = ?1 ORDER BY c.turn DESC LIMIT ?2",
        uuid,
        limit
    )
    .fetch_all(&mut *conn)
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
    reader: &ReadConnections,
    request_id: RequestId,
    count: u64,
) -> Result<Vec<Message>, Error> {
    let mut conn = reader.acquire().await?;
    let uuid = request_id.as_uuid();
    let count = to_i64(count);
    let rows = sqlx::query!(
        r#"SELECT seq, role, content, meta, 'run_messages' AS "table!: String" FROM run_messages
         WHERE request_id = ?1 AND seq < ?2
         UNION ALL
         SELECT t.seq - c.transcript_length, t.role, t.content, t.meta, 'transcript'
         FROM requests r
         JOIN admissions a ON a.conversation_id = r.conversation_id
         JOIN conversations c ON c.id = a.conversation_id
         JOIN transcript t ON t.conversation_key = c.key AND t.seq >= c.transcript_length
             AND t.seq - c.transcript_length < ?2
         WHERE r.request_id = ?1 AND a.active_request_id = ?1 AND t.request_id = ?1
         ORDER BY 1"#,
        uuid,
        count
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db("load run messages"))?;
    rows.into_iter()
        .enumerate()
        .map(|(i, r)| {
            let key = format!("{request_id}/{}", r.seq);
            // Its messages are in the transcript while it is held, and in
            // `run_messages` once it is abandoned.
            let row = Row {
                table: if r.table == "transcript" {
                    "transcript"
                } else {
                    "run_messages"
                },
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
    reader: &ReadConnections,
    request_id: RequestId,
    turn: u32,
) -> Result<Vec<JournalEntry>, Error> {
    let mut conn = reader.acquire().await?;
    let uuid = request_id.as_uuid();
    let turn = i64::from(turn);
    let rows = sqlx::query!(
        "SELECT turn, call_id, run_id, name, arguments, status, result, result_parts FROM tool_calls
         WHERE request_id = ?1 AND turn = ?2 ORDER BY position",
        uuid,
        turn
    )
    .fetch_all(&mut *conn)
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
                (_, Some(text)) => Some(decode_tool_result(
                    &row,
                    text,
                    r.result_parts.as_deref(),
                    status == JournalStatus::Failed,
                )?),
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
    let Some(row) = sqlx::query_as!(
        RequestColumns,
        r#"SELECT r.conversation_id, r.input_sha256, r.status, r.committed_run_id,
                  r.conversation_version, r.first_seq, r.end_seq, r.created_at, r.completed_at,
                  r.deadline_at, r.budget,
                  IIF(r.committed_run_id = r.request_id, r.turn, c.turn) AS "turn?: i64",
                  IIF(r.committed_run_id = r.request_id, r.phase, c.phase) AS "phase?: String",
                  IIF(r.committed_run_id = r.request_id, r.input_tokens, c.input_tokens)
                      AS "input_tokens?: i64",
                  IIF(r.committed_run_id = r.request_id, r.output_tokens, c.output_tokens)
                      AS "output_tokens?: i64",
                  IIF(r.committed_run_id = r.request_id, r.cache_read_tokens, c.cache_read_tokens)
                      AS "cache_read_tokens?: i64",
                  IIF(r.committed_run_id = r.request_id, r.cache_write_tokens,
                      c.cache_write_tokens) AS "cache_write_tokens?: i64",
                  IIF(r.committed_run_id = r.request_id, r.tool_calls_count, c.tool_calls_count)
                      AS "tool_calls_count?: i64",
                  IIF(r.committed_run_id = r.request_id, r.reports_count, c.reports_count)
                      AS "reports_count?: i64"
           FROM requests r
           -- A folded committing run's checkpoint is in the row itself.
           LEFT JOIN loop_checkpoints c ON c.run_id = r.committed_run_id
               AND r.committed_run_id <> r.request_id
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
    row.decode(conn, request_id).await.map(Some)
}

/// A `requests` row as read, with the committing run's last checkpoint.
pub(super) struct RequestColumns {
    pub(super) conversation_id: Vec<u8>,
    pub(super) input_sha256: Vec<u8>,
    pub(super) status: String,
    pub(super) committed_run_id: Option<Vec<u8>>,
    pub(super) conversation_version: Option<i64>,
    pub(super) first_seq: Option<i64>,
    pub(super) end_seq: Option<i64>,
    pub(super) created_at: i64,
    pub(super) completed_at: Option<i64>,
    pub(super) deadline_at: Option<i64>,
    pub(super) budget: Option<String>,
    pub(super) turn: Option<i64>,
    pub(super) phase: Option<String>,
    pub(super) input_tokens: Option<i64>,
    pub(super) output_tokens: Option<i64>,
    pub(super) cache_read_tokens: Option<i64>,
    pub(super) cache_write_tokens: Option<i64>,
    pub(super) tool_calls_count: Option<i64>,
    pub(super) reports_count: Option<i64>,
}

impl RequestColumns {
    /// The record; a completed request's verification reports are read on
    /// `conn`.
    pub(super) async fn decode(
        self,
        conn: &mut SqliteConnection,
        request_id: RequestId,
    ) -> Result<RequestRecord, Error> {
        let row = self;
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
        Ok(RequestRecord {
            request_id,
            conversation_id: key.id("conversation_id", &row.conversation_id)?,
            input_sha256: key.hash("input_sha256", &row.input_sha256)?,
            status,
            outcome,
            created_at: row.created_at,
            completed_at: row.completed_at,
            deadline_at: row.deadline_at,
            budget: decode_budget(&key, row.budget.as_deref())?,
        })
    }
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
    let key = EntryKey(conversation_id, seq);
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

/// [`Store::claim_context`](turnstile_core::store::Store::claim_context)
/// in one query: a constant row left-joined to the conversation, the
/// request (with its committing run's last checkpoint), the admission
/// (only for an unknown request) and the transcript window (only when the
/// conversation is in `namespace`, the request unknown and the admission
/// idle: the rows a claim would use), as one row. The window is one value
/// in it ([`window_entries`] reads it): a row per entry would be a message
/// per entry from sqlx's worker thread, each carrying a copy of every other
/// column.
/// Its conditions are in its `LIMIT` (0 when they fail) rather than its
/// `WHERE`: SQLite re-checks a `WHERE` term with a subquery on every row, so
/// a replay would walk a long transcript's whole index to find nothing.
/// The texts are read `AS TEXT`, as the row reads decode them, and measured
/// as BLOBs: in bytes, embedded NULs included. A NULL where the schema
/// allows none is written `NULL`, which no header reads as a number: the
/// entry is `Corrupt` rather than left out of the concatenation.
pub(super) async fn load_claim_context(
    reader: &ReadConnections,
    namespace: &Namespace,
    conversation_id: ConversationId,
    request_id: RequestId,
    window: Option<u32>,
) -> Result<ClaimContext, Error> {
    let mut conn = reader.acquire().await?;
    let conversation = conversation_id.as_uuid();
    let request = request_id.as_uuid();
    let limit = i64::from(window.unwrap_or(0));
    let ns = namespace.as_str();
    let row = sqlx::query!(
        r#"SELECT c.namespace AS "namespace?: String", c.version AS "version?: i64",
                  c.created_at AS "conversation_created_at?: i64",
                  a.revision AS "revision?: i64",
                  a.active_request_id AS "active_request_id?: Vec<u8>",
                  a.input_sha256 AS "admission_input_sha256?: Vec<u8>",
                  a.run_id AS "admission_run_id?: Vec<u8>",
                  a.agent_fingerprint AS "agent_fingerprint?: String",
                  a.input_tokens AS "admission_input_tokens?: i64",
                  a.output_tokens AS "admission_output_tokens?: i64",
                  a.cache_read_tokens AS "admission_cache_read_tokens?: i64",
                  a.cache_write_tokens AS "admission_cache_write_tokens?: i64",
                  a.summary_passes AS "summary_passes?: i64",
                  a.summary_from_seq AS "summary_from_seq?: i64",
                  a.summary_through_seq AS "summary_through_seq?: i64",
                  a.summary_version AS "summary_version?: i64",
                  a.summary_prompt_sha256 AS "summary_prompt_sha256?: Vec<u8>",
                  r.conversation_id AS "request_conversation_id?: Vec<u8>",
                  r.input_sha256 AS "request_input_sha256?: Vec<u8>",
                  r.status AS "status?: String",
                  r.committed_run_id AS "committed_run_id?: Vec<u8>",
                  r.conversation_version AS "conversation_version?: i64",
                  r.first_seq AS "first_seq?: i64", r.end_seq AS "end_seq?: i64",
                  r.created_at AS "request_created_at?: i64",
                  r.completed_at AS "completed_at?: i64",
                  r.deadline_at AS "deadline_at?: i64", r.budget AS "budget?: String",
                  IIF(r.committed_run_id = r.request_id, r.turn, k.turn) AS "turn?: i64",
                  IIF(r.committed_run_id = r.request_id, r.phase, k.phase) AS "phase?: String",
                  IIF(r.committed_run_id = r.request_id, r.input_tokens, k.input_tokens)
                      AS "input_tokens?: i64",
                  IIF(r.committed_run_id = r.request_id, r.output_tokens, k.output_tokens)
                      AS "output_tokens?: i64",
                  IIF(r.committed_run_id = r.request_id, r.cache_read_tokens, k.cache_read_tokens)
                      AS "cache_read_tokens?: i64",
                  IIF(r.committed_run_id = r.request_id, r.cache_write_tokens,
                      k.cache_write_tokens) AS "cache_write_tokens?: i64",
                  IIF(r.committed_run_id = r.request_id, r.tool_calls_count, k.tool_calls_count)
                      AS "tool_calls_count?: i64",
                  IIF(r.committed_run_id = r.request_id, r.reports_count, k.reports_count)
                      AS "reports_count?: i64",
                  (SELECT conversation_id FROM deleted_requests WHERE request_id = ?2)
                      AS "deleted_in?: Vec<u8>",
                  (SELECT COALESCE(group_concat(seq || ':' || hex(request_id) || ':'
                              || COALESCE(length(CAST(role AS BLOB)), 'NULL') || ':'
                              || COALESCE(length(CAST(content AS BLOB)), 'NULL') || ':'
                              || COALESCE(length(CAST(meta AS BLOB)), -1) || ':'
                              || COALESCE(CAST(role AS TEXT), '')
                              || COALESCE(CAST(content AS TEXT), '')
                              || COALESCE(CAST(meta AS TEXT), ''), '' ORDER BY seq), '')
                   FROM (SELECT seq, request_id, role, content, meta FROM transcript
                         WHERE conversation_key = (SELECT key FROM conversations WHERE id = ?1)
                           AND seq < (SELECT transcript_length FROM conversations WHERE id = ?1)
                         ORDER BY seq DESC
                         LIMIT CASE WHEN (SELECT namespace = ?3 FROM conversations WHERE id = ?1)
                                      AND NOT EXISTS (SELECT 1 FROM requests WHERE request_id = ?2)
                                      AND EXISTS (SELECT 1 FROM admissions
                                                  WHERE conversation_id = ?1
                                                    AND active_request_id IS NULL)
                                    THEN ?4 ELSE 0 END)) AS "window!: Vec<u8>"
           FROM (SELECT 1) AS one
           LEFT JOIN conversations c ON c.id = ?1
           LEFT JOIN requests r ON r.request_id = ?2
           LEFT JOIN admissions a ON a.conversation_id = c.id AND r.request_id IS NULL
           -- A folded committing run's checkpoint is in the row itself.
           LEFT JOIN loop_checkpoints k ON k.run_id = r.committed_run_id
               AND r.committed_run_id <> r.request_id
               AND k.turn = (SELECT MAX(turn) FROM loop_checkpoints WHERE run_id = r.committed_run_id)"#,
        conversation,
        request,
        ns,
        limit
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(db("load claim context"))?;
    // The namespace first: nothing else of another namespace's
    // conversation is looked at.
    let found = match (&row.namespace, row.version, row.conversation_created_at) {
        (Some(stored), Some(version), Some(created_at)) => Some(super::admission::conversation_of(
            namespace,
            conversation_id,
            stored.clone(),
            version,
            created_at,
        )?),
        _ => None,
    };
    let request = match (
        &row.request_conversation_id,
        &row.request_input_sha256,
        &row.status,
        row.request_created_at,
    ) {
        (Some(conversation), Some(hash), Some(status), Some(created_at)) => {
            let columns = RequestColumns {
                conversation_id: conversation.clone(),
                input_sha256: hash.clone(),
                status: status.clone(),
                committed_run_id: row.committed_run_id.clone(),
                conversation_version: row.conversation_version,
                first_seq: row.first_seq,
                end_seq: row.end_seq,
                created_at,
                completed_at: row.completed_at,
                deadline_at: row.deadline_at,
                budget: row.budget.clone(),
                turn: row.turn,
                phase: row.phase.clone(),
                input_tokens: row.input_tokens,
                output_tokens: row.output_tokens,
                cache_read_tokens: row.cache_read_tokens,
                cache_write_tokens: row.cache_write_tokens,
                tool_calls_count: row.tool_calls_count,
                reports_count: row.reports_count,
            };
            Some(columns.decode(&mut conn, request_id).await?)
        }
        _ => None,
    };
    if let (None, None, Some(deleted_in)) = (&found, &request, &row.deleted_in) {
        // A request id of a deleted conversation, for a conversation that
        // does not exist yet: refused here, before the claim's caller
        // creates the conversation (a refusal writes nothing).
        let conversation_id = Row {
            table: "deleted_requests",
            key: &request_id,
        }
        .id("conversation_id", deleted_in)?;
        return Err(Error::Deleted { conversation_id });
    }
    if found.is_none() || request.is_some() {
        return Ok(ClaimContext {
            conversation: found,
            request,
            admission: None,
            window: Vec::new(),
        });
    }
    let admission = match (
        row.revision,
        row.admission_input_tokens,
        row.admission_output_tokens,
        row.admission_cache_read_tokens,
        row.admission_cache_write_tokens,
        row.summary_passes,
    ) {
        (Some(revision), Some(input), Some(output), Some(read), Some(write), Some(passes)) => {
            AdmissionColumns {
                revision,
                active_request_id: row.active_request_id.clone(),
                input_sha256: row.admission_input_sha256.clone(),
                run_id: row.admission_run_id.clone(),
                agent_fingerprint: row.agent_fingerprint.clone(),
                input_tokens: input,
                output_tokens: output,
                cache_read_tokens: read,
                cache_write_tokens: write,
                summary_passes: passes,
                summary_from_seq: row.summary_from_seq,
                summary_through_seq: row.summary_through_seq,
                summary_version: row.summary_version,
                summary_prompt_sha256: row.summary_prompt_sha256.clone(),
            }
            .decode(conversation_id)?
        }
        _ => {
            return Err(Error::NotFound {
                what: "conversation",
                id: conversation_id.to_string(),
            })
        }
    };
    // The query read entries only for an idle admission.
    let window = match admission.active {
        Some(_) => Vec::new(),
        None => window_entries(conversation_id, &row.window)?,
    };
    Ok(ClaimContext {
        conversation: found,
        request,
        admission: Some(admission),
        window,
    })
}

/// The window of [`load_claim_context`]: its entries oldest first, each a
/// header `seq:request id in hex:role bytes:content bytes:meta bytes:` (-1
/// for no meta) followed by the role, the content and the meta themselves.
/// Lengths rather than JSON: nothing to escape on SQLite's side or to
/// unescape on this one, for texts that are most of the window's bytes. The
/// texts are read as bytes, so one that is not UTF-8 is `Corrupt` here
/// rather than a failed read.
fn window_entries(
    conversation_id: ConversationId,
    window: &[u8],
) -> Result<Vec<TranscriptEntry>, Error> {
    let corrupt = |what: &str| {
        Row {
            table: "transcript",
            key: &conversation_id,
        }
        .corrupt(format!("the window: {what}"))
    };
    let mut rest = window;
    let mut entries = Vec::new();
    while !rest.is_empty() {
        let mut header = [&b""[..]; 5];
        for field in &mut header {
            let end = rest.iter().position(|&b| b == b':');
            let end = end.ok_or_else(|| corrupt("an entry's header ends early"))?;
            (*field, rest) = (&rest[..end], &rest[end + 1..]);
        }
        let [seq, request_id, role, content, meta] = header;
        let seq = number(seq).ok_or_else(|| corrupt("a seq that is not an integer"))?;
        let lengths = (number(role), number(content), number(meta));
        let (Some(role), Some(content), Some(meta)) = lengths else {
            return Err(corrupt("an entry's lengths are not numbers"));
        };
        let mut take = |length: i64| {
            let length = usize::try_from(length).map_err(|_| corrupt("a negative length"))?;
            if rest.len() < length {
                return Err(corrupt("an entry ends early"));
            }
            let (taken, after) = rest.split_at(length);
            rest = after;
            Ok(taken)
        };
        let role = take(role)?;
        let content = take(content)?;
        let meta = match meta {
            -1 => None,
            length => Some(take(length)?),
        };
        let key = EntryKey(conversation_id, seq);
        let row = Row {
            table: "transcript",
            key: &key,
        };
        let text = |column: &str, bytes| {
            std::str::from_utf8(bytes).map_err(|e| row.corrupt(format!("{column}: {e}")))
        };
        let request_id = uuid::Uuid::try_parse_ascii(request_id)
            .map_err(|e| row.corrupt(format!("request_id: {e}")))?;
        entries.push(transcript_entry(
            conversation_id,
            seq,
            request_id.as_bytes(),
            text("role", role)?,
            text("content", content)?.to_owned(),
            meta.map(|meta| text("meta", meta)).transpose()?,
        )?);
    }
    Ok(entries)
}

/// A window header's number.
fn number(field: &[u8]) -> Option<i64> {
    std::str::from_utf8(field).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "00112233445566778899AABBCCDDEEFF";

    fn entry(seq: i64, role: &str, content: &str, meta: Option<&str>) -> Vec<u8> {
        let meta_bytes = meta.map_or(-1, |m| m.len() as i64);
        let mut bytes = format!(
            "{seq}:{ID}:{}:{}:{meta_bytes}:{role}{content}",
            role.len(),
            content.len()
        )
        .into_bytes();
        bytes.extend_from_slice(meta.unwrap_or("").as_bytes());
        bytes
    }

    #[test]
    fn a_window_reads_texts_with_any_bytes_by_their_lengths() {
        let conversation = ConversationId::new();
        let mut window = entry(0, "user", "a:b\0c 1:2:3:", None);
        window.extend(entry(1, "assistant", "é", Some("{}")));
        let entries = window_entries(conversation, &window).expect("read");
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].message, Message::user("a:b\0c 1:2:3:"));
        assert_eq!(entries[1].message, Message::assistant("é"));
        assert_eq!(entries[1].seq, 1);
        assert!(window_entries(conversation, b"").expect("empty").is_empty());
    }

    #[test]
    fn a_malformed_window_is_corrupt_not_a_panic() {
        let conversation = ConversationId::new();
        let whole = entry(0, "user", "hello", None);
        let malformed: [&[u8]; 7] = [
            &whole[..whole.len() - 1],
            &whole[..10],
            b"0:00112233445566778899AABBCCDDEEFF:NULL:5:-1:hello",
            b"0:00:4:5:-1:userhello",
            b"x:00112233445566778899AABBCCDDEEFF:4:5:-1:userhello",
            b"0:00112233445566778899AABBCCDDEEFF:4:-5:-1:userhello",
            b"0:00112233445566778899AABBCCDDEEFF:4:99999999999999999999:-1:u",
        ];
        for bytes in malformed {
            match window_entries(conversation, bytes) {
                Err(Error::Corrupt { table, .. }) => assert_eq!(table, "transcript"),
                other => panic!(
                    "{:?}: expected Corrupt, got {other:?}",
                    String::from_utf8_lossy(bytes)
                ),
            }
        }
    }
}
