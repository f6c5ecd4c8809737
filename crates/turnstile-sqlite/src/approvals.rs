//! Approval of tool calls: the stop that asks, the decisions and the
//! listings. Not on a turn's hot path, so each write is a few statements in
//! a savepoint step of the group writer.

use super::read_connections::ReadConnections;
use sqlx::SqliteConnection;

use super::admission::load_admission;
use super::codec::{db, hex, now_ms, to_i64, to_json, Row};
use super::steps::turn_write::fail_run;
use turnstile_core::backend::decision_refusal;
use turnstile_core::checkpoint::LoopCheckpoint;
use turnstile_core::ids::{ConversationId, RequestId, Revision, RunId};
use turnstile_core::store::{
    ApprovalDecision, ApprovalRecord, ApprovalStatus, Fence, PendingApproval, Verdict,
};
use turnstile_core::Error;

/// The stop for approval, inside the group transaction: the run's failure
/// and settled checkpoint (fenced, as `fail_run`), then an awaiting row per
/// call (one already there is kept), then the calls as listed.
pub(super) async fn await_approval_in(
    conn: &mut SqliteConnection,
    fence: &Fence,
    settled: &LoopCheckpoint,
    call_ids: &[String],
    reason: &str,
) -> Result<Vec<PendingApproval>, Error> {
    fail_run(fence, reason, Some(settled))?.write(conn).await?;
    let request = fence.request_id.as_uuid();
    let run = fence.run_id.as_uuid();
    let turn = i64::from(settled.turn);
    let now = now_ms();
    let ids = to_json(call_ids)?;
    sqlx::query!(
        "INSERT INTO approvals (request_id, turn, call_id, run_id, status, requested_at)
         SELECT ?1, ?2, value, ?3, 'awaiting', ?4 FROM json_each(?5) WHERE true
         ON CONFLICT (request_id, turn, call_id) DO NOTHING",
        request,
        turn,
        run,
        now,
        ids
    )
    .execute(&mut *conn)
    .await
    .map_err(db("journal awaited approvals"))?;
    let mut listed = pending(
        &mut *conn,
        Some(fence.conversation_id),
        Some(fence.request_id),
    )
    .await?;
    let mut asked = Vec::with_capacity(call_ids.len());
    for call_id in call_ids {
        let Some(at) = listed
            .iter()
            .position(|p| p.turn == settled.turn && &p.call_id == call_id)
        else {
            return Err(Error::InvalidInput(format!(
                "no unanswered tool call {call_id:?} in turn {} of request {} awaits approval",
                settled.turn, fence.request_id
            )));
        };
        asked.push(listed.swap_remove(at));
    }
    Ok(asked)
}

/// One decision, inside the group transaction: the awaiting row decided
/// only while the admission is the request's at the expected revision,
/// then the revision moved on. A refusal writes nothing and is explained
/// from the admission.
pub(super) async fn decide_approval_in(
    conn: &mut SqliteConnection,
    decision: &ApprovalDecision,
) -> Result<Revision, Error> {
    let conversation = decision.conversation_id.as_uuid();
    let request = decision.request_id.as_uuid();
    let expected = to_i64(decision.expected_revision.0);
    let (status, reason) = match &decision.verdict {
        Verdict::Approve => (ApprovalStatus::Approved, None),
        Verdict::Reject { reason } => (ApprovalStatus::Rejected, Some(reason.as_str())),
    };
    let status = status.as_str();
    let now = now_ms();
    // Only while the request's run has stopped (`failed`): a decision must
    // not fence a run that is executing the calls decided before it.
    let decided = sqlx::query!(
        "UPDATE approvals SET status = ?1, reason = ?2, decided_at = ?3
         WHERE request_id = ?4 AND call_id = ?5 AND status = 'awaiting'
           AND turn = (SELECT MAX(turn) FROM approvals
                       WHERE request_id = ?4 AND call_id = ?5 AND status = 'awaiting')
           AND EXISTS (SELECT 1 FROM tool_calls t
                       WHERE t.request_id = approvals.request_id AND t.turn = approvals.turn
                         AND t.call_id = approvals.call_id AND t.status = 'requested')
           AND EXISTS (SELECT 1 FROM admissions a
                       WHERE a.conversation_id = ?6 AND a.active_request_id = ?4
                         AND a.revision = ?7
                         AND (SELECT status FROM all_runs WHERE run_id = a.run_id) = 'failed')",
        status,
        reason,
        now,
        request,
        decision.call_id,
        conversation,
        expected
    )
    .execute(&mut *conn)
    .await
    .map_err(db("decide approval"))?;
    if decided.rows_affected() == 0 {
        let admission = match load_admission(&mut *conn, decision.conversation_id).await {
            Err(Error::NotFound { .. }) => {
                return Err(Error::NotActive {
                    request_id: decision.request_id,
                })
            }
            other => other?,
        };
        let run = admission.active.as_ref().map(|a| a.run_id.as_uuid());
        let stopped = sqlx::query_scalar!(
            r#"SELECT EXISTS (SELECT 1 FROM all_runs WHERE run_id = ?1 AND status = 'failed')
                   AS "stopped!: bool""#,
            run
        )
        .fetch_one(&mut *conn)
        .await
        .map_err(db("read the owning run's status"))?;
        return Err(decision_refusal(admission, stopped, decision));
    }
    let revision = sqlx::query_scalar!(
        "UPDATE admissions SET revision = revision + 1, updated_at = ?1
         WHERE conversation_id = ?2 RETURNING revision",
        now,
        conversation
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(db("move the revision on after a decision"))?;
    Ok(Revision(revision as u64))
}

pub(super) async fn load_approvals(
    reader: &ReadConnections,
    request_id: RequestId,
    turn: u32,
) -> Result<Vec<ApprovalRecord>, Error> {
    let mut conn = reader.acquire().await?;
    let request = request_id.as_uuid();
    let turn = i64::from(turn);
    let rows = sqlx::query!(
        "SELECT a.turn, a.call_id, a.run_id, a.status, a.reason, a.requested_at, a.decided_at
         FROM approvals a
         LEFT JOIN tool_calls t ON t.request_id = a.request_id AND t.turn = a.turn
             AND t.call_id = a.call_id
         WHERE a.request_id = ?1 AND a.turn = ?2 ORDER BY a.requested_at, t.position",
        request,
        turn
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db("load approvals"))?;
    rows.into_iter()
        .map(|r| {
            let key = format!("{request_id}/{}/{}", r.turn, r.call_id);
            let row = Row {
                table: "approvals",
                key: &key,
            };
            Ok(ApprovalRecord {
                request_id,
                turn: row.u32("turn", r.turn)?,
                run_id: row.id::<RunId>("run_id", &r.run_id)?,
                status: ApprovalStatus::parse(&r.status)
                    .ok_or_else(|| row.corrupt(format!("unknown status {:?}", r.status)))?,
                call_id: r.call_id,
                reason: r.reason,
                requested_at: r.requested_at,
                decided_at: r.decided_at,
            })
        })
        .collect()
}

pub(super) async fn load_pending_approvals(
    reader: &ReadConnections,
    conversation_id: Option<ConversationId>,
) -> Result<Vec<PendingApproval>, Error> {
    let mut conn = reader.acquire().await?;
    pending(&mut conn, conversation_id, None).await
}

/// Awaiting calls of requests that hold their admission, with no journaled
/// result, oldest first; of one conversation and request when given.
async fn pending(
    conn: &mut SqliteConnection,
    conversation_id: Option<ConversationId>,
    request_id: Option<RequestId>,
) -> Result<Vec<PendingApproval>, Error> {
    let conversation = conversation_id.map(|c| c.as_uuid());
    let request = request_id.map(|r| r.as_uuid());
    let rows = sqlx::query!(
        r#"SELECT d.conversation_id, a.request_id, d.run_id AS "run_id!", a.turn, a.call_id,
                  t.name, t.arguments, d.revision, a.requested_at
           FROM approvals a
           JOIN tool_calls t ON t.request_id = a.request_id AND t.turn = a.turn
               AND t.call_id = a.call_id AND t.status = 'requested'
           JOIN requests r ON r.request_id = a.request_id
           JOIN admissions d ON d.conversation_id = r.conversation_id
               AND d.active_request_id = a.request_id
           WHERE a.status = 'awaiting'
             AND (?1 IS NULL OR d.conversation_id = ?1)
             AND (?2 IS NULL OR a.request_id = ?2)
           ORDER BY a.requested_at, a.request_id, t.position"#,
        conversation,
        request
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db("list pending approvals"))?;
    rows.into_iter()
        .map(|r| {
            let key = format!("{}/{}", hex(&r.request_id), r.call_id);
            let row = Row {
                table: "approvals",
                key: &key,
            };
            Ok(PendingApproval {
                conversation_id: row.id("conversation_id", &r.conversation_id)?,
                request_id: row.id("request_id", &r.request_id)?,
                run_id: row.id("run_id", &r.run_id)?,
                turn: row.u32("turn", r.turn)?,
                call_id: r.call_id,
                tool: r.name,
                arguments: r
                    .arguments
                    .ok_or_else(|| row.corrupt("an unanswered call without its arguments"))?,
                revision: Revision(row.u64("revision", r.revision)?),
                requested_at: r.requested_at,
            })
        })
        .collect()
}
