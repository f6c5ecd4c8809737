//! Conversations and ownership changes: claim, recovery claim, abandon.
//! Each ownership change is one compare-and-swap on `admissions.revision`.

use super::read_connections::ReadConnections;
use sqlx::SqliteConnection;

use super::codec::{db, hex, now_ms, only_row, to_i64, to_json, Row};
use super::steps::{raised, Raised};
use serde::Serialize;
use serde_json::value::RawValue;

use super::step_columns::{CheckpointColumns, MessageColumns};
use super::turns::new_reports;
use turnstile_core::backend::{cas_refusal, AdmissionRow, Wanted};
use turnstile_core::checkpoint::{CheckpointPhase, LoopCheckpoint};
use turnstile_core::ids::{ConversationId, Namespace, RequestId, Revision};
use turnstile_core::message::Usage;
use turnstile_core::store::{
    Admission, ClaimOutcome, Conversation, Fence, NewRequest, RecoveryClaim,
};
use turnstile_core::{Error, StoreError};

pub(super) async fn load_recovery_usage(
    reader: &ReadConnections,
    request_id: RequestId,
) -> Result<Usage, Error> {
    let mut conn = reader.acquire().await?;
    let request = request_id.as_uuid();
    let row = sqlx::query!(
        "SELECT input_tokens, output_tokens, cache_read_tokens, cache_write_tokens
         FROM admissions WHERE active_request_id = ?1",
        request
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

/// A conversation and its idle admission, created unless they exist,
/// inside the group transaction: one statement, which returns the
/// conversation as stored.
pub(super) async fn ensure_conversation_in(
    tx: &mut SqliteConnection,
    namespace: &Namespace,
    id: ConversationId,
) -> Result<Conversation, Error> {
    let uuid = id.as_uuid();
    let ns = namespace.as_str();
    let now = now_ms();
    let row = sqlx::query!(
        r#"INSERT INTO conversation_opens (id, namespace, now) VALUES (?1, ?2, ?3)
           RETURNING (SELECT namespace FROM conversations WHERE id = ?1) AS "namespace!: String",
               (SELECT version FROM conversations WHERE id = ?1) AS "version!: i64",
               (SELECT created_at FROM conversations WHERE id = ?1) AS "created_at!: i64""#,
        uuid,
        ns,
        now
    )
    .fetch_all(&mut *tx)
    .await
    .and_then(only_row)
    .map_err(|e| match raised(&e) {
        Some(Raised::Deleted) => Error::Deleted {
            conversation_id: id,
        },
        _ => db("create conversation")(e),
    })?;
    conversation_of(namespace, id, row.namespace, row.version, row.created_at)
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
    .map_err(db("load conversation"))?;
    let Some(row) = row else {
        return Err(super::deletion::missing(conn, Some(namespace), id).await);
    };
    conversation_of(namespace, id, row.namespace, row.version, row.created_at)
}

/// A conversation row, read in `namespace`.
pub(super) fn conversation_of(
    namespace: &Namespace,
    id: ConversationId,
    stored_namespace: String,
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

pub(super) async fn load_admission(
    conn: &mut sqlx::SqliteConnection,
    conversation_id: ConversationId,
) -> Result<Admission, Error> {
    let uuid = conversation_id.as_uuid();
    let row = sqlx::query_as!(
        AdmissionColumns,
        "SELECT revision, active_request_id, input_sha256, run_id, agent_fingerprint,
                input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
                summary_passes, summary_from_seq, summary_through_seq, summary_version,
                summary_prompt_sha256
         FROM admissions WHERE conversation_id = ?1",
        uuid
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("load admission"))?;
    match row {
        Some(row) => row.decode(conversation_id),
        None => Err(super::deletion::missing(conn, None, conversation_id).await),
    }
}

/// An `admissions` row as SQLite reads it: ids as 16-byte blobs.
pub(super) struct AdmissionColumns {
    pub(super) revision: i64,
    pub(super) active_request_id: Option<Vec<u8>>,
    pub(super) input_sha256: Option<Vec<u8>>,
    pub(super) run_id: Option<Vec<u8>>,
    pub(super) agent_fingerprint: Option<String>,
    pub(super) input_tokens: i64,
    pub(super) output_tokens: i64,
    pub(super) cache_read_tokens: i64,
    pub(super) cache_write_tokens: i64,
    pub(super) summary_passes: i64,
    pub(super) summary_from_seq: Option<i64>,
    pub(super) summary_through_seq: Option<i64>,
    pub(super) summary_version: Option<i64>,
    pub(super) summary_prompt_sha256: Option<Vec<u8>>,
}

impl AdmissionColumns {
    /// The admission: its ids as uuids, then decoded as every backend does.
    pub(super) fn decode(self, conversation_id: ConversationId) -> Result<Admission, Error> {
        let key = Row {
            table: "admissions",
            key: &conversation_id,
        };
        let uuid =
            |column: &str, bytes: Option<Vec<u8>>| bytes.map(|b| key.uuid(column, &b)).transpose();
        AdmissionRow {
            revision: self.revision,
            active_request_id: uuid("active_request_id", self.active_request_id)?,
            input_sha256: self.input_sha256,
            run_id: uuid("run_id", self.run_id)?,
            agent_fingerprint: self.agent_fingerprint,
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            cache_read_tokens: self.cache_read_tokens,
            cache_write_tokens: self.cache_write_tokens,
            summary_passes: self.summary_passes,
            summary_from_seq: self.summary_from_seq,
            summary_through_seq: self.summary_through_seq,
            summary_version: self.summary_version,
            summary_prompt_sha256: self.summary_prompt_sha256,
        }
        .decode(conversation_id)
    }
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

/// A claim, its values ready for its statement: one statement (an `INSERT`
/// into the `claims` view of migration 0013), whose trigger makes the
/// compare-and-swap and writes the request, its run, its input and the
/// first turn's write-ahead. A refused claim writes nothing, and is
/// explained by reads.
pub(super) struct ClaimStep {
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
}

impl ClaimStep {
    pub(super) fn new(claim: NewRequest) -> Result<Self, Error> {
        let checkpoints: Vec<&LoopCheckpoint> = claim.first_turn.iter().collect();
        Ok(Self {
            input: MessageColumns::of(&claim.input)?,
            reports: new_reports(&checkpoints)?,
            claim,
        })
    }

    /// Claims as a statement of its own.
    pub(super) async fn write(&self, tx: &mut SqliteConnection) -> Result<ClaimOutcome, Error> {
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
        // Run to its end with no row returned (see `next_revision`).
        let claimed = sqlx::query!(
            "INSERT INTO claims (conversation_id, request_id, run_id, expected_revision,
                 input_sha256, agent_fingerprint, now, input_role, input_content, input_meta,
                 turn, phase, input_tokens, output_tokens, cache_read_tokens,
                 cache_write_tokens, tool_calls_count, reports_count, message_count, reports,
                 deadline_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17,
                 ?18, ?19, ?20, ?21)",
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
            claim.deadline_at
        )
        .execute(&mut *tx)
        .await;
        match claimed {
            Ok(_) => {}
            Err(e) => {
                return match raised(&e) {
                    Some(Raised::RequestExists) => {
                        match super::reads::load_request(&mut *tx, claim.request_id).await? {
                            Some(existing) => Ok(ClaimOutcome::Existing(existing)),
                            // A lone claim's explanation is read after its
                            // statement: another process may have deleted
                            // or pruned the request in between.
                            None => {
                                match super::deletion::deleted_request(&mut *tx, claim.request_id)
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
                        conversation_id: super::deletion::deleted_request(
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
    pub(super) fn row(&self) -> Result<String, Error> {
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
        })
    }

    /// The first turn's checkpoint as its columns, if the loop starts at once.
    fn first_turn(&self) -> Option<CheckpointColumns> {
        self.claim.first_turn.as_ref().map(CheckpointColumns::of)
    }

    /// The admitted claim's fence, from the revision its statement returned.
    pub(super) fn admitted(&self, revision: i64) -> Result<ClaimOutcome, Error> {
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

/// A revision as the admission stored it.
fn admission_revision(conversation_id: ConversationId, revision: i64) -> Result<Revision, Error> {
    let key = Row {
        table: "admissions",
        key: &conversation_id,
    };
    Ok(Revision(key.u64("revision", revision)?))
}

/// The phases a recovery that rejects ambiguity refuses to continue from.
fn in_flight_phases() -> Vec<&'static str> {
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
        .map(CheckpointPhase::as_str)
        .collect()
}

/// The recovery claim's writes, inside the group transaction: one statement
/// (the `recovery_claims` view of migration 0006): the compare-and-swap,
/// under the write lock the check that the run being continued is not in
/// flight (when the claim rejects ambiguity), the run superseded, the new
/// run and its copy of the latest checkpoint.
pub(super) async fn claim_recovery_in(
    tx: &mut SqliteConnection,
    claim: &RecoveryClaim,
) -> Result<Fence, Error> {
    let conversation = claim.conversation_id.as_uuid();
    let request = claim.request_id.as_uuid();
    let from_run = claim.from_run.as_uuid();
    let new_run = claim.new_run.as_uuid();
    let expected = to_i64(claim.expected_revision.0);
    let refuse = match claim.reject_in_flight {
        true => Some(to_json(&in_flight_phases())?),
        false => None,
    };
    let now = now_ms();
    let claimed = sqlx::query_scalar!(
        r#"INSERT INTO recovery_claims (conversation_id, request_id, from_run, new_run,
               expected_revision, refuse_phases, now, agent_fingerprint)
           VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
           RETURNING (SELECT revision FROM admissions WHERE conversation_id = ?1)
               AS "revision!: i64""#,
        conversation,
        request,
        from_run,
        new_run,
        expected,
        refuse,
        now,
        claim.agent_fingerprint
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
        "SELECT turn FROM loop_checkpoints WHERE run_id = ?1 ORDER BY turn DESC LIMIT 1",
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

/// The abandon's writes, inside the group transaction: one statement (the
/// `abandons` view of migration 0005): the compare-and-swap, the owning run
/// abandoned, the admission released, the request id burned.
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
    let released = sqlx::query_scalar!(
        r#"INSERT INTO abandons (conversation_id, request_id, expected_revision, now)
           VALUES (?1, ?2, ?3, ?4)
           RETURNING (SELECT revision FROM admissions WHERE conversation_id = ?1)
               AS "revision!: i64""#,
        conversation,
        request,
        expected,
        now
    )
    .fetch_all(&mut *tx)
    .await
    .and_then(only_row);
    match released {
        Ok(revision) => admission_revision(conversation_id, revision),
        Err(e) => Err(match raised(&e) {
            Some(Raised::AdmissionMoved) => {
                diagnose(
                    tx,
                    Wanted::Active,
                    conversation_id,
                    request_id,
                    expected_revision,
                )
                .await
            }
            _ => db("abandon")(e),
        }),
    }
}
