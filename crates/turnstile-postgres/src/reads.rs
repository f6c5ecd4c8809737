//! Reads: requests, runs, transcript, checkpoints, pending messages, journal.
//! A request or run found by its id alone is found through `request_ids`
//! or the run-id index; everything else by its conversation's key.

use sqlx::PgConnection;
use uuid::Uuid;

use super::codec::{db, text, to_i64, Row};
use turnstile_core::backend::{
    decode_budget, decode_budget_change, decode_message, decode_tool_result, AdmissionRow,
    CheckpointRow, EntryKey,
};
use turnstile_core::checkpoint::{CheckpointPhase, LoopCheckpoint};
use turnstile_core::ids::{ConversationId, Namespace, RequestId, RunId};
use turnstile_core::message::{Message, VerificationReport};
use turnstile_core::store::{
    AgentChange, ClaimContext, JournalEntry, JournalStatus, RequestRecord, RequestStatus,
    RunRecord, RunStatus, StoredOutcome, TranscriptEntry,
};
use turnstile_core::Error;

pub(crate) async fn load_run(
    conn: &mut PgConnection,
    run_id: RunId,
) -> Result<Option<RunRecord>, Error> {
    let Some(row) = sqlx::query!(
        r#"SELECT request_id AS "request_id!", resumed_from, status AS "status!", error,
                  started_at AS "started_at!", ended_at, agent_fingerprint, replaced_fingerprint,
                  budget_change::text
           FROM all_runs WHERE run_id = $1"#,
        run_id.as_uuid()
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("load run"))?
    else {
        return match super::deletion::deleted_run(conn, run_id).await? {
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
        request_id: key.checked_id::<RequestId>("request_id", row.request_id)?,
        resumed_from: row
            .resumed_from
            .map(|r| key.checked_id("resumed_from", r))
            .transpose()?,
        status: RunStatus::parse(&row.status)
            .ok_or_else(|| key.corrupt(format!("unknown status {:?}", row.status)))?,
        error: row.error.map(|e| text(&key, "error", e)).transpose()?,
        started_at: row.started_at,
        ended_at: row.ended_at,
        agent_change: match (row.replaced_fingerprint, row.agent_fingerprint) {
            (Some(from), Some(to)) => Some(AgentChange { from, to }),
            (None, None) => None,
            _ => return Err(key.corrupt("one of agent_fingerprint and replaced_fingerprint")),
        },
        budget_change: decode_budget_change(&key, row.budget_change.as_deref())?,
    }))
}

pub(crate) async fn load_transcript_window(
    conn: &mut PgConnection,
    conversation_id: ConversationId,
    limit: u32,
) -> Result<Vec<TranscriptEntry>, Error> {
    let rows = sqlx::query!(
        "SELECT seq, request_id, role, content, meta FROM transcript
         WHERE conversation_id = $1
           AND seq < (SELECT transcript_length FROM conversations WHERE conversation_id = $1)
         ORDER BY seq DESC LIMIT $2",
        conversation_id.as_uuid(),
        i64::from(limit)
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
                r.request_id,
                &r.role,
                r.content,
                r.meta,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    entries.reverse();
    Ok(entries)
}

pub(crate) async fn load_transcript_range(
    conn: &mut PgConnection,
    conversation_id: ConversationId,
    from: u64,
    to: u64,
) -> Result<Vec<TranscriptEntry>, Error> {
    let rows = sqlx::query!(
        "SELECT seq, request_id, role, content, meta FROM transcript
         WHERE conversation_id = $1 AND seq >= $2
           AND seq < LEAST($3, (SELECT transcript_length FROM conversations
                                WHERE conversation_id = $1))
         ORDER BY seq",
        conversation_id.as_uuid(),
        to_i64(from),
        to_i64(to)
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db("load transcript range"))?;
    rows.into_iter()
        .map(|r| {
            transcript_entry(
                conversation_id,
                r.seq,
                r.request_id,
                &r.role,
                r.content,
                r.meta,
            )
        })
        .collect()
}

/// A run's checkpoints, oldest first; only the latest if `latest_only`.
pub(crate) async fn load_checkpoints(
    conn: &mut PgConnection,
    run_id: RunId,
    latest_only: bool,
) -> Result<Vec<LoopCheckpoint>, Error> {
    let limit: Option<i64> = latest_only.then_some(1);
    let rows = sqlx::query!(
        r#"SELECT c.turn AS "turn!", c.phase AS "phase!", c.input_tokens AS "input_tokens!",
                  c.output_tokens AS "output_tokens!",
                  c.cache_read_tokens AS "cache_read_tokens!",
                  c.cache_write_tokens AS "cache_write_tokens!",
                  c.tool_calls_count AS "tool_calls_count!", c.reports_count AS "reports_count!",
                  c.message_count AS "message_count!", c.created_at AS "created_at!",
                  r.conversation_id AS "conversation_id!", r.request_id AS "request_id!"
           FROM all_runs r
           -- Lateral, so that each place the views read is looked up by
           -- its key; a join of the two views would scan them.
           CROSS JOIN LATERAL (
               SELECT * FROM all_checkpoints k
               WHERE k.conversation_id = r.conversation_id AND k.run_id = r.run_id
               ORDER BY k.turn DESC LIMIT $2
           ) c
           WHERE r.run_id = $1 ORDER BY c.turn DESC LIMIT $2"#,
        run_id.as_uuid(),
        limit
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db("load checkpoints"))?;
    let Some(first) = rows.first() else {
        return Ok(Vec::new());
    };
    let most = rows.iter().map(|r| r.reports_count).max().unwrap_or(0);
    let reports = load_reports(conn, first.conversation_id, first.request_id, most).await?;
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

pub(crate) async fn load_request_messages(
    conn: &mut PgConnection,
    request_id: RequestId,
    count: u64,
) -> Result<Vec<Message>, Error> {
    let rows = sqlx::query!(
        r#"SELECT m.seq AS "seq!", m.role AS "role!", m.content AS "content!", m.meta,
                  'run_messages' AS "table!"
         FROM request_ids k JOIN run_messages m
             ON m.conversation_id = k.conversation_id AND m.request_id = k.request_id
         WHERE k.request_id = $1 AND m.seq < $2
         UNION ALL
         SELECT t.seq - c.transcript_length, t.role, t.content, t.meta, 'transcript'
         FROM request_ids k
         JOIN admissions a
             ON a.conversation_id = k.conversation_id AND a.active_request_id = k.request_id
         JOIN conversations c ON c.conversation_id = k.conversation_id
         JOIN transcript t ON t.conversation_id = k.conversation_id
             AND t.seq >= c.transcript_length AND t.seq - c.transcript_length < $2
             AND t.request_id = k.request_id
         WHERE k.request_id = $1
         ORDER BY 1"#,
        request_id.as_uuid(),
        to_i64(count)
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
            let content = text(&row, "content", r.content)?;
            decode_message(&row, &r.role, content, r.meta.as_deref())
        })
        .collect()
}

pub(crate) async fn load_journal(
    conn: &mut PgConnection,
    request_id: RequestId,
    turn: u32,
) -> Result<Vec<JournalEntry>, Error> {
    let rows = sqlx::query!(
        "SELECT t.turn, t.call_id, t.run_id, t.name, t.arguments, t.status, t.result,
             t.result_parts
         FROM request_ids k JOIN tool_calls t
             ON t.conversation_id = k.conversation_id AND t.request_id = k.request_id
         WHERE k.request_id = $1 AND t.turn = $2 ORDER BY t.position",
        request_id.as_uuid(),
        i64::from(turn)
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db("load tool journal"))?;
    rows.into_iter()
        .map(|r| {
            let key = format!("{request_id}/{}", r.turn);
            let row = Row {
                table: "tool_calls",
                key: &key,
            };
            let status = JournalStatus::parse(&r.status)
                .ok_or_else(|| row.corrupt(format!("unknown status {:?}", r.status)))?;
            let result = match (status, r.result) {
                (JournalStatus::Requested, _) | (_, None) => None,
                (_, Some(content)) => Some(decode_tool_result(
                    &row,
                    text(&row, "result", content)?,
                    r.result_parts.as_deref(),
                    status == JournalStatus::Failed,
                )?),
            };
            Ok(JournalEntry {
                turn: row.u32("turn", r.turn)?,
                call_id: text(&row, "call_id", r.call_id)?,
                run_id: row.checked_id::<RunId>("run_id", r.run_id)?,
                name: text(&row, "name", r.name)?,
                arguments: r
                    .arguments
                    .map(|a| text(&row, "arguments", a))
                    .transpose()?,
                status,
                result,
            })
        })
        .collect()
}

pub(crate) async fn load_request(
    conn: &mut PgConnection,
    request_id: RequestId,
) -> Result<Option<RequestRecord>, Error> {
    // A completed request's outcome: its columns plus the totals of the
    // committing run's last (`completed`) checkpoint.
    let Some(row) = sqlx::query!(
        r#"SELECT r.conversation_id, r.input_sha256, r.status, r.committed_run_id,
                  r.conversation_version, r.first_seq, r.end_seq, r.created_at, r.completed_at,
                  r.deadline_at, r.budget::text, c.turn AS "turn?", c.phase AS "phase?", c.input_tokens AS "input_tokens?",
                  c.output_tokens AS "output_tokens?", c.cache_read_tokens AS "cache_read_tokens?",
                  c.cache_write_tokens AS "cache_write_tokens?",
                  c.tool_calls_count AS "tool_calls_count?", c.reports_count AS "reports_count?"
           FROM request_ids k
           JOIN requests r ON r.conversation_id = k.conversation_id AND r.request_id = k.request_id
           LEFT JOIN LATERAL (
               SELECT * FROM all_checkpoints l
               WHERE l.conversation_id = r.conversation_id AND l.run_id = r.committed_run_id
               ORDER BY l.turn DESC LIMIT 1
           ) c ON true
           WHERE k.request_id = $1"#,
        request_id.as_uuid()
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
            .ok_or_else(|| missing("committed_run_id"))?;
        let turn = row.turn.ok_or_else(|| missing("a completed checkpoint"))?;
        if row.phase.as_deref() != Some(CheckpointPhase::Completed.as_str()) {
            return Err(missing("a completed checkpoint as its run's last"));
        }
        let reports_count = row.reports_count.unwrap_or(0);
        Some(StoredOutcome {
            run_id: key.checked_id::<RunId>("committed_run_id", run)?,
            usage: key.usage(
                row.input_tokens.unwrap_or(0),
                row.output_tokens.unwrap_or(0),
                row.cache_read_tokens.unwrap_or(0),
                row.cache_write_tokens.unwrap_or(0),
            )?,
            turns: key.u32("turn", turn)?,
            tool_calls: key.u64("tool_calls_count", row.tool_calls_count.unwrap_or(0))?,
            verification_reports: load_reports(
                conn,
                row.conversation_id,
                request_id.as_uuid(),
                reports_count,
            )
            .await?,
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
        conversation_id: key.checked_id("conversation_id", row.conversation_id)?,
        input_sha256: key.hash("input_sha256", &row.input_sha256)?,
        status,
        outcome,
        created_at: row.created_at,
        completed_at: row.completed_at,
        deadline_at: row.deadline_at,
        budget: decode_budget(&key, row.budget.as_deref())?,
    }))
}

/// The first `count` verification reports of a request; fewer is corrupt.
async fn load_reports(
    conn: &mut PgConnection,
    conversation: Uuid,
    request: Uuid,
    count: i64,
) -> Result<Vec<VerificationReport>, Error> {
    if count <= 0 {
        return Ok(Vec::new());
    }
    let rows = sqlx::query!(
        "SELECT seq, turn, passed, detail FROM verification_reports
         WHERE conversation_id = $1 AND request_id = $2 AND seq < $3 ORDER BY seq",
        conversation,
        request,
        count
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db("load verification reports"))?;
    if rows.len() as i64 != count {
        return Err(Error::Corrupt {
            table: "verification_reports",
            key: request.to_string(),
            reason: format!("expected {count} reports, found {}", rows.len()),
        });
    }
    rows.into_iter()
        .map(|r| {
            let key = format!("{request}/{}", r.seq);
            let row = Row {
                table: "verification_reports",
                key: &key,
            };
            Ok(VerificationReport {
                turn: row.u32("turn", r.turn)?,
                passed: r.passed,
                detail: text(&row, "detail", r.detail)?,
            })
        })
        .collect()
}

fn transcript_entry(
    conversation_id: ConversationId,
    seq: i64,
    request_id: Uuid,
    role: &str,
    content: Vec<u8>,
    meta: Option<String>,
) -> Result<TranscriptEntry, Error> {
    let key = EntryKey(conversation_id, seq);
    let row = Row {
        table: "transcript",
        key: &key,
    };
    let content = text(&row, "content", content)?;
    Ok(TranscriptEntry {
        seq: row.u64("seq", seq)?,
        request_id: row.checked_id::<RequestId>("request_id", request_id)?,
        message: decode_message(&row, role, content, meta.as_deref())?,
    })
}

/// What a new request reads before its claim, in one query on the way to
/// a claim: the conversation (in `namespace`), the admission and the window
/// (only while the request is unknown and the admission idle). A request
/// id that is known is read whole afterwards (a replay or a refusal).
pub(crate) async fn load_claim_context(
    conn: &mut PgConnection,
    namespace: &Namespace,
    conversation_id: ConversationId,
    request_id: RequestId,
    window: Option<u32>,
) -> Result<ClaimContext, Error> {
    let rows = sqlx::query!(
        r#"SELECT c.namespace AS "namespace?", c.version AS "version?",
                  c.created_at AS "created_at?", k.request_id AS "known_request?",
                  a.revision AS "revision?", a.active_request_id, a.input_sha256, a.run_id,
                  a.agent_fingerprint, a.input_tokens AS "input_tokens?",
                  a.output_tokens AS "output_tokens?",
                  a.cache_read_tokens AS "cache_read_tokens?",
                  a.cache_write_tokens AS "cache_write_tokens?",
                  a.summary_passes AS "summary_passes?", a.summary_from_seq,
                  a.summary_through_seq, a.summary_version, a.summary_prompt_sha256,
                  t.seq AS "seq?", t.request_id AS "entry_request_id?", t.role AS "role?",
                  t.content AS "content?", t.meta
           FROM (SELECT 1) AS one
           LEFT JOIN conversations c ON c.conversation_id = $1
           LEFT JOIN request_ids k ON k.request_id = $2
           LEFT JOIN admissions a ON a.conversation_id = c.conversation_id
               AND k.request_id IS NULL
           LEFT JOIN LATERAL (
               SELECT seq, request_id, role, content, meta FROM transcript
               WHERE conversation_id = $1 AND seq < c.transcript_length
                 AND c.namespace = $3 AND k.request_id IS NULL
                 AND a.revision IS NOT NULL AND a.active_request_id IS NULL
               ORDER BY seq DESC LIMIT $4
           ) t ON true
           ORDER BY t.seq"#,
        conversation_id.as_uuid(),
        request_id.as_uuid(),
        namespace.as_str(),
        i64::from(window.unwrap_or(0))
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db("load claim context"))?;
    let Some(first) = rows.first() else {
        return Err(Error::Store(turnstile_core::StoreError::new(
            "load claim context: no row (a constant row is left-joined)",
            None,
        )));
    };
    // The namespace first: nothing else of another namespace's
    // conversation is looked at.
    let conversation = match (&first.namespace, first.version, first.created_at) {
        (Some(stored), Some(version), Some(created_at)) => Some(super::admission::conversation_of(
            namespace,
            conversation_id,
            stored,
            version,
            created_at,
        )?),
        _ => None,
    };
    if first.known_request.is_some() {
        let request = load_request(conn, request_id).await?;
        // A known id with no request row is a tombstone of a deleted
        // conversation: refused here, before the claim's caller creates a
        // conversation for it (a refusal writes nothing).
        if request.is_none() {
            if let Some(conversation_id) =
                super::deletion::deleted_request(conn, request_id).await?
            {
                return Err(Error::Deleted { conversation_id });
            }
        }
        return Ok(ClaimContext {
            conversation,
            request,
            admission: None,
            window: Vec::new(),
        });
    }
    let admission = match (
        &conversation,
        first.revision,
        first.input_tokens,
        first.output_tokens,
        first.cache_read_tokens,
        first.cache_write_tokens,
        first.summary_passes,
    ) {
        (
            Some(_),
            Some(revision),
            Some(input),
            Some(output),
            Some(read),
            Some(write),
            Some(passes),
        ) => Some(
            AdmissionRow {
                revision,
                active_request_id: first.active_request_id,
                input_sha256: first.input_sha256.clone(),
                run_id: first.run_id,
                agent_fingerprint: first.agent_fingerprint.clone(),
                input_tokens: input,
                output_tokens: output,
                cache_read_tokens: read,
                cache_write_tokens: write,
                summary_passes: passes,
                summary_from_seq: first.summary_from_seq,
                summary_through_seq: first.summary_through_seq,
                summary_version: first.summary_version,
                summary_prompt_sha256: first.summary_prompt_sha256.clone(),
            }
            .decode(conversation_id)?,
        ),
        (Some(_), ..) => {
            return Err(Error::Corrupt {
                table: "admissions",
                key: conversation_id.to_string(),
                reason: "a conversation without its admission".into(),
            })
        }
        _ => None,
    };
    let mut entries = Vec::new();
    for row in rows {
        if let (Some(seq), Some(request), Some(role), Some(content)) =
            (row.seq, row.entry_request_id, row.role, row.content)
        {
            entries.push(transcript_entry(
                conversation_id,
                seq,
                request,
                &role,
                content,
                row.meta,
            )?);
        }
    }
    Ok(ClaimContext {
        conversation,
        request: None,
        admission,
        window: entries,
    })
}
