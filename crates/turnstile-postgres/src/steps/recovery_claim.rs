//! The recovery claim of an active admission by a new run of its request:
//! one short transaction. The compare-and-swap fences on the expected
//! active revision and locks the admission row; under that lock the check
//! (when the claim rejects ambiguity) that the run being continued is not
//! in flight; then the write: the run superseded, the new run and its copy
//! of the latest checkpoint. A retry whose first attempt took the
//! admission over is that takeover.
//!
//! Refusals: a moved admission is explained by reading it
//! (`cas_refusal`); a run stopped mid-turn is
//! [`Error::AmbiguousCheckpoint`], naming the turn.

use sqlx::PgConnection;

use super::fence_at;
use crate::admission::load_admission;
use crate::codec::{db, now_ms, to_i64, Row};
use turnstile_core::backend::{budget_change_json, budget_json, cas_refusal, Wanted};
use turnstile_core::checkpoint::CheckpointPhase;
use turnstile_core::ids::Revision;
use turnstile_core::store::{Admission, Fence, RecoveryClaim};
use turnstile_core::Error;

/// The recovery claim, inside its transaction.
pub(crate) async fn claim_recovery_in(
    conn: &mut PgConnection,
    claim: &RecoveryClaim,
    retry: bool,
) -> Result<Fence, Error> {
    let conversation = claim.conversation_id.as_uuid();
    let from_run = claim.from_run.as_uuid();
    let new_run = claim.new_run.as_uuid();
    let now = now_ms();
    let fence = |revision: Revision| Fence {
        conversation_id: claim.conversation_id,
        request_id: claim.request_id,
        run_id: claim.new_run,
        revision,
    };
    // The first attempt took it over, acknowledgement lost.
    let taken_over = |admission: &Admission| {
        admission
            .active
            .as_ref()
            .is_some_and(|a| a.run_id == claim.new_run)
    };
    if retry {
        let admission = load_admission(conn, claim.conversation_id).await?;
        if taken_over(&admission) {
            return Ok(fence(admission.revision));
        }
    }
    // The admission's fingerprint before the claim, from the row the claim
    // locks (`FOR UPDATE` reads its latest version): an upgrade records it
    // on the new run.
    let claimed = sqlx::query!(
        r#"WITH held AS (
               SELECT conversation_id, agent_fingerprint FROM admissions
               WHERE conversation_id = $3 AND revision = $4 AND active_request_id = $5
                 AND run_id = $6
               FOR UPDATE
           )
           UPDATE admissions a SET run_id = $1, revision = a.revision + 1, updated_at = $2,
               agent_fingerprint = COALESCE($7, a.agent_fingerprint)
           FROM held h
           WHERE a.conversation_id = h.conversation_id AND a.revision = $4
             AND a.active_request_id = $5 AND a.run_id = $6
           RETURNING a.revision, h.agent_fingerprint AS replaced_fingerprint"#,
        new_run,
        now,
        conversation,
        to_i64(claim.expected_revision.0),
        claim.request_id.as_uuid(),
        from_run,
        claim.agent_fingerprint.as_deref()
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("claim recovery"))?;
    let Some(claimed) = claimed else {
        let admission = load_admission(conn, claim.conversation_id).await?;
        // A first attempt still running when this retry started may have
        // committed while this update waited for its lock.
        if retry && taken_over(&admission) {
            return Ok(fence(admission.revision));
        }
        return Err(cas_refusal(
            admission,
            Wanted::Active,
            claim.request_id,
            claim.expected_revision,
        ));
    };
    // Under the admission's row lock, so the run being continued cannot
    // move on between this check and the commit; an error rolls the claim
    // back.
    if claim.reject_in_flight {
        let latest = sqlx::query!(
            r#"SELECT turn AS "turn!", phase AS "phase!" FROM all_checkpoints
               WHERE conversation_id = $1 AND run_id = $2
               ORDER BY turn DESC LIMIT 1"#,
            conversation,
            from_run
        )
        .fetch_optional(&mut *conn)
        .await
        .map_err(db("read latest checkpoint"))?;
        if let Some(latest) = latest {
            let phase = CheckpointPhase::parse(&latest.phase);
            let resolved = match claim.resolved {
                Some(round)
                    if phase == Some(CheckpointPhase::ToolsInFlight)
                        && i64::from(round.turn) == latest.turn =>
                {
                    answered(&mut *conn, claim, latest.turn).await? == i64::from(round.answered)
                }
                _ => false,
            };
            let model_call_retried =
                claim.retry_model_call && phase == Some(CheckpointPhase::TurnInFlight);
            if phase.is_some_and(CheckpointPhase::is_in_flight) && !resolved && !model_call_retried
            {
                let key = format!("{}/{}", claim.from_run, latest.turn);
                return Err(Error::AmbiguousCheckpoint {
                    run_id: claim.from_run,
                    turn: Row {
                        table: "loop_checkpoints",
                        key: &key,
                    }
                    .u32("turn", latest.turn)?,
                });
            }
        }
    }
    // The run being continued is superseded; the new run starts from a copy
    // of its latest checkpoint (one small row, no messages copied), or at
    // the start if it never checkpointed. A change of the request's budget
    // is recorded on the new run, and the request takes the new budget.
    sqlx::query!(
        "WITH superseded AS (
             UPDATE runs SET status = 'superseded', ended_at = COALESCE(ended_at, $1)
             WHERE conversation_id = $2 AND run_id = $3 AND status IN ('running', 'failed')
         ), resumed AS (
             INSERT INTO runs (conversation_id, run_id, request_id, resumed_from, status,
                 started_at, agent_fingerprint, replaced_fingerprint, budget_change)
             VALUES ($2, $4, $5, $3, 'running', $1, $6::text,
                 CASE WHEN $6::text IS NOT NULL THEN $7::text END, $8::text::jsonb)
         ), request AS (
             -- The request takes a new budget; a run folded into its row
             -- (migration 0027) is superseded there.
             UPDATE requests
             SET budget = CASE WHEN $8::text IS NOT NULL THEN $9::text::jsonb ELSE budget END,
                 run_status = CASE WHEN $3 = $5 AND run_status IN ('running', 'failed')
                                   THEN 'superseded' ELSE run_status END,
                 run_ended_at = CASE WHEN $3 = $5 AND run_status IN ('running', 'failed')
                                     THEN COALESCE(run_ended_at, $1) ELSE run_ended_at END
             WHERE conversation_id = $2 AND request_id = $5
               AND ($8::text IS NOT NULL OR ($3 = $5 AND run_status IN ('running', 'failed')))
         )
         INSERT INTO loop_checkpoints (conversation_id, run_id, turn, phase, input_tokens,
             output_tokens, cache_read_tokens, cache_write_tokens, tool_calls_count,
             reports_count, message_count, created_at)
         SELECT conversation_id, $4, turn, phase, input_tokens, output_tokens,
             cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count,
             message_count, $1
         FROM all_checkpoints WHERE conversation_id = $2 AND run_id = $3
         ORDER BY turn DESC LIMIT 1",
        now,
        conversation,
        from_run,
        new_run,
        claim.request_id.as_uuid(),
        claim.agent_fingerprint.as_deref(),
        claimed.replaced_fingerprint,
        budget_change_json(claim.budget_change.as_ref()),
        claim
            .budget_change
            .as_ref()
            .and_then(|c| budget_json(&c.to))
    )
    .execute(&mut *conn)
    .await
    .map_err(db("start resumed run"))?;
    Ok(fence(fence_at(claim.conversation_id, claimed.revision)?))
}

/// How many calls of the request's tool round at `turn` are answered.
async fn answered(conn: &mut PgConnection, claim: &RecoveryClaim, turn: i64) -> Result<i64, Error> {
    sqlx::query_scalar!(
        r#"SELECT COUNT(*) AS "n!: i64" FROM tool_calls
           WHERE conversation_id = $1 AND request_id = $2 AND turn = $3 AND status <> 'requested'"#,
        claim.conversation_id.as_uuid(),
        claim.request_id.as_uuid(),
        turn
    )
    .fetch_one(conn)
    .await
    .map_err(db("count answered calls"))
}
