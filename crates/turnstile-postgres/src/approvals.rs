//! Human approval of tool calls: a run's stop to ask (fenced like every
//! owner write), the listings, and a decision (a compare-and-swap on the
//! admission's revision). An approval row is keyed by its call's journal
//! row (`tool_calls`, by position), whose call id, name and arguments it
//! reads.

use sqlx::PgConnection;
use uuid::Uuid;

use super::codec::{db, now_ms, text, to_i64, Row};
use super::steps::fenced;
use super::steps::turn_write::{write_step, Step};
use turnstile_core::backend::decision_refusal;
use turnstile_core::checkpoint::LoopCheckpoint;
use turnstile_core::ids::{ConversationId, RequestId, Revision, RunId};
use turnstile_core::store::{
    ApprovalDecision, ApprovalRecord, ApprovalStatus, Fence, PendingApproval, Verdict,
};
use turnstile_core::Error;

/// The stop for approval, inside its transaction: the fence locks the
/// admission and, only if every call id is journaled in the turn, journals
/// each as awaiting (an existing row is kept); then the settled checkpoint
/// and the run's failure are written as `fail_run` writes them. The
/// revision does not move. A retry whose first attempt committed finds
/// its rows and answers the same.
pub(crate) async fn await_approval_in(
    conn: &mut PgConnection,
    fence: &Fence,
    settled: &LoopCheckpoint,
    call_ids: &[String],
    reason: &str,
) -> Result<Vec<PendingApproval>, Error> {
    let mut ids: Vec<&[u8]> = Vec::with_capacity(call_ids.len());
    for id in call_ids {
        if !ids.contains(&id.as_bytes()) {
            ids.push(id.as_bytes());
        }
    }
    let now = now_ms();
    let mut pending = Vec::with_capacity(ids.len());
    if !ids.is_empty() {
        let rows = sqlx::query!(
            r#"WITH fence AS (
                   SELECT conversation_id FROM admissions
                   WHERE conversation_id = $1 AND revision = $2 AND run_id = $3
                     AND active_request_id = $4
                   FOR UPDATE
               ), asked AS (
                   SELECT c.id, c.ord, t.position, t.name, t.arguments
                   FROM fence f
                   CROSS JOIN UNNEST($6::bytea[]) WITH ORDINALITY AS c(id, ord)
                   LEFT JOIN tool_calls t ON t.conversation_id = f.conversation_id
                       AND t.request_id = $4 AND t.turn = $5 AND t.call_id = c.id
                       AND t.status = 'requested'
               ), awaiting AS (
                   INSERT INTO approvals (conversation_id, request_id, turn, position, run_id,
                       status, requested_at)
                   SELECT $1, $4, $5, q.position, $3, 'awaiting', $7 FROM asked q
                   WHERE NOT EXISTS (SELECT 1 FROM asked WHERE position IS NULL)
                   -- in the order asked: the event log tells them so
                   ORDER BY q.ord
                   ON CONFLICT DO NOTHING
               )
               SELECT q.id AS "call_id!", q.position AS "position?", q.name AS "name?",
                      q.arguments, $3::uuid AS "run_id!",
                      COALESCE(a.requested_at, $7) AS "requested_at!"
               FROM asked q
               LEFT JOIN approvals a ON a.conversation_id = $1 AND a.request_id = $4
                   AND a.turn = $5 AND a.position = q.position
               ORDER BY q.ord"#,
            fence.conversation_id.as_uuid(),
            to_i64(fence.revision.0),
            fence.run_id.as_uuid(),
            fence.request_id.as_uuid(),
            i64::from(settled.turn),
            &ids as &[&[u8]],
            now
        )
        .fetch_all(&mut *conn)
        .await
        .map_err(db("journal awaiting approvals"))?;
        // The fence matched no row: no call was looked up.
        if rows.is_empty() {
            return Err(fenced(fence));
        }
        if let Some(missing) = rows.iter().find(|r| r.position.is_none()) {
            return Err(Error::InvalidInput(format!(
                "no tool call {:?} in turn {} of request {}",
                String::from_utf8_lossy(&missing.call_id),
                settled.turn,
                fence.request_id
            )));
        }
        for row in rows {
            let key = format!("{}/{}", fence.request_id, settled.turn);
            let key = Row {
                table: "tool_calls",
                key: &key,
            };
            pending.push(PendingApproval {
                conversation_id: fence.conversation_id,
                request_id: fence.request_id,
                run_id: key.checked_id::<RunId>("run_id", row.run_id)?,
                turn: settled.turn,
                call_id: text(&key, "call_id", row.call_id)?,
                tool: text(&key, "name", row.name.unwrap_or_default())?,
                arguments: arguments(&key, row.arguments)?,
                revision: fence.revision,
                requested_at: row.requested_at,
            });
        }
    }
    // Under the lock taken above: the same fence matches.
    write_step(
        conn,
        fence,
        &Step {
            checkpoints: &[settled],
            failure: Some(reason),
            ..Step::default()
        },
    )
    .await?;
    Ok(pending)
}

/// A call's arguments: cleared only once its turn ended, never while its
/// call awaits a decision.
fn arguments(key: &Row<'_>, arguments: Option<Vec<u8>>) -> Result<String, Error> {
    let bytes = arguments.ok_or_else(|| key.corrupt("an awaiting call without its arguments"))?;
    text(key, "arguments", bytes)
}

pub(crate) async fn load_approvals(
    conn: &mut PgConnection,
    request_id: RequestId,
    turn: u32,
) -> Result<Vec<ApprovalRecord>, Error> {
    let rows = sqlx::query!(
        "SELECT t.call_id, a.run_id, a.status, a.reason, a.requested_at, a.decided_at
         FROM request_ids k
         JOIN approvals a ON a.conversation_id = k.conversation_id
             AND a.request_id = k.request_id
         JOIN tool_calls t ON t.conversation_id = a.conversation_id
             AND t.request_id = a.request_id AND t.turn = a.turn AND t.position = a.position
         WHERE k.request_id = $1 AND a.turn = $2
         ORDER BY a.requested_at, a.position",
        request_id.as_uuid(),
        i64::from(turn)
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db("load approvals"))?;
    let key = format!("{request_id}/{turn}");
    let key = Row {
        table: "approvals",
        key: &key,
    };
    rows.into_iter()
        .map(|r| {
            Ok(ApprovalRecord {
                request_id,
                turn,
                call_id: text(&key, "call_id", r.call_id)?,
                run_id: key.checked_id::<RunId>("run_id", r.run_id)?,
                status: ApprovalStatus::parse(&r.status)
                    .ok_or_else(|| key.corrupt(format!("unknown status {:?}", r.status)))?,
                reason: r.reason.map(|b| text(&key, "reason", b)).transpose()?,
                requested_at: r.requested_at,
                decided_at: r.decided_at,
            })
        })
        .collect()
}

/// An awaiting call as the listing reads it.
struct PendingRow {
    conversation_id: Uuid,
    request_id: Uuid,
    run_id: Uuid,
    turn: i64,
    call_id: Vec<u8>,
    name: Vec<u8>,
    arguments: Option<Vec<u8>>,
    revision: i64,
    requested_at: i64,
}

/// Calls awaiting a decision, of requests that still hold their admission
/// and whose result is not journaled, oldest first: of one conversation (by
/// its key) or of all (through the partial index of awaiting rows).
pub(crate) async fn load_pending_approvals(
    conn: &mut PgConnection,
    conversation_id: Option<ConversationId>,
) -> Result<Vec<PendingApproval>, Error> {
    let rows = match conversation_id {
        Some(conversation) => {
            sqlx::query_as!(
                PendingRow,
                r#"SELECT a.conversation_id, a.request_id, ad.run_id AS "run_id!", a.turn, t.call_id, t.name,
                    t.arguments, ad.revision, a.requested_at
             FROM approvals a
             JOIN admissions ad ON ad.conversation_id = a.conversation_id
                 AND ad.active_request_id = a.request_id
             JOIN tool_calls t ON t.conversation_id = a.conversation_id
                 AND t.request_id = a.request_id AND t.turn = a.turn AND t.position = a.position
             WHERE a.conversation_id = $1 AND a.status = 'awaiting' AND t.status = 'requested'
             ORDER BY a.requested_at, a.request_id, a.turn, a.position"#,
                conversation.as_uuid()
            )
            .fetch_all(&mut *conn)
            .await
        }
        None => {
            sqlx::query_as!(
                PendingRow,
                r#"SELECT a.conversation_id, a.request_id, ad.run_id AS "run_id!", a.turn, t.call_id, t.name,
                    t.arguments, ad.revision, a.requested_at
             FROM approvals a
             JOIN admissions ad ON ad.conversation_id = a.conversation_id
                 AND ad.active_request_id = a.request_id
             JOIN tool_calls t ON t.conversation_id = a.conversation_id
                 AND t.request_id = a.request_id AND t.turn = a.turn AND t.position = a.position
             WHERE a.status = 'awaiting' AND t.status = 'requested'
             ORDER BY a.requested_at, a.request_id, a.turn, a.position"#
            )
            .fetch_all(&mut *conn)
            .await
        }
    }
    .map_err(db("load pending approvals"))?;
    rows.into_iter()
        .map(|r| {
            let key = format!("{}/{}", r.request_id, r.turn);
            let key = Row {
                table: "approvals",
                key: &key,
            };
            Ok(PendingApproval {
                conversation_id: key.checked_id("conversation_id", r.conversation_id)?,
                request_id: key.checked_id("request_id", r.request_id)?,
                run_id: key.checked_id("run_id", r.run_id)?,
                turn: key.u32("turn", r.turn)?,
                call_id: text(&key, "call_id", r.call_id)?,
                tool: text(&key, "name", r.name)?,
                arguments: arguments(&key, r.arguments)?,
                revision: Revision(key.u64("revision", r.revision)?),
                requested_at: r.requested_at,
            })
        })
        .collect()
}

/// The decision as one statement: the admission's compare-and-swap, only
/// while the call awaits a decision (its latest turn's awaiting row, its
/// result not journaled) and the request's run has stopped (a decision must
/// not fence a run that is executing the calls decided before it), and the row decided by `token` (one per call, the
/// same for all its attempts) with the revision it produced. A refusal
/// writes nothing and is explained by a fresh read of the admission.
pub(crate) async fn decide_approval(
    conn: &mut PgConnection,
    decision: &ApprovalDecision,
    token: Uuid,
    retry: bool,
) -> Result<Revision, Error> {
    let conversation = decision.conversation_id.as_uuid();
    let request = decision.request_id.as_uuid();
    let (status, reason) = match &decision.verdict {
        Verdict::Approve => (ApprovalStatus::Approved, None),
        Verdict::Reject { reason } => (ApprovalStatus::Rejected, Some(reason.as_bytes())),
    };
    let decided = sqlx::query_scalar!(
        r#"WITH target AS (
               SELECT a.turn, a.position FROM approvals a
               JOIN tool_calls t ON t.conversation_id = a.conversation_id
                   AND t.request_id = a.request_id AND t.turn = a.turn
                   AND t.position = a.position
               WHERE a.conversation_id = $1 AND a.request_id = $2 AND t.call_id = $3
                 AND a.status = 'awaiting' AND t.status = 'requested'
               ORDER BY a.turn DESC LIMIT 1
           ), bumped AS (
               UPDATE admissions SET revision = revision + 1, updated_at = $4
               WHERE conversation_id = $1 AND active_request_id = $2 AND revision = $5
                 AND EXISTS (SELECT 1 FROM target)
                 AND EXISTS (SELECT 1 FROM all_runs r WHERE r.conversation_id = $1
                             AND r.request_id = $2 AND r.run_id = admissions.run_id
                             AND r.status = 'failed')
               RETURNING revision
           ), decided AS (
               UPDATE approvals a SET status = $6, reason = $7, decided_at = $4,
                   decided_by = $8, decided_revision = b.revision
               FROM target x, bumped b
               WHERE a.conversation_id = $1 AND a.request_id = $2 AND a.turn = x.turn
                 AND a.position = x.position
           )
           SELECT revision AS "revision!" FROM bumped"#,
        conversation,
        request,
        decision.call_id.as_bytes(),
        now_ms(),
        to_i64(decision.expected_revision.0),
        status.as_str(),
        reason,
        token
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("decide approval"))?;
    let key = Row {
        table: "admissions",
        key: &decision.conversation_id,
    };
    if let Some(revision) = decided {
        return Ok(Revision(key.u64("revision", revision)?));
    }
    if retry {
        // This call's first attempt decided it, and its acknowledgement
        // was lost.
        let mine = sqlx::query_scalar!(
            r#"SELECT decided_revision AS "revision!" FROM approvals
               WHERE conversation_id = $1 AND request_id = $2 AND decided_by = $3
                 AND decided_revision IS NOT NULL"#,
            conversation,
            request,
            token
        )
        .fetch_optional(&mut *conn)
        .await
        .map_err(db("read approval decision"))?;
        if let Some(revision) = mine {
            return Ok(Revision(key.u64("decided_revision", revision)?));
        }
    }
    match super::admission::load_admission(conn, decision.conversation_id).await {
        Ok(admission) => {
            let run = admission.active.as_ref().map(|a| a.run_id.as_uuid());
            let stopped = sqlx::query_scalar!(
                r#"SELECT EXISTS (SELECT 1 FROM all_runs WHERE conversation_id = $1 AND run_id = $2
                                  AND status = 'failed') AS "stopped!""#,
                conversation,
                run
            )
            .fetch_one(&mut *conn)
            .await
            .map_err(db("read the owning run's status"))?;
            Err(decision_refusal(admission, stopped, decision))
        }
        // No conversation: the request holds no admission there.
        Err(Error::NotFound { .. }) => Err(Error::NotActive {
            request_id: decision.request_id,
        }),
        Err(e) => Err(e),
    }
}
