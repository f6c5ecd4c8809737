//! Conversations and ownership changes: claim, recovery claim, abandon.
//! Each ownership change is one compare-and-swap on `admissions.revision`.

use sqlx::sqlite::SqlitePool;
use sqlx::SqliteConnection;

use super::codec::{db, now_ms, to_i64, Row};
use super::turns::{insert_messages, save_checkpoints};
use turnstile_core::checkpoint::CheckpointPhase;
use turnstile_core::ids::{ConversationId, Namespace, RequestId, Revision};
use turnstile_core::message::Usage;
use turnstile_core::store::columns::{cas_refusal, AdmissionRow, Wanted};
use turnstile_core::store::{
    Admission, ClaimOutcome, Conversation, Fence, NewRequest, RecoveryClaim,
};
use turnstile_core::Error;

pub(super) async fn load_recovery_usage(
    reader: &SqlitePool,
    request_id: RequestId,
) -> Result<Usage, Error> {
    let request = request_id.as_uuid();
    let row = sqlx::query!(
        "SELECT input_tokens, output_tokens, cache_read_tokens, cache_write_tokens
         FROM admissions WHERE active_request_id = ?1",
        request
    )
    .fetch_optional(reader)
    .await
    .map_err(db("read recovery usage"))?;
    match row {
        Some(r) => Row {
            table: "admissions",
            key: &request_id,
        }
        .usage(
            r.input_tokens,
            r.output_tokens,
            r.cache_read_tokens,
            r.cache_write_tokens,
        ),
        None => Err(Error::NotActive { request_id }),
    }
}

/// A conversation and its idle admission, created unless they exist,
/// inside the group transaction.
pub(super) async fn ensure_conversation_in(
    tx: &mut SqliteConnection,
    namespace: &Namespace,
    id: ConversationId,
) -> Result<Conversation, Error> {
    let uuid = id.as_uuid();
    let ns = namespace.as_str();
    let now = now_ms();
    sqlx::query!(
        "INSERT INTO conversations (id, namespace, version, created_at) VALUES (?1, ?2, 0, ?3)
             ON CONFLICT (id) DO NOTHING",
        uuid,
        ns,
        now
    )
    .execute(&mut *tx)
    .await
    .map_err(db("create conversation"))?;
    sqlx::query!(
        "INSERT INTO admissions (conversation_id, revision, updated_at) VALUES (?1, 0, ?2)
             ON CONFLICT (conversation_id) DO NOTHING",
        uuid,
        now
    )
    .execute(&mut *tx)
    .await
    .map_err(db("create admission"))?;
    load_conversation(tx, namespace, id).await
}

pub(super) async fn load_conversation(
    conn: &mut sqlx::SqliteConnection,
    namespace: &Namespace,
    id: ConversationId,
) -> Result<Conversation, Error> {
    let uuid = id.as_uuid();
    let row = sqlx::query!(
        "SELECT namespace, version, created_at FROM conversations WHERE id = ?1",
        uuid
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("load conversation"))?
    .ok_or_else(|| Error::NotFound {
        what: "conversation",
        id: id.to_string(),
    })?;
    // Another namespace's conversation is reported as a mismatch without any
    // of its content.
    if row.namespace != namespace.as_str() {
        return Err(Error::NamespaceMismatch {
            conversation_id: id,
            namespace: namespace.clone(),
        });
    }
    let key = Row {
        table: "conversations",
        key: &id,
    };
    Ok(Conversation {
        id,
        namespace: namespace.clone(),
        version: key.u64("version", row.version)?,
        created_at: row.created_at,
    })
}

pub(super) async fn load_admission(
    conn: &mut sqlx::SqliteConnection,
    conversation_id: ConversationId,
) -> Result<Admission, Error> {
    let uuid = conversation_id.as_uuid();
    let row = sqlx::query!(
        "SELECT revision, active_request_id, input_sha256, run_id, agent_fingerprint,
                input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
                summary_passes, summary_from_seq, summary_through_seq, summary_version,
                summary_prompt_sha256
         FROM admissions WHERE conversation_id = ?1",
        uuid
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("load admission"))?
    .ok_or_else(|| Error::NotFound {
        what: "conversation",
        id: conversation_id.to_string(),
    })?;
    let key = Row {
        table: "admissions",
        key: &conversation_id,
    };
    let uuid =
        |column: &str, bytes: Option<Vec<u8>>| bytes.map(|b| key.uuid(column, &b)).transpose();
    AdmissionRow {
        revision: row.revision,
        active_request_id: uuid("active_request_id", row.active_request_id)?,
        input_sha256: row.input_sha256,
        run_id: uuid("run_id", row.run_id)?,
        agent_fingerprint: row.agent_fingerprint,
        input_tokens: row.input_tokens,
        output_tokens: row.output_tokens,
        cache_read_tokens: row.cache_read_tokens,
        cache_write_tokens: row.cache_write_tokens,
        summary_passes: row.summary_passes,
        summary_from_seq: row.summary_from_seq,
        summary_through_seq: row.summary_through_seq,
        summary_version: row.summary_version,
        summary_prompt_sha256: row.summary_prompt_sha256,
    }
    .decode(conversation_id)
}

/// Explains why a compare-and-swap on the admission matched no row.
async fn diagnose(
    tx: &mut SqliteConnection,
    wanted: Wanted,
    conversation_id: ConversationId,
    request_id: RequestId,
    expected: Revision,
) -> Error {
    match load_admission(tx, conversation_id).await {
        Ok(admission) => cas_refusal(admission, wanted, request_id, expected),
        Err(e) => e,
    }
}

/// The claim's writes, inside the group transaction.
pub(super) async fn claim_in(
    tx: &mut SqliteConnection,
    claim: &NewRequest,
) -> Result<ClaimOutcome, Error> {
    if let Some(existing) = super::reads::load_request(&mut *tx, claim.request_id).await? {
        return Ok(ClaimOutcome::Existing(existing));
    }
    let conversation = claim.conversation_id.as_uuid();
    let request = claim.request_id.as_uuid();
    let run = claim.run_id.as_uuid();
    let hash = claim.input_sha256.0.to_vec();
    let expected = to_i64(claim.expected_revision.0);
    let now = now_ms();
    let claimed = sqlx::query_scalar!(
        r#"UPDATE admissions
           SET active_request_id = ?1, input_sha256 = ?2, run_id = ?3, agent_fingerprint = ?4,
               input_tokens = 0, output_tokens = 0, cache_read_tokens = 0, cache_write_tokens = 0,
               summary_passes = 0, summary_from_seq = NULL, summary_through_seq = NULL,
               summary_version = NULL, summary_prompt_sha256 = NULL,
               revision = revision + 1, updated_at = ?5
           WHERE conversation_id = ?6 AND revision = ?7 AND active_request_id IS NULL
           RETURNING revision AS "revision!: i64""#,
        request,
        hash,
        run,
        claim.agent_fingerprint,
        now,
        conversation,
        expected
    )
    .fetch_optional(&mut *tx)
    .await
    .map_err(db("claim admission"))?;
    let Some(revision) = claimed else {
        return Err(diagnose(
            &mut *tx,
            Wanted::Idle,
            claim.conversation_id,
            claim.request_id,
            claim.expected_revision,
        )
        .await);
    };
    sqlx::query!(
        "INSERT INTO requests (request_id, conversation_id, input_sha256, status, created_at)
         VALUES (?1, ?2, ?3, 'active', ?4)",
        request,
        conversation,
        hash,
        now
    )
    .execute(&mut *tx)
    .await
    .map_err(db("insert request"))?;
    sqlx::query!(
        "INSERT INTO runs (run_id, request_id, status, started_at) VALUES (?1, ?2, 'running', ?3)",
        run,
        request,
        now
    )
    .execute(&mut *tx)
    .await
    .map_err(db("insert run"))?;
    let fence = Fence {
        conversation_id: claim.conversation_id,
        request_id: claim.request_id,
        run_id: claim.run_id,
        revision: Revision(
            Row {
                table: "admissions",
                key: &claim.conversation_id,
            }
            .u64("revision", revision)?,
        ),
    };
    // The input is the request's first message. No checkpoint yet: a run
    // without one is at its start.
    insert_messages(&mut *tx, &fence, 0, 0, std::slice::from_ref(&claim.input)).await?;
    if let Some(first_turn) = &claim.first_turn {
        save_checkpoints(&mut *tx, &fence, &[first_turn]).await?;
    }
    Ok(ClaimOutcome::Admitted(fence))
}

/// The recovery claim's writes, inside the group transaction.
pub(super) async fn claim_recovery_in(
    tx: &mut SqliteConnection,
    claim: &RecoveryClaim,
) -> Result<Fence, Error> {
    let conversation = claim.conversation_id.as_uuid();
    let request = claim.request_id.as_uuid();
    let from_run = claim.from_run.as_uuid();
    let new_run = claim.new_run.as_uuid();
    let expected = to_i64(claim.expected_revision.0);
    let now = now_ms();
    let claimed = sqlx::query_scalar!(
        r#"UPDATE admissions SET run_id = ?1, revision = revision + 1, updated_at = ?2
           WHERE conversation_id = ?3 AND revision = ?4 AND active_request_id = ?5 AND run_id = ?6
           RETURNING revision AS "revision!: i64""#,
        new_run,
        now,
        conversation,
        expected,
        request,
        from_run
    )
    .fetch_optional(&mut *tx)
    .await
    .map_err(db("claim recovery"))?;
    let Some(revision) = claimed else {
        return Err(diagnose(
            tx,
            Wanted::Active,
            claim.conversation_id,
            claim.request_id,
            claim.expected_revision,
        )
        .await);
    };
    // Under the write lock, so the run being continued cannot move on
    // between this check and the commit; an error rolls the claim back.
    if claim.reject_in_flight {
        let latest = sqlx::query!(
            "SELECT turn, phase FROM loop_checkpoints WHERE run_id = ?1 ORDER BY turn DESC LIMIT 1",
            from_run
        )
        .fetch_optional(&mut *tx)
        .await
        .map_err(db("read latest checkpoint"))?;
        if let Some(latest) = latest {
            let in_flight =
                CheckpointPhase::parse(&latest.phase).is_some_and(CheckpointPhase::is_in_flight);
            if in_flight {
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
    sqlx::query!(
        "UPDATE runs SET status = 'superseded', ended_at = COALESCE(ended_at, ?1)
         WHERE run_id = ?2 AND status IN ('running', 'failed')",
        now,
        from_run
    )
    .execute(&mut *tx)
    .await
    .map_err(db("supersede run"))?;
    sqlx::query!(
        "INSERT INTO runs (run_id, request_id, resumed_from, status, started_at)
         VALUES (?1, ?2, ?3, 'running', ?4)",
        new_run,
        request,
        from_run,
        now
    )
    .execute(&mut *tx)
    .await
    .map_err(db("insert resumed run"))?;
    // The new run starts from a copy of the latest checkpoint of the run it
    // continues: one small row, no messages copied. (A run that never
    // checkpointed has nothing to copy: the new run starts at the start.)
    sqlx::query!(
        "INSERT INTO loop_checkpoints (run_id, turn, phase, input_tokens, output_tokens,
             cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count,
             message_count, created_at)
         SELECT ?1, turn, phase, input_tokens, output_tokens, cache_read_tokens,
             cache_write_tokens, tool_calls_count, reports_count, message_count, ?2
         FROM loop_checkpoints WHERE run_id = ?3 ORDER BY turn DESC LIMIT 1",
        new_run,
        now,
        from_run
    )
    .execute(&mut *tx)
    .await
    .map_err(db("seed resumed checkpoint"))?;
    Ok(Fence {
        conversation_id: claim.conversation_id,
        request_id: claim.request_id,
        run_id: claim.new_run,
        revision: Revision(
            Row {
                table: "admissions",
                key: &claim.conversation_id,
            }
            .u64("revision", revision)?,
        ),
    })
}

/// The abandon's writes, inside the group transaction.
pub(super) async fn abandon_in(
    tx: &mut SqliteConnection,
    conversation_id: ConversationId,
    request_id: RequestId,
    expected_revision: Revision,
) -> Result<Revision, Error> {
    let conversation = conversation_id.as_uuid();
    let request = request_id.as_uuid();
    let expected = to_i64(expected_revision.0);
    let now = now_ms();
    // The owning run first, while the admission still names it; if the
    // compare-and-swap below fails, the transaction is rolled back.
    sqlx::query!(
        "UPDATE runs SET status = 'abandoned', ended_at = COALESCE(ended_at, ?1)
         WHERE run_id = (SELECT run_id FROM admissions
                         WHERE conversation_id = ?2 AND revision = ?3 AND active_request_id = ?4)
           AND status IN ('running', 'failed')",
        now,
        conversation,
        expected,
        request
    )
    .execute(&mut *tx)
    .await
    .map_err(db("abandon run"))?;
    let released = sqlx::query_scalar!(
        r#"UPDATE admissions
           SET active_request_id = NULL, input_sha256 = NULL, run_id = NULL, agent_fingerprint = NULL,
               input_tokens = 0, output_tokens = 0, cache_read_tokens = 0, cache_write_tokens = 0,
               summary_passes = 0, summary_from_seq = NULL, summary_through_seq = NULL,
               summary_version = NULL, summary_prompt_sha256 = NULL,
               revision = revision + 1, updated_at = ?1
           WHERE conversation_id = ?2 AND revision = ?3 AND active_request_id = ?4
           RETURNING revision AS "revision!: i64""#,
        now,
        conversation,
        expected,
        request
    )
    .fetch_optional(&mut *tx)
    .await
    .map_err(db("abandon admission"))?;
    let Some(revision) = released else {
        return Err(diagnose(
            tx,
            Wanted::Active,
            conversation_id,
            request_id,
            expected_revision,
        )
        .await);
    };
    sqlx::query!(
        "UPDATE requests SET status = 'abandoned', completed_at = ?1 WHERE request_id = ?2",
        now,
        request
    )
    .execute(&mut *tx)
    .await
    .map_err(db("abandon request"))?;
    Ok(Revision(
        Row {
            table: "admissions",
            key: &conversation_id,
        }
        .u64("revision", revision)?,
    ))
}
