//! The claim of an idle admission by a new request (`claim.sql`): one
//! `INSERT` into the `claims` view, alone or as a row of `claim_batches`,
//! whose trigger checks the request id, fences on the expected idle
//! revision and writes the request, its run, its input and the first
//! turn's write-ahead.
//!
//! Refusals: a known request id (`request exists`) is answered with that
//! request ([`ClaimOutcome::Existing`]); a request id of a deleted
//! conversation (`deleted`) is [`Error::Deleted`]; a moved admission
//! (`admission moved`) is explained by reading it (`diagnose`). A refused
//! claim writes nothing.

use serde::Serialize;
use serde_json::value::RawValue;
use sqlx::SqliteConnection;

use super::{admission_revision, diagnose, new_reports, raised, CheckpointColumns};
use super::{MessageColumns, Raised};
use crate::batch::Applied;
use crate::codec::{db, hex, now_ms, to_i64, to_json};
use turnstile_core::backend::{budget_json, Wanted};
use turnstile_core::checkpoint::LoopCheckpoint;
use turnstile_core::ids::Revision;
use turnstile_core::store::{ClaimOutcome, Fence, NewRequest};
use turnstile_core::{Error, StoreError};

/// A claim, its values ready for its statement (built on the caller's
/// task, so the writer only sends it).
pub(crate) struct ClaimStep {
    claim: NewRequest,
    input: MessageColumns,
    reports: Option<Box<RawValue>>,
}

/// A [`ClaimStep`] as its row of a shared statement (`batch.rs`).
#[derive(Serialize)]
struct ClaimRow<'a> {
    conversation: String,
    request: String,
    run: String,
    expected_revision: i64,
    input_sha256: String,
    agent_fingerprint: &'a str,
    now: i64,
    input_role: &'a str,
    input_content: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    input_meta: Option<&'a str>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    first_turn: Option<CheckpointColumns>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reports: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deadline_at: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    budget: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expected_created_at: Option<i64>,
}

impl ClaimStep {
    pub(crate) fn new(claim: NewRequest) -> Result<Self, Error> {
        let checkpoints: Vec<&LoopCheckpoint> = claim.first_turn.iter().collect();
        Ok(Self {
            input: MessageColumns::of(&claim.input)?,
            reports: new_reports(&checkpoints)?,
            claim,
        })
    }

    /// Claims as a statement of its own.
    pub(crate) async fn write(&self, tx: &mut SqliteConnection) -> Result<ClaimOutcome, Error> {
        // When the writer sends the step, not when it was queued.
        let now = now_ms();
        let claim = &self.claim;
        let conversation = claim.conversation_id.as_uuid();
        let request = claim.request_id.as_uuid();
        let run = claim.run_id.as_uuid();
        let hash = claim.input_sha256.0.to_vec();
        let expected = to_i64(claim.expected_revision.0);
        let input = &self.input;
        // The first turn's checkpoint, or all NULL (no checkpoint).
        let first = self.first_turn();
        let turn = first.map(|c| c.turn);
        let phase = first.map(|c| c.phase);
        let input_tokens = first.map(|c| c.input_tokens);
        let output_tokens = first.map(|c| c.output_tokens);
        let cache_read = first.map(|c| c.cache_read_tokens);
        let cache_write = first.map(|c| c.cache_write_tokens);
        let tool_calls = first.map(|c| c.tool_calls_count);
        let reports_count = first.map(|c| c.reports_count);
        let message_count = first.map(|c| c.message_count);
        let reports = self.reports.as_deref().map(RawValue::get);
        let budget = budget_json(&claim.budget);
        // Run to its end with no row returned (see `next_revision`).
        let claimed = sqlx::query!(
            "INSERT INTO claims (conversation_id, request_id, run_id, expected_revision,
                 input_sha256, agent_fingerprint, now, input_role, input_content, input_meta,
                 turn, phase, input_tokens, output_tokens, cache_read_tokens,
                 cache_write_tokens, tool_calls_count, reports_count, message_count, reports,
                 deadline_at, budget, expected_created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17,
                 ?18, ?19, ?20, ?21, ?22, ?23)",
            conversation,
            request,
            run,
            expected,
            hash,
            claim.agent_fingerprint,
            now,
            input.role,
            input.content,
            input.meta,
            turn,
            phase,
            input_tokens,
            output_tokens,
            cache_read,
            cache_write,
            tool_calls,
            reports_count,
            message_count,
            reports,
            claim.deadline_at,
            budget,
            claim.expected_created_at
        )
        .execute(&mut *tx)
        .await;
        match claimed {
            Ok(_) => {}
            Err(e) => {
                return match raised(&e) {
                    Some(Raised::RequestExists) => {
                        match crate::reads::load_request(&mut *tx, claim.request_id).await? {
                            Some(existing) => Ok(ClaimOutcome::Existing(existing)),
                            // A lone claim's explanation is read after its
                            // statement: another process may have deleted
                            // or pruned the request in between.
                            None => {
                                match crate::deletion::deleted_request(&mut *tx, claim.request_id)
                                    .await?
                                {
                                    Some(conversation_id) => {
                                        Err(Error::Deleted { conversation_id })
                                    }
                                    None => Err(Error::Store(
                                        StoreError::new(
                                            format!(
                                                "request {} went away while its claim was \
                                             answered; try again",
                                                claim.request_id
                                            ),
                                            None,
                                        )
                                        .busy(),
                                    )),
                                }
                            }
                        }
                    }
                    Some(Raised::Deleted) => Err(Error::Deleted {
                        conversation_id: crate::deletion::deleted_request(
                            &mut *tx,
                            claim.request_id,
                        )
                        .await?
                        .unwrap_or(claim.conversation_id),
                    }),
                    Some(Raised::AdmissionMoved) => Err(diagnose(
                        &mut *tx,
                        Wanted::Idle,
                        claim.conversation_id,
                        claim.request_id,
                        claim.expected_revision,
                    )
                    .await),
                    _ => Err(db("claim admission")(e)),
                };
            }
        }
        self.admitted_at(next_revision(claim.expected_revision)?)
    }

    /// The step as its row of a shared statement.
    pub(crate) fn row(&self) -> Result<String, Error> {
        let claim = &self.claim;
        to_json(&ClaimRow {
            conversation: hex(claim.conversation_id.as_uuid().as_bytes()),
            request: hex(claim.request_id.as_uuid().as_bytes()),
            run: hex(claim.run_id.as_uuid().as_bytes()),
            expected_revision: to_i64(claim.expected_revision.0),
            input_sha256: hex(&claim.input_sha256.0),
            agent_fingerprint: &claim.agent_fingerprint,
            now: now_ms(),
            input_role: &self.input.role,
            input_content: &self.input.content,
            input_meta: self.input.meta.as_deref(),
            first_turn: self.first_turn(),
            reports: self.reports.as_deref(),
            deadline_at: claim.deadline_at,
            budget: budget_json(&claim.budget),
            expected_created_at: claim.expected_created_at,
        })
    }

    /// The first turn's checkpoint as its columns, if the loop starts at once.
    fn first_turn(&self) -> Option<CheckpointColumns> {
        self.claim.first_turn.as_ref().map(CheckpointColumns::of)
    }

    /// The admitted claim's fence, from the revision its statement returned.
    pub(crate) fn admitted(&self, revision: i64) -> Result<ClaimOutcome, Error> {
        self.admitted_at(admission_revision(self.claim.conversation_id, revision)?)
    }

    fn admitted_at(&self, revision: Revision) -> Result<ClaimOutcome, Error> {
        let claim = &self.claim;
        Ok(ClaimOutcome::Admitted(Fence {
            conversation_id: claim.conversation_id,
            request_id: claim.request_id,
            run_id: claim.run_id,
            revision,
        }))
    }
}

/// The revision a claim's compare-and-swap at `expected` leaves: its
/// trigger sets `revision = revision + 1` where the revision is the
/// expected one. The claim's statement returns no row for it, so that it
/// runs with `execute`, one message back from sqlx's worker instead of a
/// row and then the statement's end (which must be read too: a lone
/// step's commit happens there).
fn next_revision(expected: Revision) -> Result<Revision, Error> {
    expected
        .0
        .checked_add(1)
        .map(Revision)
        .ok_or_else(|| Error::InvalidInput("a revision past the last one".into()))
}

/// Many claims of one group transaction as one statement: a row each of
/// `claim_batches` (`batch.rs`), returning each applied row's new revision.
pub(crate) async fn batch(
    conn: &mut SqliteConnection,
    rows: &str,
) -> Result<Vec<(i64, Applied)>, sqlx::Error> {
    let returned = sqlx::query!(
        r#"WITH steps AS MATERIALIZED (SELECT key, jsonb(value) AS fields FROM json_each(?1))
           INSERT INTO claim_batches (step, conversation_id, request_id, run_id,
               expected_revision, input_sha256, agent_fingerprint, now, input_role,
               input_content, input_meta, turn, phase, input_tokens, output_tokens,
               cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count,
               message_count, reports, deadline_at, budget, expected_created_at)
           SELECT key, unhex(fields ->> '$.conversation'), unhex(fields ->> '$.request'),
               unhex(fields ->> '$.run'), fields ->> '$.expected_revision',
               unhex(fields ->> '$.input_sha256'), fields ->> '$.agent_fingerprint',
               fields ->> '$.now', fields ->> '$.input_role', fields ->> '$.input_content',
               fields ->> '$.input_meta', fields ->> '$.turn', fields ->> '$.phase',
               fields ->> '$.input_tokens', fields ->> '$.output_tokens',
               fields ->> '$.cache_read_tokens', fields ->> '$.cache_write_tokens',
               fields ->> '$.tool_calls_count', fields ->> '$.reports_count',
               fields ->> '$.message_count', fields -> '$.reports', fields ->> '$.deadline_at',
               fields ->> '$.budget', fields ->> '$.expected_created_at'
           FROM steps
           RETURNING CAST(step AS INTEGER) AS "step!: i64",
               (SELECT revision FROM admissions
                WHERE conversation_id = claim_batches.conversation_id) AS "revision!: i64""#,
        rows
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(returned
        .into_iter()
        .map(|r| {
            (
                r.step,
                Applied::Claim {
                    revision: r.revision,
                },
            )
        })
        .collect())
}
