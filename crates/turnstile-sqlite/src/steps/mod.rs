//! The durable steps, one SQL file each, installed into the database when
//! it opens, and beside each its Rust side, under the same name: the
//! step's parameters, its statement alone, its row of a batch statement
//! and the typed errors its refusals become.
//!
//! `turnstile-postgres/src/steps/` holds the same steps under the same
//! names (`conversation_open`, `claim`, `recovery_claim`, `turn_write`,
//! `tool_result`, `commit`, `abandon`), each one Rust function of one
//! statement, fence first: `claim.sql` and `claim.rs` here read side by
//! side with `turnstile-postgres/src/steps/claim.rs`.
//!
//! A step is one statement: an `INSERT` into a view whose `INSTEAD OF`
//! trigger is the step (fence, check, write), because sqlx hands every
//! statement to its connection's worker thread and back, and that round
//! trip, not SQLite, is most of what a step costs. Each file holds the
//! whole step: its view (the step's parameters), its trigger, and the batch
//! view through which the writer sends many of the same step of one group
//! transaction as one statement (`batch.rs`).
//!
//! The files are the only definition of the steps: migrations change
//! tables, indexes and the invariant triggers, never a step. The database
//! records the version of the step set it holds (`step_set`); opening it
//! installs this build's set over an older one, in one `BEGIN IMMEDIATE`
//! transaction that first reads the version again, so two processes of the
//! same build never both install. A database whose step set is newer than
//! this build's is refused for writing ([`Error::StepsTooNew`]), as a newer
//! schema is.
//!
//! A refused step raises `RAISE(ABORT, 'turnstile: …')`: SQLite undoes that
//! statement, and only it, and the transaction goes on. [`raised`] maps the
//! message to its [`Raised`] refusal, here and nowhere else.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::value::RawValue;
use sqlx::SqliteConnection;

use super::admission::load_admission;
use super::codec::{db, hex, primary_code, to_i64, Row};
use turnstile_core::backend::{cas_refusal, message_columns, Wanted};
use turnstile_core::checkpoint::LoopCheckpoint;
use turnstile_core::ids::{ConversationId, RequestId, Revision};
use turnstile_core::message::Message;
use turnstile_core::store::Fence;
use turnstile_core::Error;

pub(super) mod abandon;
pub(super) mod claim;
pub(super) mod commit;
pub(super) mod conversation_open;
pub(super) mod recovery_claim;
pub(super) mod tool_result;
pub(super) mod turn_write;

/// The version of the step set below: the number of entries of
/// `DIGESTS` in the tests. Any change to a step file appends the new
/// files' digest there and bumps this (the test
/// `each_step_set_version_has_its_own_digest` fails until both are done).
pub(super) const STEP_SET_VERSION: i64 = 17;

/// Every step, by name: its SQL file's stem.
const STEPS: [(&str, &str); 7] = [
    ("conversation_open", include_str!("conversation_open.sql")),
    ("claim", include_str!("claim.sql")),
    ("recovery_claim", include_str!("recovery_claim.sql")),
    ("turn_write", include_str!("turn_write.sql")),
    ("tool_result", include_str!("tool_result.sql")),
    ("commit", include_str!("commit.sql")),
    ("abandon", include_str!("abandon.sql")),
];

/// A refusal raised by a step trigger (or by the tombstone triggers of the
/// schema): SQLite undid the statement it was raised in, and only it; the
/// transaction goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Raised {
    /// The admission no longer names the writer's request, run and revision.
    Fenced,
    /// A claim of a request id the store knows already.
    RequestExists,
    /// A compare-and-swap on the admission found another revision or state.
    AdmissionMoved,
    /// A recovery claim refused: the run's latest checkpoint is in flight.
    TurnInFlight,
    /// A conversation or request of a deleted conversation's id (the
    /// tombstone triggers of the schema).
    Deleted,
}

/// The step refusal an error is, if it is one: `SQLITE_CONSTRAINT` with one
/// of the exact messages the triggers raise. Anything else (a fault
/// injected by another trigger, say) is an ordinary store error.
pub(super) fn raised(error: &sqlx::Error) -> Option<Raised> {
    const SQLITE_CONSTRAINT: i32 = 19;
    if primary_code(error) != Some(SQLITE_CONSTRAINT) {
        return None;
    }
    match error.as_database_error()?.message() {
        "turnstile: fenced" => Some(Raised::Fenced),
        "turnstile: request exists" => Some(Raised::RequestExists),
        "turnstile: admission moved" => Some(Raised::AdmissionMoved),
        "turnstile: turn in flight" => Some(Raised::TurnInFlight),
        "turnstile: deleted" => Some(Raised::Deleted),
        _ => None,
    }
}

/// The refusal of a run owner's step whose admission moved on.
pub(super) fn fenced(fence: &Fence) -> Error {
    Error::Fenced {
        run_id: fence.run_id,
        revision: fence.revision,
    }
}

/// Explains why a compare-and-swap on the admission matched no row.
pub(super) async fn diagnose(
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

/// A revision as the admission stored it.
pub(super) fn admission_revision(
    conversation_id: ConversationId,
    revision: i64,
) -> Result<Revision, Error> {
    let key = Row {
        table: "admissions",
        key: &conversation_id,
    };
    Ok(Revision(key.u64("revision", revision)?))
}

/// A checkpoint as its `loop_checkpoints` columns (the run and the time
/// are the step's own). Serialized under the column names, which the
/// shared statements read back.
#[derive(Clone, Copy, Serialize)]
pub(super) struct CheckpointColumns {
    pub(super) turn: i64,
    pub(super) phase: &'static str,
    pub(super) input_tokens: i64,
    pub(super) output_tokens: i64,
    pub(super) cache_read_tokens: i64,
    pub(super) cache_write_tokens: i64,
    pub(super) tool_calls_count: i64,
    pub(super) reports_count: i64,
    pub(super) message_count: i64,
}

impl CheckpointColumns {
    pub(super) fn of(checkpoint: &LoopCheckpoint) -> Self {
        let usage = checkpoint.usage;
        let reports = u64::try_from(checkpoint.verification_reports.len()).unwrap_or(u64::MAX);
        Self {
            turn: i64::from(checkpoint.turn),
            phase: checkpoint.phase.as_str(),
            input_tokens: to_i64(usage.input_tokens),
            output_tokens: to_i64(usage.output_tokens),
            cache_read_tokens: to_i64(usage.cache_read_tokens),
            cache_write_tokens: to_i64(usage.cache_write_tokens),
            tool_calls_count: to_i64(checkpoint.tool_calls_count),
            reports_count: to_i64(reports),
            message_count: to_i64(checkpoint.message_count),
        }
    }
}

/// A message as its stored columns: role, text and `meta` (its other
/// fields as a JSON object, `None` when it has none).
pub(super) struct MessageColumns {
    pub(super) role: String,
    pub(super) content: String,
    pub(super) meta: Option<String>,
}

impl MessageColumns {
    pub(super) fn of(message: &Message) -> Result<Self, Error> {
        let (role, content, meta) = message_columns(message)?;
        Ok(Self {
            role,
            content,
            meta,
        })
    }
}

/// A run owner's fence in a step's row: the ids as hex, and the revision.
#[derive(Serialize)]
pub(super) struct FenceKeys {
    conversation: String,
    request: String,
    run: String,
    revision: i64,
}

impl FenceKeys {
    pub(super) fn of(fence: &Fence) -> Self {
        Self {
            conversation: hex(fence.conversation_id.as_uuid().as_bytes()),
            request: hex(fence.request_id.as_uuid().as_bytes()),
            run: hex(fence.run_id.as_uuid().as_bytes()),
            revision: to_i64(fence.revision.0),
        }
    }
}

/// A list as the JSON array a step trigger expands, `None` (SQL NULL) when
/// it is empty.
pub(super) fn raw_list<T: Serialize>(items: &[T]) -> Result<Option<Box<RawValue>>, Error> {
    match items {
        [] => Ok(None),
        items => raw_json(items).map(Some),
    }
}

/// A value as JSON, kept as text to bind or to embed in a row.
fn raw_json<T: Serialize + ?Sized>(value: &T) -> Result<Box<RawValue>, Error> {
    serde_json::value::to_raw_value(value)
        .map_err(|e| Error::InvalidInput(format!("value cannot be serialized: {e}")))
}

/// The verification reports the checkpoints' own turns added, by their
/// position in the request (the earlier ones are stored already: a
/// checkpoint row only counts them). A position two checkpoints share is
/// taken from the first, as the trigger keeps a stored report.
pub(super) fn new_reports(checkpoints: &[&LoopCheckpoint]) -> Result<Option<Box<RawValue>>, Error> {
    let mut rows = BTreeMap::new();
    for checkpoint in checkpoints {
        let reports = &checkpoint.verification_reports;
        let Some(first_new) = reports.iter().position(|r| r.turn == checkpoint.turn) else {
            continue;
        };
        for (seq, report) in reports.iter().enumerate().skip(first_new) {
            rows.entry(seq).or_insert_with(|| {
                serde_json::json!({
                    "seq": seq,
                    "turn": report.turn,
                    "passed": report.passed,
                    "detail": report.detail,
                })
            });
        }
    }
    raw_list(&rows.into_values().collect::<Vec<_>>())
}

/// Before pending migrations run on a database that holds installed steps:
/// drops them, so that a migration may change any table a step uses. A
/// database whose schema predates `step_set` keeps its steps: its own
/// migrations restate and finally drop them.
pub(super) async fn drop_before_migrating(
    conn: &mut SqliteConnection,
    supported_schema: i64,
) -> Result<(), Error> {
    if !has_step_set(conn).await? {
        return Ok(());
    }
    begin_immediate(conn).await?;
    let dropped = drop_if_migrations_pending(conn, supported_schema).await;
    end(conn, dropped).await
}

async fn drop_if_migrations_pending(
    conn: &mut SqliteConnection,
    supported_schema: i64,
) -> Result<(), Error> {
    // Read under the write lock: another opener of this build may have
    // migrated and installed since the schema was checked.
    let migrated = sqlx::query_scalar!(r#"SELECT MAX(version) AS "v: i64" FROM _sqlx_migrations"#)
        .fetch_one(&mut *conn)
        .await
        .map_err(db("read schema version"))?;
    if migrated.unwrap_or(0) < supported_schema {
        drop_views(conn).await?;
        set_version(conn, 0).await?;
    }
    Ok(())
}

/// Installs this build's step set unless the database holds it already.
/// `existing_only`: the store is opened for tools that only look, so an
/// older step set is left as it is and a newer one is no obstacle.
pub(super) async fn install(conn: &mut SqliteConnection, existing_only: bool) -> Result<(), Error> {
    let held = version(conn).await?;
    if held == STEP_SET_VERSION || existing_only {
        return Ok(());
    }
    if held > STEP_SET_VERSION {
        return Err(too_new(held));
    }
    begin_immediate(conn).await?;
    let installed = install_if_older(conn).await;
    end(conn, installed).await
}

async fn install_if_older(conn: &mut SqliteConnection) -> Result<(), Error> {
    // Read again under the write lock: another opener may have installed.
    let held = version(conn).await?;
    if held > STEP_SET_VERSION {
        return Err(too_new(held));
    }
    if held < STEP_SET_VERSION {
        drop_views(conn).await?;
        // A failing step names itself (its file's stem).
        for (name, sql) in STEPS {
            sqlx::query(sql)
                .execute(&mut *conn)
                .await
                .map_err(db(name))?;
        }
        set_version(conn, STEP_SET_VERSION).await?;
    }
    Ok(())
}

fn too_new(found: i64) -> Error {
    Error::StepsTooNew {
        found,
        supported: STEP_SET_VERSION,
    }
}

async fn begin_immediate(conn: &mut SqliteConnection) -> Result<(), Error> {
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut *conn)
        .await
        .map_err(db("begin installing steps"))?;
    Ok(())
}

/// Commits the transaction `begin_immediate` opened when its work
/// succeeded, and rolls it back when it failed. A failed `COMMIT` leaves
/// the transaction to the connection's close, which rolls it back (the
/// caller closes it at once).
async fn end(conn: &mut SqliteConnection, work: Result<(), Error>) -> Result<(), Error> {
    match work {
        Ok(()) => {
            sqlx::query("COMMIT")
                .execute(&mut *conn)
                .await
                .map_err(db("commit installed steps"))?;
            Ok(())
        }
        Err(e) => {
            let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
            Err(e)
        }
    }
}

async fn has_step_set(conn: &mut SqliteConnection) -> Result<bool, Error> {
    let tables = sqlx::query_scalar!(
        r#"SELECT COUNT(*) AS "n!: i64" FROM sqlite_master WHERE type = 'table' AND name = 'step_set'"#
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(db("read step set"))?;
    Ok(tables > 0)
}

async fn version(conn: &mut SqliteConnection) -> Result<i64, Error> {
    sqlx::query_scalar!(r#"SELECT version AS "version!: i64" FROM step_set"#)
        .fetch_one(&mut *conn)
        .await
        .map_err(db("read step set"))
}

async fn set_version(conn: &mut SqliteConnection, version: i64) -> Result<(), Error> {
    sqlx::query!("UPDATE step_set SET version = ?1", version)
        .execute(&mut *conn)
        .await
        .map_err(db("record step set"))?;
    Ok(())
}

/// Drops every view of the database, and so every step (a view's trigger
/// goes with it): every view of a turnstile schema is a step, and a view
/// an older step set had and this one has not goes too.
async fn drop_views(conn: &mut SqliteConnection) -> Result<(), Error> {
    let names = sqlx::query_scalar!(
        // A step's views each have their trigger; the schema's read views
        // (`all_runs`, `all_checkpoints`) have none, and stay.
        r#"SELECT name AS "name!: String" FROM sqlite_master AS v
           WHERE type = 'view'
             AND EXISTS (SELECT 1 FROM sqlite_master
                         WHERE type = 'trigger' AND tbl_name = v.name)"#
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db("read step views"))?;
    for name in names {
        let quoted = name.replace('"', "\"\"");
        sqlx::query(&format!("DROP VIEW IF EXISTS \"{quoted}\""))
            .execute(&mut *conn)
            .await
            .map_err(db("drop step view"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    /// The views a step file creates: each `CREATE VIEW name` starts a line of
    /// its own (the test `every_step_file_creates_its_views` checks that every
    /// one has its trigger).
    fn views(sql: &str) -> impl Iterator<Item = &str> {
        sql.lines()
            .filter_map(|line| line.strip_prefix("CREATE VIEW "))
            .filter_map(|rest| rest.split_whitespace().next())
    }

    /// The SHA-256 of the step files (in `STEPS` order, each name then its
    /// text) of every step set version, oldest first: append-only, so two
    /// versions never stand for the same files and no file changes without
    /// a new version.
    const DIGESTS: &[&str] = &[
        "dd689d7b493124eaaf344c100aac5bdd48bf324f0f7244ad3d879a78f466690b",
        "d760047e669569eadfb5c84874d36b087fb53b004464160bbaec626db9b7fa99",
        "8dc10f9491db2f609baf5b844ec0295e99d20d7a7399f017d312743479e0e103",
        "0c214e0c8dc985e11ae743cc5a977c83b6642dcba111a1c3d23f8bfebbda5020",
        "8c2534b4c8cc53a01d330823e2ba2c5b88b73df41e0a3f55dbca46aab1ef4418",
        "4373dc3d6965c0a3fa69b459ef48e9f9894e93165e98919f23ec50e3234e3993",
        "a74033c403f4f6194876a2345e26f1096446f79272bd50fbd4c8593db44a1c3b",
        "7f8af900079aaa3e24e308ad951f83a3f3f94fbbce5b36f38d7ad8343e07de38",
        "61a8d0b698276ff776747f43a4583318b79e27e2c0dd92915f4b491e69b4277e",
        "c315c7f03324120893d07bae78de3d9f535ef38f8f2d55bad79aed1888ccfdb7",
        "5c9201ce57a25d743d41fb97503eaf3e905b1e3413b14407a0f2dec668f7f95a",
        "7739092da667c35e15c4a84351c054f728f35727f68e8c7de36d137de6b894af",
        "9d3c1314d6aa096928b95948005cc28b512ea3c48e75dc3e20451d144d3e8b7e",
        "de0797b6cbc6ae8eabe92df98ac5ed1b887fc6ae1f05e03cc71d97fe7b3d1c42",
        "7d7bface019ae49fc1a1a851727429e34ddcd3aa0d321eff582ef61fba43c76f",
        "9f30c4550cd6e55c82e6a0d4d8cd9f5997525ea7c96605725677cc8bbcb0df4f",
        "fe19055e34b1e0d1d30d82bb174b6328d7f7d03db79140454153066bba1dea98",
    ];

    #[test]
    fn each_step_set_version_has_its_own_digest() {
        let mut digest = Sha256::new();
        for (name, sql) in STEPS {
            digest.update(name.as_bytes());
            digest.update(sql.as_bytes());
        }
        let digest: String = digest
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            DIGESTS.last().copied(),
            Some(digest.as_str()),
            "a step file changed: append its digest to DIGESTS and bump STEP_SET_VERSION"
        );
        assert_eq!(
            DIGESTS.len() as i64,
            STEP_SET_VERSION,
            "one digest per version"
        );
        let mut unique = DIGESTS.to_vec();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), DIGESTS.len(), "a step set repeated");
    }

    /// A raw connection to a store's file, to read or tamper with it.
    async fn raw(path: &std::path::Path) -> SqliteConnection {
        use sqlx::ConnectOptions;
        sqlx::sqlite::SqliteConnectOptions::new()
            .filename(path)
            .connect()
            .await
            .unwrap()
    }

    async fn held(path: &std::path::Path) -> (i64, i64) {
        let mut conn = raw(path).await;
        let version = version(&mut conn).await.unwrap();
        let views: i64 = sqlx::query_scalar(
            // the step views: those with a trigger, as `drop_views` counts them
            "SELECT COUNT(*) FROM sqlite_master AS v
             WHERE type = 'view'
               AND EXISTS (SELECT 1 FROM sqlite_master
                           WHERE type = 'trigger' AND tbl_name = v.name)",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap();
        (version, views)
    }

    fn all_views() -> i64 {
        STEPS.iter().flat_map(|(_, sql)| views(sql)).count() as i64
    }

    #[tokio::test]
    async fn an_older_step_set_is_replaced_when_a_store_opens_for_writing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("steps.db");
        crate::SqliteStore::open(&path)
            .await
            .unwrap()
            .close()
            .await
            .unwrap();
        assert_eq!(held(&path).await, (STEP_SET_VERSION, all_views()));

        // An older set, and one of its steps gone.
        let mut conn = raw(&path).await;
        sqlx::query("DROP VIEW claims; UPDATE step_set SET version = 0")
            .execute(&mut conn)
            .await
            .unwrap();
        drop(conn);
        let looking = crate::SqliteStore::open_with(
            &path,
            crate::SqliteOptions {
                existing_only: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
        looking.close().await.unwrap();
        assert_eq!(
            held(&path).await,
            (0, all_views() - 1),
            "a look writes nothing"
        );

        crate::SqliteStore::open(&path)
            .await
            .unwrap()
            .close()
            .await
            .unwrap();
        assert_eq!(held(&path).await, (STEP_SET_VERSION, all_views()));
    }

    #[tokio::test]
    async fn a_newer_step_set_is_refused_for_writing_and_left_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("steps.db");
        crate::SqliteStore::open(&path)
            .await
            .unwrap()
            .close()
            .await
            .unwrap();
        let newer = STEP_SET_VERSION + 1;
        let mut conn = raw(&path).await;
        sqlx::query("UPDATE step_set SET version = ?1")
            .bind(newer)
            .execute(&mut conn)
            .await
            .unwrap();
        drop(conn);

        match crate::SqliteStore::open(&path).await {
            Err(Error::StepsTooNew { found, supported }) => {
                assert_eq!((found, supported), (newer, STEP_SET_VERSION));
            }
            other => panic!("expected StepsTooNew, got {other:?}"),
        }
        assert_eq!(held(&path).await, (newer, all_views()));
        // Only looking at it is fine.
        let looking = crate::SqliteStore::open_with(
            &path,
            crate::SqliteOptions {
                existing_only: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
        looking.close().await.unwrap();
    }

    #[test]
    fn every_step_file_creates_its_views() {
        for (name, sql) in STEPS {
            let views: Vec<&str> = views(sql).collect();
            assert!(!views.is_empty(), "{name}.sql creates no view");
            assert!(
                views
                    .iter()
                    .all(|v| sql.contains(&format!("INSTEAD OF INSERT ON {v}\n"))),
                "{name}.sql: a view without its trigger: {views:?}"
            );
        }
    }
}
