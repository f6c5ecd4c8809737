//! `doctor`: a health report of a database file. It opens one read-only
//! connection (no migrations, no journal-mode change), writes nothing, and
//! reports a check that cannot run instead of failing: a damaged file gets a
//! report too. Beside SQLite's own integrity check it counts the rows that
//! break the store's invariants.

use std::path::Path;
use std::time::Duration;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection, SqliteConnection};

use super::cutoff;
use super::prune::file_sizes;
use crate::codec::now_ms;
use crate::SqliteStore;
use turnstile_core::admin::DoctorReport;
use turnstile_core::Error;

impl SqliteStore {
    /// Checks a database file without changing it: integrity, schema
    /// version, page and file sizes, held and stuck admissions (a `running`
    /// owner counts as stuck after `stale_after` without a change).
    ///
    /// # Errors
    /// [`Error::NotFound`] if there is no file at `path`. A damaged or
    /// unreadable file is not an error: the report says what failed.
    pub async fn doctor(
        path: impl AsRef<Path>,
        stale_after: Duration,
    ) -> Result<DoctorReport, Error> {
        let path = path.as_ref();
        let metadata = std::fs::metadata(path);
        if let Err(e) = &metadata {
            if e.kind() == std::io::ErrorKind::NotFound {
                return Err(Error::NotFound {
                    what: "database",
                    id: path.display().to_string(),
                });
            }
        }
        let mut report = empty_report(path.display().to_string(), file_sizes(path));
        // A FIFO or a device would block the open or read without end;
        // only a regular file can be a database.
        match metadata {
            Err(e) => {
                report.cannot_open = Some(e.to_string());
                return Ok(report);
            }
            Ok(metadata) if !metadata.is_file() => {
                report.cannot_open = Some("not a regular file".into());
                return Ok(report);
            }
            Ok(_) => {}
        }
        // Read-only: no migration, no journal-mode change, and no checkpoint
        // of the log when the connection closes; immutable when this
        // process cannot write the file (no `-wal` or `-shm` beside it).
        let connected = SqliteConnectOptions::new()
            .filename(path)
            .read_only(true)
            .immutable(crate::open::only_readable(path))
            .busy_timeout(Duration::from_secs(5))
            .connect()
            .await;
        let mut conn = match connected {
            Ok(conn) => conn,
            Err(e) => {
                fail_to_check(&mut report, &e);
                return Ok(report);
            }
        };
        examine(&mut conn, &mut report, stale_after).await;
        let _ = conn.close().await;
        Ok(report)
    }
}

/// `doctor` on an open store: the same checks on one of its readers.
pub(super) async fn of_store(
    store: &SqliteStore,
    stale_after: Duration,
) -> Result<DoctorReport, Error> {
    if let Some(path) = store.path() {
        return SqliteStore::doctor(path, stale_after).await;
    }
    let mut report = empty_report("(in memory)".into(), (0, 0));
    let mut conn = store.reader.acquire().await?;
    examine(&mut conn, &mut report, stale_after).await;
    Ok(report)
}

fn empty_report(location: String, (database_bytes, wal_bytes): (u64, u64)) -> DoctorReport {
    DoctorReport {
        location,
        integrity_ok: None,
        cannot_open: None,
        integrity: Vec::new(),
        schema_version: None,
        supported_schema_version: SqliteStore::supported_schema_version(),
        details: Default::default(),
        database_bytes,
        wal_bytes,
        held_admissions: None,
        stuck_admissions: None,
        awaiting_approval_admissions: None,
        blobs: None,
        blob_bytes: None,
        unreferenced_blobs: None,
        not_checked: Vec::new(),
    }
}

/// The page figures of `doctor` and of [`StorageReport`](turnstile_core::admin::StorageReport).
// The page count first: it reads the database header, and a copied
// in-memory database answers the default page size until something has.
pub(super) const PAGE_PRAGMAS: [(&str, &str); 3] = [
    ("page_count", "PRAGMA page_count"),
    ("page_size", "PRAGMA page_size"),
    ("freelist_count", "PRAGMA freelist_count"),
];

async fn examine(conn: &mut SqliteConnection, report: &mut DoctorReport, stale_after: Duration) {
    // PRAGMAs are runtime queries: the offline query macros cannot describe
    // them.
    match sqlx::query_scalar::<_, String>("PRAGMA integrity_check")
        .fetch_all(&mut *conn)
        .await
    {
        Ok(lines) => {
            report.integrity_ok = Some(lines.len() == 1 && lines[0] == "ok");
            report.integrity = lines;
        }
        Err(e) => {
            fail_to_check(report, &e);
            return;
        }
    }
    for (name, pragma) in PAGE_PRAGMAS {
        let value = pragma_number(conn, pragma, &mut report.not_checked).await;
        report.details.insert(name.to_owned(), value.into());
    }
    let auto_vacuum = pragma_number(conn, "PRAGMA auto_vacuum", &mut report.not_checked)
        .await
        .map(|mode| match mode {
            0 => "none".to_owned(),
            1 => "full".to_owned(),
            2 => "incremental".to_owned(),
            other => other.to_string(),
        });
    report
        .details
        .insert("auto_vacuum".into(), auto_vacuum.into());
    let journal_mode = match sqlx::query_scalar::<_, String>("PRAGMA journal_mode")
        .fetch_one(&mut *conn)
        .await
    {
        Ok(mode) => Some(mode),
        Err(e) => {
            report.not_checked.push(format!("journal mode: {e}"));
            None
        }
    };
    report
        .details
        .insert("journal_mode".into(), journal_mode.into());

    match schema_version(conn).await {
        Ok(Some(version)) if version == SqliteStore::supported_schema_version() => {
            report.schema_version = Some(version);
            check_invariants(conn, report).await;
        }
        Ok(Some(version)) => {
            report.schema_version = Some(version);
            report.not_checked.push(format!(
                "the store's invariants: they are checked at schema {} (a writing command \
                 migrates the file)",
                SqliteStore::supported_schema_version()
            ));
        }
        Ok(None) => {
            report
                .not_checked
                .push("no turnstile schema: the file was never opened by turnstile".into());
            return;
        }
        Err(e) => {
            report.not_checked.push(format!("schema version: {e}"));
            return;
        }
    }
    let (cutoff, now) = (cutoff(stale_after), now_ms());
    // The rule of `backend::is_stuck`, counted.
    let counts = sqlx::query!(
        r#"SELECT COUNT(*) AS "held!: i64",
                  COALESCE(SUM(NOT awaiting
                               AND (a.run_status IS NULL OR a.run_status <> 'running'
                                    OR CASE WHEN a.lease_expires_at IS NULL THEN a.updated_at < ?1
                                            ELSE a.lease_expires_at < ?2 END)), 0)
                      AS "stuck!: i64",
                  COALESCE(SUM(awaiting), 0) AS "awaiting!: i64"
           FROM (SELECT a.*, EXISTS (SELECT 1 FROM approvals ap
                          JOIN tool_calls t ON t.request_id = ap.request_id AND t.turn = ap.turn
                              AND t.call_id = ap.call_id AND t.status = 'requested'
                          WHERE ap.request_id = a.active_request_id AND ap.status = 'awaiting') AS awaiting,
                     (SELECT status FROM all_runs WHERE run_id = a.run_id) AS run_status
                 FROM admissions a WHERE a.active_request_id IS NOT NULL) a"#,
        cutoff,
        now
    )
    .fetch_one(&mut *conn)
    .await;
    match counts {
        Ok(row) => {
            report.held_admissions = u64::try_from(row.held).ok();
            report.stuck_admissions = u64::try_from(row.stuck).ok();
            report.awaiting_approval_admissions = u64::try_from(row.awaiting).ok();
        }
        Err(e) => report.not_checked.push(format!("admissions: {e}")),
    }
    // Named blobs are read from the rows themselves, so a miscounted
    // reference shows as an unreferenced blob.
    let blobs = sqlx::query!(
        r#"SELECT COUNT(*) AS "count!: i64", COALESCE(SUM(size), 0) AS "bytes!: i64",
                  COALESCE(SUM(sha256 NOT IN (
                      SELECT p.value ->> '$.sha256' FROM transcript t, json_each(t.meta, '$.parts') p
                      WHERE instr(t.meta, '"sha256"') > 0 AND p.value ->> '$.sha256' IS NOT NULL
                      UNION
                      SELECT p.value ->> '$.sha256' FROM run_messages m, json_each(m.meta, '$.parts') p
                      WHERE instr(m.meta, '"sha256"') > 0 AND p.value ->> '$.sha256' IS NOT NULL
                      UNION
                      SELECT p.value ->> '$.sha256' FROM tool_calls c, json_each(c.result_parts) p
                      WHERE instr(c.result_parts, '"sha256"') > 0
                          AND p.value ->> '$.sha256' IS NOT NULL)), 0) AS "unreferenced!: i64"
           FROM blobs"#
    )
    .fetch_one(&mut *conn)
    .await;
    match blobs {
        Ok(row) => {
            report.blobs = u64::try_from(row.count).ok();
            report.blob_bytes = u64::try_from(row.bytes).ok();
            report.unreferenced_blobs = u64::try_from(row.unreferenced).ok();
        }
        Err(e) => report.not_checked.push(format!("blobs: {e}")),
    }
}

/// The store's invariants, each a query counting the rows that break it (as
/// PostgreSQL's `doctor` counts them; request ids are unique here by the
/// primary key, so there is no request-id table to check).
const INVARIANTS: [(&str, &str); 5] = [
    (
        "held admissions whose request is missing or not active",
        "SELECT COUNT(*) FROM admissions a LEFT JOIN requests r ON r.request_id = a.active_request_id
         WHERE a.active_request_id IS NOT NULL AND (r.request_id IS NULL OR r.status <> 'active')",
    ),
    (
        "active requests that hold no admission",
        "SELECT COUNT(*) FROM requests r JOIN admissions a ON a.conversation_id = r.conversation_id
         WHERE r.status = 'active' AND a.active_request_id IS NOT r.request_id",
    ),
    (
        "completed requests without their committing run",
        "SELECT COUNT(*) FROM requests r
         WHERE r.status = 'completed'
           AND NOT EXISTS (SELECT 1 FROM all_runs ru WHERE ru.run_id = r.committed_run_id
                               AND ru.request_id = r.request_id)",
    ),
    (
        "transcript entries after the committed ones that are not the held request's",
        "SELECT COUNT(*) FROM transcript t
         JOIN conversations c ON c.key = t.conversation_key
         JOIN admissions a ON a.conversation_id = c.id
         WHERE t.seq >= c.transcript_length AND t.request_id IS NOT a.active_request_id",
    ),
    (
        "conversations whose transcript has a gap",
        "SELECT COUNT(*) FROM (SELECT conversation_key FROM transcript GROUP BY conversation_key
                               HAVING MAX(seq) + 1 <> COUNT(*))",
    ),
];

/// Counts the rows that break each of [`INVARIANTS`]: any makes the
/// integrity check fail, naming what broke and how often.
async fn check_invariants(conn: &mut SqliteConnection, report: &mut DoctorReport) {
    let mut broken = Vec::new();
    for (what, sql) in INVARIANTS {
        // Runtime queries: a fixed list, checked on every run by the
        // conformance suite's doctor test and by `doctor_invariants`.
        match sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(&mut *conn)
            .await
        {
            Ok(0) => {}
            Ok(n) => broken.push(format!("{n} {what}")),
            Err(e) => report.not_checked.push(format!("{what}: {e}")),
        }
    }
    if !broken.is_empty() {
        report.integrity_ok = Some(false);
        report.integrity.retain(|line| line != "ok");
        report.integrity.extend(broken);
    }
}

/// A check that could not start: a file SQLite cannot open (no permission,
/// a read-only directory its log needs) or that another process kept
/// locked says nothing about the database's health; any other failure (not
/// a database, corrupt) is a failed check.
fn fail_to_check(report: &mut DoctorReport, error: &sqlx::Error) {
    const SQLITE_PERM: i32 = 3;
    const SQLITE_BUSY: i32 = 5;
    const SQLITE_LOCKED: i32 = 6;
    const SQLITE_READONLY: i32 = 8;
    const SQLITE_CANTOPEN: i32 = 14;
    let code = crate::codec::primary_code(error);
    let unopenable = matches!(error, sqlx::Error::Io(_))
        || matches!(
            code,
            Some(SQLITE_PERM | SQLITE_BUSY | SQLITE_LOCKED | SQLITE_READONLY | SQLITE_CANTOPEN)
        );
    if unopenable {
        report.cannot_open = Some(error.to_string());
    } else {
        report.integrity_ok = Some(false);
        report.integrity = vec![format!("the integrity check could not run: {error}")];
    }
}

pub(super) async fn pragma_number(
    conn: &mut SqliteConnection,
    pragma: &'static str,
    errors: &mut Vec<String>,
) -> Option<u64> {
    match sqlx::query_scalar::<_, i64>(pragma)
        .fetch_one(&mut *conn)
        .await
    {
        Ok(value) => u64::try_from(value).ok(),
        Err(e) => {
            errors.push(format!("{}: {e}", pragma.trim_start_matches("PRAGMA ")));
            None
        }
    }
}

/// The newest applied migration; `None` when the migrations table is
/// missing.
async fn schema_version(conn: &mut SqliteConnection) -> Result<Option<i64>, sqlx::Error> {
    let has_table = sqlx::query_scalar!(
        r#"SELECT COUNT(*) AS "n!: i64" FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'"#
    )
    .fetch_one(&mut *conn)
    .await?;
    if has_table == 0 {
        return Ok(None);
    }
    let version = sqlx::query_scalar!(r#"SELECT MAX(version) AS "v: i64" FROM _sqlx_migrations"#)
        .fetch_one(&mut *conn)
        .await?;
    Ok(Some(version.unwrap_or(0)))
}
