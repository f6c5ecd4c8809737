//! Conversations and ownership changes: claim, recovery claim, abandon.
//! Each ownership change is one compare-and-swap on `admissions.revision`,
//! decided by its row count.

use sqlx::PgConnection;
use uuid::Uuid;

use super::codec::{db, now_ms, to_i64, Row};
use super::turns::{CheckpointColumns, ReportColumns};
use turnstile_core::backend::{cas_refusal, message_columns, AdmissionRow, Wanted};
use turnstile_core::checkpoint::{CheckpointPhase, LoopCheckpoint};
use turnstile_core::ids::{ConversationId, Namespace, RequestId, Revision};
use turnstile_core::message::Usage;
use turnstile_core::store::{
    Admission, ClaimOutcome, Conversation, Fence, NewRequest, RecoveryClaim, RequestRecord,
    RequestStatus,
};
use turnstile_core::Error;

pub(crate) async fn load_recovery_usage(
    conn: &mut PgConnection,
    request_id: RequestId,
) -> Result<Usage, Error> {
    let row = sqlx::query!(
        "SELECT a.input_tokens, a.output_tokens, a.cache_read_tokens, a.cache_write_tokens
         FROM request_ids k JOIN admissions a ON a.conversation_id = k.conversation_id
         WHERE k.request_id = $1 AND a.active_request_id = $1",
        request_id.as_uuid()
    )
    .fetch_optional(&mut *conn)
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

/// A conversation and its idle admission, created together unless they
/// exist: one statement.
pub(crate) async fn ensure_conversation(
    conn: &mut PgConnection,
    namespace: &Namespace,
    id: ConversationId,
) -> Result<Conversation, Error> {
    // Twice at most: a concurrent creator's row, committed after this
    // statement's snapshot, is seen by the second.
    for _ in 0..2 {
        let row = sqlx::query!(
            r#"WITH created AS (
                   INSERT INTO conversations (conversation_id, namespace, version, created_at)
                   VALUES ($1, $2, 0, $3) ON CONFLICT DO NOTHING
                   RETURNING conversation_id, namespace, version, created_at
               ), admission AS (
                   INSERT INTO admissions (conversation_id, revision, updated_at)
                   SELECT conversation_id, 0, $3 FROM created
               )
               SELECT namespace AS "namespace!", version AS "version!", created_at AS "created_at!"
               FROM created
               UNION ALL
               SELECT namespace, version, created_at FROM conversations WHERE conversation_id = $1"#,
            id.as_uuid(),
            namespace.as_str(),
            now_ms()
        )
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| match super::deletion::is_deleted(&e) {
            true => Error::Deleted {
                conversation_id: id,
            },
            false => db("create conversation")(e),
        })?;
        if let Some(row) = row {
            return conversation_of(namespace, id, &row.namespace, row.version, row.created_at);
        }
    }
    load_conversation(conn, namespace, id).await
}

pub(crate) async fn load_conversation(
    conn: &mut PgConnection,
    namespace: &Namespace,
    id: ConversationId,
) -> Result<Conversation, Error> {
    let row = sqlx::query!(
        "SELECT namespace, version, created_at FROM conversations WHERE conversation_id = $1",
        id.as_uuid()
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("load conversation"))?;
    let Some(row) = row else {
        return Err(super::deletion::missing(conn, Some(namespace), id).await);
    };
    conversation_of(namespace, id, &row.namespace, row.version, row.created_at)
}

pub(crate) fn conversation_of(
    namespace: &Namespace,
    id: ConversationId,
    stored_namespace: &str,
    version: i64,
    created_at: i64,
) -> Result<Conversation, Error> {
    // Another namespace's conversation is reported as a mismatch without any
    // of its content.
    if stored_namespace != namespace.as_str() {
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
        version: key.u64("version", version)?,
        created_at,
    })
}

pub(crate) async fn load_admission(
    conn: &mut PgConnection,
    conversation_id: ConversationId,
) -> Result<Admission, Error> {
    let row = sqlx::query_as!(
        AdmissionRow,
        "SELECT revision, active_request_id, input_sha256, run_id, agent_fingerprint,
                input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
                summary_passes, summary_from_seq, summary_through_seq, summary_version,
                summary_prompt_sha256
         FROM admissions WHERE conversation_id = $1",
        conversation_id.as_uuid()
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("load admission"))?;
    match row {
        Some(row) => row.decode(conversation_id),
        None => Err(super::deletion::missing(conn, None, conversation_id).await),
    }
}

/// Explains why a compare-and-swap on the admission matched no row.
async fn diagnose(
    conn: &mut PgConnection,
    wanted: Wanted,
    conversation_id: ConversationId,
    request_id: RequestId,
    expected: Revision,
) -> Error {
    match load_admission(conn, conversation_id).await {
        Ok(admission) => cas_refusal(admission, wanted, request_id, expected),
        Err(e) => e,
    }
}

fn fence_at(conversation_id: ConversationId, revision: i64) -> Result<Revision, Error> {
    Row {
        table: "admissions",
        key: &conversation_id,
    }
    .u64("revision", revision)
    .map(Revision)
}

/// The claim as one statement: the admission's compare-and-swap, only
/// while the request id is not taken anywhere in the store, records the
/// request, its id in `request_ids`, its first run, its input and the first
/// turn's write-ahead when it starts now. A request id already taken is that
/// request, whatever its conversation.
pub(crate) async fn claim(
    conn: &mut PgConnection,
    claim: &NewRequest,
    retry: bool,
) -> Result<ClaimOutcome, Error> {
    // A claim of the same id elsewhere that committed after this statement's
    // snapshot makes its `request_ids` insert fail: the second try sees it.
    let input = message_columns(&claim.input)?;
    let mut attempt = 0;
    let claimed = loop {
        match claim_statement(conn, claim, &input).await {
            Err(e) if attempt == 0 && super::codec::is_unique_violation(&e) => attempt += 1,
            result => break result.map_err(db("claim admission"))?,
        }
    };
    if let Some(revision) = claimed {
        return Ok(ClaimOutcome::Admitted(Fence {
            conversation_id: claim.conversation_id,
            request_id: claim.request_id,
            run_id: claim.run_id,
            revision: fence_at(claim.conversation_id, revision)?,
        }));
    }
    if let Some(record) = super::reads::load_request(conn, claim.request_id).await? {
        return existing(conn, claim, record, retry).await;
    }
    if let Some(conversation_id) = super::deletion::deleted_request(conn, claim.request_id).await? {
        return Err(Error::Deleted { conversation_id });
    }
    Err(diagnose(
        conn,
        Wanted::Idle,
        claim.conversation_id,
        claim.request_id,
        claim.expected_revision,
    )
    .await)
}

/// The claim's one statement: the new revision, or `None` when the
/// admission was not idle at the expected revision or the id is taken.
async fn claim_statement(
    conn: &mut PgConnection,
    claim: &NewRequest,
    (role, content, meta): &(String, String, Option<String>),
) -> Result<Option<i64>, sqlx::Error> {
    let first: Vec<&LoopCheckpoint> = claim.first_turn.iter().collect();
    let checkpoints = CheckpointColumns::of(&first);
    let reports = ReportColumns::of(&first);
    let usage = claim
        .first_turn
        .as_ref()
        .map(|c| c.usage)
        .unwrap_or_default();
    sqlx::query_scalar!(
        r#"WITH taken AS (
               SELECT 1 FROM request_ids WHERE request_id = $1
           ), claimed AS (
               UPDATE admissions
               SET active_request_id = $1, input_sha256 = $2, run_id = $3, agent_fingerprint = $4,
                   input_tokens = $11, output_tokens = $12, cache_read_tokens = $13,
                   cache_write_tokens = $14, summary_passes = 0, summary_from_seq = NULL,
                   summary_through_seq = NULL, summary_version = NULL,
                   summary_prompt_sha256 = NULL, revision = revision + 1, updated_at = $5
               WHERE conversation_id = $6 AND revision = $7 AND active_request_id IS NULL
                 AND NOT EXISTS (SELECT 1 FROM taken)
               RETURNING revision
           ), reserved AS (
               INSERT INTO request_ids (request_id, conversation_id) SELECT $1, $6 FROM claimed
           ), request AS (
               INSERT INTO requests (conversation_id, request_id, input_sha256, status, created_at,
                   deadline_at)
               SELECT $6, $1, $2, 'active', $5, $28 FROM claimed
           ), run AS (
               INSERT INTO runs (conversation_id, run_id, request_id, status, started_at)
               SELECT $6, $3, $1, 'running', $5 FROM claimed
           ), input AS (
               INSERT INTO run_messages (conversation_id, request_id, seq, run_id, turn, role,
                   content, meta)
               SELECT $6, $1, 0, $3, 0, $8, $9, $10 FROM claimed
           ), first_turn AS (
               INSERT INTO loop_checkpoints (conversation_id, run_id, turn, phase, input_tokens,
                   output_tokens, cache_read_tokens, cache_write_tokens, tool_calls_count,
                   reports_count, message_count, created_at)
               SELECT $6, $3, c.turn, c.phase, c.input, c.output, c.cache_read, c.cache_write,
                   c.tool_calls, c.reports, c.messages, $5
               FROM claimed, UNNEST($15::bigint[], $16::text[], $17::bigint[], $18::bigint[],
                   $19::bigint[], $20::bigint[], $21::bigint[], $22::bigint[], $23::bigint[])
                   AS c(turn, phase, input, output, cache_read, cache_write, tool_calls, reports,
                        messages)
           ), reports AS (
               INSERT INTO verification_reports (conversation_id, request_id, seq, turn, passed,
                   detail)
               SELECT $6, $1, r.seq, r.turn, r.passed, r.detail
               FROM claimed, UNNEST($24::bigint[], $25::bigint[], $26::boolean[], $27::bytea[])
                   AS r(seq, turn, passed, detail)
           )
           SELECT revision AS "revision!" FROM claimed"#,
        claim.request_id.as_uuid(),
        &claim.input_sha256.0[..],
        claim.run_id.as_uuid(),
        claim.agent_fingerprint,
        now_ms(),
        claim.conversation_id.as_uuid(),
        to_i64(claim.expected_revision.0),
        role,
        content.as_bytes(),
        meta.as_deref(),
        to_i64(usage.input_tokens),
        to_i64(usage.output_tokens),
        to_i64(usage.cache_read_tokens),
        to_i64(usage.cache_write_tokens),
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
        claim.deadline_at
    )
    .fetch_optional(&mut *conn)
    .await
}

/// A claim of a request id that is taken: the request as stored. A retry
/// whose first attempt committed without its acknowledgement finds its own
/// run holding the admission, and is admitted as that attempt was.
async fn existing(
    conn: &mut PgConnection,
    claim: &NewRequest,
    record: RequestRecord,
    retry: bool,
) -> Result<ClaimOutcome, Error> {
    if retry && record.status == RequestStatus::Active {
        let admission = load_admission(conn, record.conversation_id).await?;
        if admission
            .active
            .is_some_and(|a| a.request_id == claim.request_id && a.run_id == claim.run_id)
        {
            return Ok(ClaimOutcome::Admitted(Fence {
                conversation_id: record.conversation_id,
                request_id: claim.request_id,
                run_id: claim.run_id,
                revision: admission.revision,
            }));
        }
    }
    Ok(ClaimOutcome::Existing(record))
}

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
            "SELECT turn, phase FROM loop_checkpoints WHERE conversation_id = $1 AND run_id = $2
             ORDER BY turn DESC LIMIT 1",
            conversation,
            from_run
        )
        .fetch_optional(&mut *conn)
        .await
        .map_err(db("read latest checkpoint"))?;
        if let Some(latest) = latest {
            if CheckpointPhase::parse(&latest.phase).is_some_and(CheckpointPhase::is_in_flight) {
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
    // the start if it never checkpointed.
    sqlx::query!(
        "WITH superseded AS (
             UPDATE runs SET status = 'superseded', ended_at = COALESCE(ended_at, $1)
             WHERE conversation_id = $2 AND run_id = $3 AND status IN ('running', 'failed')
         ), resumed AS (
             INSERT INTO runs (conversation_id, run_id, request_id, resumed_from, status,
                 started_at, agent_fingerprint, replaced_fingerprint)
             VALUES ($2, $4, $5, $3, 'running', $1, $6::text,
                 CASE WHEN $6::text IS NOT NULL THEN $7::text END)
         )
         INSERT INTO loop_checkpoints (conversation_id, run_id, turn, phase, input_tokens,
             output_tokens, cache_read_tokens, cache_write_tokens, tool_calls_count,
             reports_count, message_count, created_at)
         SELECT conversation_id, $4, turn, phase, input_tokens, output_tokens,
             cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count,
             message_count, $1
         FROM loop_checkpoints WHERE conversation_id = $2 AND run_id = $3
         ORDER BY turn DESC LIMIT 1",
        now,
        conversation,
        from_run,
        new_run,
        claim.request_id.as_uuid(),
        claim.agent_fingerprint.as_deref(),
        claimed.replaced_fingerprint
    )
    .execute(&mut *conn)
    .await
    .map_err(db("start resumed run"))?;
    Ok(fence(fence_at(claim.conversation_id, claimed.revision)?))
}

/// The abandon: one statement that releases the admission and marks its
/// run and request abandoned, by `token` (one per call, the same for all
/// its attempts).
pub(crate) async fn abandon(
    conn: &mut PgConnection,
    conversation_id: ConversationId,
    request_id: RequestId,
    expected_revision: Revision,
    token: Uuid,
    retry: bool,
) -> Result<Revision, Error> {
    let conversation = conversation_id.as_uuid();
    let request = request_id.as_uuid();
    let released = sqlx::query_scalar!(
        r#"WITH held AS (
               SELECT run_id FROM admissions
               WHERE conversation_id = $2 AND revision = $3 AND active_request_id = $4
           ), released AS (
               UPDATE admissions
               SET active_request_id = NULL, input_sha256 = NULL, run_id = NULL,
                   agent_fingerprint = NULL, input_tokens = 0, output_tokens = 0,
                   cache_read_tokens = 0, cache_write_tokens = 0, summary_passes = 0,
                   summary_from_seq = NULL, summary_through_seq = NULL, summary_version = NULL,
                   summary_prompt_sha256 = NULL, revision = revision + 1, updated_at = $1
               WHERE conversation_id = $2 AND revision = $3 AND active_request_id = $4
               RETURNING revision
           ), run AS (
               UPDATE runs SET status = 'abandoned', ended_at = COALESCE(ended_at, $1)
               WHERE conversation_id = $2 AND run_id = (SELECT run_id FROM held)
                 AND status IN ('running', 'failed') AND EXISTS (SELECT 1 FROM released)
           ), request AS (
               UPDATE requests SET status = 'abandoned', completed_at = $1, abandoned_by = $5
               WHERE conversation_id = $2 AND request_id = $4 AND EXISTS (SELECT 1 FROM released)
           )
           SELECT revision AS "revision!" FROM released"#,
        now_ms(),
        conversation,
        to_i64(expected_revision.0),
        request,
        token
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("abandon"))?;
    if let Some(revision) = released {
        return fence_at(conversation_id, revision);
    }
    if retry {
        // This call's first attempt released it (from `expected_revision`),
        // and its acknowledgement was lost.
        let mine = sqlx::query_scalar!(
            r#"SELECT EXISTS (SELECT 1 FROM requests
                   WHERE conversation_id = $1 AND request_id = $2 AND abandoned_by = $3)
               AS "mine!""#,
            conversation,
            request,
            token
        )
        .fetch_one(&mut *conn)
        .await
        .map_err(db("read abandon"))?;
        if mine {
            return Ok(Revision(expected_revision.0 + 1));
        }
    }
    Err(diagnose(
        conn,
        Wanted::Active,
        conversation_id,
        request_id,
        expected_revision,
    )
    .await)
}
