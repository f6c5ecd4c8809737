//! The recovery claim of an active admission by a new run of its request
//! (`recovery_claim.sql`): one `INSERT` into the `recovery_claims` view,
//! always alone, whose trigger fences on the expected active revision,
//! checks (when the claim rejects ambiguity) that the run being continued
//! is not in flight, and writes the takeover: the run superseded, the new
//! run (with the request's new budget when it changes it) and its copy of
//! the latest checkpoint.
//!
//! Refusals: a moved admission (`admission moved`) is explained by reading
//! it (`diagnose`); a run stopped mid-turn (`turn in flight`) is
//! [`Error::AmbiguousCheckpoint`], naming the turn.

use sqlx::SqliteConnection;

use super::{admission_revision, diagnose, raised, Raised};
use crate::codec::{db, now_ms, only_row, to_i64, to_json, Row};
use turnstile_core::backend::{budget_change_json, budget_json, Wanted};
use turnstile_core::checkpoint::CheckpointPhase;
use turnstile_core::store::{Fence, RecoveryClaim};
use turnstile_core::Error;

/// The phases a recovery that rejects ambiguity refuses to continue from;
/// with `retry_model_call`, a turn whose model call was in flight is not
/// among them.
fn in_flight_phases(retry_model_call: bool) -> Vec<&'static str> {
    use CheckpointPhase::*;
    // Every phase, so a new one is judged too: the match below stops the
    // build when one is added and not listed.
    let all = [
        TurnInFlight,
        ToolsInFlight,
        ModelPending,
        ToolsPending,
        Ready,
        Completed,
    ];
    let _listed = |phase: CheckpointPhase| match phase {
        TurnInFlight | ToolsInFlight | ModelPending | ToolsPending | Ready | Completed => (),
    };
    all.into_iter()
        .filter(|phase| phase.is_in_flight())
        .filter(|phase| !(retry_model_call && *phase == TurnInFlight))
        .map(CheckpointPhase::as_str)
        .collect()
}

/// The recovery claim's writes, inside the group transaction: one statement
/// (the `recovery_claims` view of `recovery_claim.sql`): the compare-and-swap,
/// under the write lock the check that the run being continued is not in
/// flight (when the claim rejects ambiguity), the run superseded, the new
/// run and its copy of the latest checkpoint.
pub(crate) async fn claim_recovery_in(
    tx: &mut SqliteConnection,
    claim: &RecoveryClaim,
) -> Result<Fence, Error> {
    let conversation = claim.conversation_id.as_uuid();
    let request = claim.request_id.as_uuid();
    let from_run = claim.from_run.as_uuid();
    let new_run = claim.new_run.as_uuid();
    let expected = to_i64(claim.expected_revision.0);
    let refuse = match claim.reject_in_flight {
        true => Some(to_json(&in_flight_phases(claim.retry_model_call))?),
        false => None,
    };
    let budget = claim
        .budget_change
        .as_ref()
        .and_then(|c| budget_json(&c.to));
    let budget_change = budget_change_json(claim.budget_change.as_ref());
    let resolved_turn = claim.resolved.map(|r| i64::from(r.turn));
    let resolved_answered = claim.resolved.map(|r| i64::from(r.answered));
    let now = now_ms();
    let claimed = sqlx::query_scalar!(
        r#"INSERT INTO recovery_claims (conversation_id, request_id, from_run, new_run,
               expected_revision, refuse_phases, now, agent_fingerprint, budget, budget_change,
               resolved_turn, resolved_answered)
           VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
           RETURNING (SELECT revision FROM admissions WHERE conversation_id = ?1)
               AS "revision!: i64""#,
        conversation,
        request,
        from_run,
        new_run,
        expected,
        refuse,
        now,
        claim.agent_fingerprint,
        budget,
        budget_change,
        resolved_turn,
        resolved_answered
    )
    .fetch_all(&mut *tx)
    .await
    .and_then(only_row);
    let revision = match claimed {
        Ok(revision) => revision,
        Err(e) => {
            return Err(match raised(&e) {
                Some(Raised::AdmissionMoved) => {
                    diagnose(
                        tx,
                        Wanted::Active,
                        claim.conversation_id,
                        claim.request_id,
                        claim.expected_revision,
                    )
                    .await
                }
                Some(Raised::TurnInFlight) => in_flight(tx, claim).await,
                _ => db("claim recovery")(e),
            });
        }
    };
    Ok(Fence {
        conversation_id: claim.conversation_id,
        request_id: claim.request_id,
        run_id: claim.new_run,
        revision: admission_revision(claim.conversation_id, revision)?,
    })
}

/// The refusal of a recovery whose run stopped mid-turn, naming the turn.
async fn in_flight(tx: &mut SqliteConnection, claim: &RecoveryClaim) -> Error {
    let from_run = claim.from_run.as_uuid();
    let latest = sqlx::query_scalar!(
        "SELECT turn FROM all_checkpoints WHERE run_id = ?1 ORDER BY turn DESC LIMIT 1",
        from_run
    )
    .fetch_one(&mut *tx)
    .await
    .map_err(db("read latest checkpoint"));
    let turn = match latest {
        Ok(turn) => turn,
        Err(e) => return e,
    };
    let key = format!("{}/{turn}", claim.from_run);
    match (Row {
        table: "loop_checkpoints",
        key: &key,
    })
    .u32("turn", turn)
    {
        Ok(turn) => Error::AmbiguousCheckpoint {
            run_id: claim.from_run,
            turn,
        },
        Err(e) => e,
    }
}
