//! The claim of an idle admission by a new request: one statement that
//! checks the request id is not taken anywhere in the store, fences on the
//! expected idle revision (the compare-and-swap) and writes the request,
//! its id in `request_ids`, its first run when that carries the request's
//! id (in the request's own row, as the engine's first run does: migration
//! 0027), its input, the first turn's write-ahead when it starts now, and
//! its `admitted` event (numbered in the admission's own update, it costs
//! no second update of that row; kept in the request's row, 0028).
//!
//! A claim whose run has an id of its own, or whose first turn carries
//! verification reports, writes those rows with a second statement once
//! the first has admitted it, both in one transaction
//! ([`writes_beyond_its_row`]). So the first statement names only the four
//! tables every claim writes, and the conversation it reads: a table a
//! statement names costs the server its executor setup and its locks on
//! the table and each of its indexes even when no row goes there
//! (`docs/performance.md`, "A claim and a commit that name only the tables
//! they write").
//!
//! Refusals, explained by reads after the statement wrote nothing: a taken
//! request id is that request ([`ClaimOutcome::Existing`]; a retry whose
//! first attempt committed is admitted as that attempt was); a request id
//! of a deleted conversation is [`Error::Deleted`]; a moved admission is
//! explained by reading it (`diagnose`).

use sqlx::PgConnection;

use super::{diagnose, fence_at, first_new_report, CheckpointColumns, ReportColumns};
use crate::admission::load_admission;
use crate::codec::{db, now_ms, to_i64};
use turnstile_core::backend::{budget_json, message_columns, Wanted};
use turnstile_core::checkpoint::LoopCheckpoint;
use turnstile_core::store::{ClaimOutcome, Fence, NewRequest, RequestRecord, RequestStatus};
use turnstile_core::{Error, RunId};

/// The claim: the admission's compare-and-swap, only while the request id
/// is not taken anywhere in the store, records the request, its id in
/// `request_ids`, its first run, its input, the first turn's write-ahead
/// when it starts now and its event. A request id already taken is that
/// request, whatever its conversation. `in_transaction` is true for a claim
/// whose input names blobs; one that [`writes_beyond_its_row`] outside a
/// transaction opens its own.
pub(crate) async fn claim(
    conn: &mut PgConnection,
    claim: &NewRequest,
    retry: bool,
    in_transaction: bool,
) -> Result<ClaimOutcome, Error> {
    let beyond = writes_beyond_its_row(claim);
    if in_transaction || !beyond {
        return claim_in(conn, claim, retry, in_transaction, beyond).await;
    }
    let mut tx = sqlx::Connection::begin(&mut *conn)
        .await
        .map_err(db("begin the claim"))?;
    let outcome = claim_in(&mut tx, claim, retry, true, beyond).await?;
    tx.commit().await.map_err(db("commit the claim"))?;
    Ok(outcome)
}

/// The claim on `conn`, inside a transaction when `in_transaction`; with
/// its second statement when it `writes_beyond_its_row`.
async fn claim_in(
    conn: &mut PgConnection,
    claim: &NewRequest,
    retry: bool,
    in_transaction: bool,
    writes_beyond_its_row: bool,
) -> Result<ClaimOutcome, Error> {
    // A claim of the same id elsewhere that committed after this statement's
    // snapshot makes its `request_ids` insert fail: the second try sees it.
    // Inside a transaction the failed statement is undone to a savepoint, or
    // the transaction could not go on.
    let input = message_columns(&claim.input)?;
    let now = now_ms();
    let mut attempt = 0;
    let claimed = loop {
        if in_transaction {
            sqlx::query("SAVEPOINT claim")
                .execute(&mut *conn)
                .await
                .map_err(db("claim savepoint"))?;
        }
        match claim_statement(conn, claim, &input, now).await {
            Err(e) if attempt == 0 && crate::codec::is_unique_violation(&e) => {
                attempt += 1;
                if in_transaction {
                    sqlx::query("ROLLBACK TO SAVEPOINT claim")
                        .execute(&mut *conn)
                        .await
                        .map_err(db("claim savepoint"))?;
                }
            }
            result => break result.map_err(db("claim admission"))?,
        }
    };
    if let Some(revision) = claimed {
        if writes_beyond_its_row {
            run_and_reports(conn, claim, now).await?;
        }
        return Ok(ClaimOutcome::Admitted(Fence {
            conversation_id: claim.conversation_id,
            request_id: claim.request_id,
            run_id: claim.run_id,
            revision: fence_at(claim.conversation_id, revision)?,
        }));
    }
    if let Some(record) = crate::reads::load_request(conn, claim.request_id).await? {
        return existing(conn, claim, record, retry).await;
    }
    if let Some(conversation_id) = crate::deletion::deleted_request(conn, claim.request_id).await? {
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

/// Whether the claim writes rows beyond its request's row, id and input: a
/// run with an id of its own (its `runs` row and its first turn's
/// checkpoint), or verification reports with its first turn. Such a claim
/// runs in a transaction, with a second statement for them.
fn writes_beyond_its_row(claim: &NewRequest) -> bool {
    claim.run_id != RunId::first_of(claim.request_id)
        || claim
            .first_turn
            .as_ref()
            .is_some_and(|first| first_new_report(first).is_some())
}

/// The rows of an admitted claim that its statement leaves to this one, in
/// the same transaction: its run when that has an id of its own, with the
/// first turn's checkpoint, and the first turn's verification reports.
async fn run_and_reports(
    conn: &mut PgConnection,
    claim: &NewRequest,
    now: i64,
) -> Result<(), Error> {
    let first: Vec<&LoopCheckpoint> = claim.first_turn.iter().collect();
    let checkpoints = CheckpointColumns::of(&first);
    let reports = ReportColumns::of(&first);
    sqlx::query!(
        r#"WITH run AS (
               INSERT INTO runs (conversation_id, run_id, request_id, status, started_at)
               SELECT $1, $2, $3, 'running', $4 WHERE $2::uuid <> $3::uuid
           ), first_turn AS (
               INSERT INTO loop_checkpoints (conversation_id, run_id, turn, phase, input_tokens,
                   output_tokens, cache_read_tokens, cache_write_tokens, tool_calls_count,
                   reports_count, message_count, created_at)
               SELECT $1, $2, c.turn, c.phase, c.input, c.output, c.cache_read, c.cache_write,
                   c.tool_calls, c.reports, c.messages, $4
               FROM UNNEST($5::bigint[], $6::text[], $7::bigint[], $8::bigint[],
                   $9::bigint[], $10::bigint[], $11::bigint[], $12::bigint[], $13::bigint[])
                   AS c(turn, phase, input, output, cache_read, cache_write, tool_calls, reports,
                        messages)
               WHERE $2::uuid <> $3::uuid
           )
           INSERT INTO verification_reports (conversation_id, request_id, seq, turn, passed,
               detail)
           SELECT $1, $3, r.seq, r.turn, r.passed, r.detail
           FROM UNNEST($14::bigint[], $15::bigint[], $16::boolean[], $17::bytea[])
               AS r(seq, turn, passed, detail)"#,
        claim.conversation_id.as_uuid(),
        claim.run_id.as_uuid(),
        claim.request_id.as_uuid(),
        now,
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
    )
    .execute(&mut *conn)
    .await
    .map_err(db("claim's run and reports"))?;
    Ok(())
}

/// The claim's statement: the new revision, or `None` when the admission
/// was not idle at the expected revision or the id is taken.
async fn claim_statement(
    conn: &mut PgConnection,
    claim: &NewRequest,
    (role, content, meta): &(String, String, Option<String>),
    now: i64,
) -> Result<Option<i64>, sqlx::Error> {
    let first: Vec<&LoopCheckpoint> = claim.first_turn.iter().collect();
    let checkpoints = CheckpointColumns::of(&first);
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
                   summary_prompt_sha256 = NULL, revision = revision + 1, updated_at = $5,
                   event_seq = event_seq + 1
               WHERE conversation_id = $6 AND revision = $7 AND active_request_id IS NULL
                 AND NOT EXISTS (SELECT 1 FROM taken)
                 -- The conversation's creation, when the claim names it: one
                 -- created again under its id counts from revision 0.
                 AND ($26::bigint IS NULL OR EXISTS (
                     SELECT 1 FROM conversations
                     WHERE conversation_id = $6 AND created_at = $26))
               RETURNING revision, event_seq
           ), start AS (
               -- Where the request's messages begin: after the committed
               -- entries, which no read passes.
               SELECT c.transcript_length AS seq
               FROM claimed, conversations c WHERE c.conversation_id = $6
           ), reserved AS (
               INSERT INTO request_ids (request_id, conversation_id) SELECT $1, $6 FROM claimed
           ), request AS (
               -- A run that carries the request's id is folded into its
               -- row, with its first turn's write-ahead (migration 0027). The
               -- row holds the claim's event (0028), numbered by the update
               -- above: with where the request's messages begin, and its run
               -- when that has an id of its own.
               INSERT INTO requests (conversation_id, request_id, input_sha256, status, created_at,
                   deadline_at, budget, admitted_event, admitted_entry, admitted_run_id,
                   run_status, turn, phase, input_tokens, output_tokens, cache_read_tokens,
                   cache_write_tokens, tool_calls_count, reports_count, message_count,
                   checkpoint_at)
               SELECT $6, $1, $2, 'active', $5, $24, $25::text::jsonb, claimed.event_seq,
                   (SELECT seq FROM start), NULLIF($3, $1),
                   CASE WHEN $3 = $1 THEN 'running' END, c.turn, c.phase, c.input, c.output,
                   c.cache_read, c.cache_write, c.tool_calls, c.reports, c.messages,
                   CASE WHEN c.turn IS NOT NULL THEN $5 END
               FROM claimed LEFT JOIN UNNEST($15::bigint[], $16::text[], $17::bigint[],
                   $18::bigint[], $19::bigint[], $20::bigint[], $21::bigint[], $22::bigint[],
                   $23::bigint[])
                   AS c(turn, phase, input, output, cache_read, cache_write, tool_calls, reports,
                        messages) ON $3 = $1
           ), input AS (
               INSERT INTO transcript (conversation_id, seq, request_id, role, content, meta)
               SELECT $6, start.seq, $1, $8, $9, $10 FROM start
           )
           SELECT revision AS "revision!" FROM claimed"#,
        claim.request_id.as_uuid(),
        &claim.input_sha256.0[..],
        claim.run_id.as_uuid(),
        claim.agent_fingerprint,
        now,
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
        claim.deadline_at,
        budget_json(&claim.budget),
        claim.expected_created_at
    )
    .fetch_optional(&mut *conn)
    .await
}
