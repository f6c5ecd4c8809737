//! Health and storage: the server and schema versions, table sizes, the
//! store's own invariants, and held and stuck admissions.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use sqlx::PgPool;

use super::cutoff;
use crate::codec::{db, now_ms};
use crate::connect::schema_version;
use crate::PostgresStore;
use turnstile_core::admin::{DoctorReport, StorageReport};
use turnstile_core::Error;

/// Bytes of turnstile's tables in the store's schema, indexes and TOAST
/// included.
pub(super) async fn table_bytes(pool: &PgPool) -> Result<u64, Error> {
    let bytes = sqlx::query_scalar!(
        r#"SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0)::bigint AS "bytes!"
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = current_schema() AND c.relkind = 'r'"#
    )
    .fetch_one(pool)
    .await
    .map_err(db("read table sizes"))?;
    Ok(u64::try_from(bytes).unwrap_or(0))
}

pub(super) async fn storage(store: &PostgresStore) -> Result<StorageReport, Error> {
    let bytes = table_bytes(&store.pool).await?;
    Ok(StorageReport {
        bytes_in_use: bytes,
        database_bytes: bytes,
        wal_bytes: 0,
        details: BTreeMap::new(),
    })
}

/// The invariants `doctor` checks, each a query counting the rows that
/// break it.
const INVARIANTS: [(&str, &str); 6] = [
    (
        "held admissions whose request is missing or not active",
        "SELECT COUNT(*) FROM admissions a LEFT JOIN requests r
             ON r.conversation_id = a.conversation_id AND r.request_id = a.active_request_id
         WHERE a.active_request_id IS NOT NULL AND (r.request_id IS NULL OR r.status <> 'active')",
    ),
    (
        "active requests that hold no admission",
        "SELECT COUNT(*) FROM requests r JOIN admissions a ON a.conversation_id = r.conversation_id
         WHERE r.status = 'active' AND a.active_request_id IS DISTINCT FROM r.request_id",
    ),
    (
        "requests without their request-id row",
        "SELECT COUNT(*) FROM requests r LEFT JOIN request_ids k ON k.request_id = r.request_id
         WHERE k.conversation_id IS DISTINCT FROM r.conversation_id",
    ),
    (
        "completed requests without their committing run",
        "SELECT COUNT(*) FROM requests r LEFT JOIN all_runs ru
             ON ru.conversation_id = r.conversation_id AND ru.run_id = r.committed_run_id
         WHERE r.status = 'completed' AND ru.run_id IS NULL",
    ),
    (
        "transcript entries after the committed ones that are not the held request's",
        "SELECT COUNT(*) FROM transcript t
         JOIN conversations c ON c.conversation_id = t.conversation_id
         JOIN admissions a ON a.conversation_id = t.conversation_id
         WHERE t.seq >= c.transcript_length
           AND t.request_id IS DISTINCT FROM a.active_request_id",
    ),
    (
        "conversations whose transcript has a gap",
        "SELECT COUNT(*) FROM (SELECT conversation_id FROM transcript GROUP BY conversation_id
                               HAVING MAX(seq) + 1 <> COUNT(*)) gaps",
    ),
];

pub(super) async fn doctor(
    store: &PostgresStore,
    stale_after: Duration,
) -> Result<DoctorReport, Error> {
    let mut report = DoctorReport {
        location: store.location.clone(),
        integrity_ok: None,
        cannot_open: None,
        integrity: Vec::new(),
        schema_version: None,
        supported_schema_version: PostgresStore::supported_schema_version(),
        details: BTreeMap::new(),
        database_bytes: 0,
        wal_bytes: 0,
        held_admissions: None,
        stuck_admissions: None,
        awaiting_approval_admissions: None,
        blobs: None,
        blob_bytes: None,
        unreferenced_blobs: None,
        not_checked: Vec::new(),
    };
    let server = sqlx::query_scalar!(r#"SELECT current_setting('server_version') AS "v!""#)
        .fetch_one(&store.pool)
        .await;
    match server {
        Ok(version) => {
            report
                .details
                .insert("server_version".into(), Value::from(version));
        }
        Err(e) => {
            // Nothing can be checked on a server that cannot be reached.
            report.cannot_open = Some(db("connect")(e).to_string());
            return Ok(report);
        }
    }
    let schema = sqlx::query_scalar!(r#"SELECT current_schema() AS "s?""#)
        .fetch_one(&store.pool)
        .await;
    match schema {
        Ok(schema) => {
            report.details.insert("schema".into(), Value::from(schema));
        }
        Err(e) => report.not_checked.push(format!("schema: {e}")),
    }
    match schema_version(&store.pool).await {
        Ok(Some(version)) => report.schema_version = Some(version),
        Ok(None) => {
            report
                .not_checked
                .push("no turnstile schema: the database was never opened by turnstile".into());
            return Ok(report);
        }
        Err(e) => {
            report.not_checked.push(format!("schema version: {e}"));
            return Ok(report);
        }
    }
    match table_sizes(&store.pool).await {
        Ok(sizes) => {
            report.database_bytes = sizes.values().sum();
            report.details.insert(
                "table_bytes".into(),
                Value::Object(sizes.into_iter().map(|(k, v)| (k, v.into())).collect()),
            );
        }
        Err(e) => report.not_checked.push(e.to_string()),
    }
    let mut broken = Vec::new();
    for (what, sql) in INVARIANTS {
        // Runtime queries: a fixed list checked by the conformance suite's
        // doctor test on every run.
        match sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(&store.pool)
            .await
        {
            Ok(0) => {}
            Ok(n) => broken.push(format!("{n} {what}")),
            Err(e) => report.not_checked.push(format!("{what}: {e}")),
        }
    }
    if report.not_checked.is_empty() {
        report.integrity_ok = Some(broken.is_empty());
        report.integrity = if broken.is_empty() {
            vec!["ok".into()]
        } else {
            broken
        };
    }
    // The rule of `backend::is_stuck`, counted.
    let counts = sqlx::query!(
        r#"SELECT COUNT(*) AS "held!",
                  COUNT(*) FILTER (WHERE NOT a.awaiting
                                   AND (ru.status IS NULL OR ru.status <> 'running'
                                        OR CASE WHEN a.lease_expires_at IS NULL
                                                THEN a.updated_at < $1
                                                ELSE a.lease_expires_at < $2 END)) AS "stuck!",
                  COUNT(*) FILTER (WHERE a.awaiting) AS "awaiting!"
           FROM (SELECT a.*, EXISTS (SELECT 1 FROM approvals ap
                          JOIN tool_calls t ON t.conversation_id = ap.conversation_id
                              AND t.request_id = ap.request_id AND t.turn = ap.turn
                              AND t.position = ap.position AND t.status = 'requested'
                          WHERE ap.conversation_id = a.conversation_id
                              AND ap.request_id = a.active_request_id AND ap.status = 'awaiting') AS awaiting
                 FROM admissions a WHERE a.active_request_id IS NOT NULL) a
           -- The holding run's status by its key (as `list::stuck_keys`).
           CROSS JOIN LATERAL (
               SELECT (SELECT r.status FROM all_runs r
                       WHERE r.conversation_id = a.conversation_id AND r.run_id = a.run_id)
                   AS status
           ) ru"#,
        cutoff(stale_after),
        now_ms()
    )
    .fetch_one(&store.pool)
    .await;
    match counts {
        Ok(row) => {
            report.held_admissions = u64::try_from(row.held).ok();
            report.stuck_admissions = u64::try_from(row.stuck).ok();
            report.awaiting_approval_admissions = u64::try_from(row.awaiting).ok();
        }
        Err(e) => report.not_checked.push(format!("admissions: {e}")),
    }
    // Named blobs are read from the rows themselves (as the triggers of
    // migration 0016 find them), so a miscounted reference shows as an
    // unreferenced blob.
    let blobs = sqlx::query!(
        r#"SELECT COUNT(*) AS "count!", COALESCE(SUM(size), 0)::bigint AS "bytes!",
                  COUNT(*) FILTER (WHERE sha256 NOT IN (
                      SELECT h[1] FROM transcript t,
                          regexp_matches(t.meta, '"sha256":"([0-9a-f]{64})"', 'g') h
                      UNION
                      SELECT h[1] FROM run_messages m,
                          regexp_matches(m.meta, '"sha256":"([0-9a-f]{64})"', 'g') h
                      UNION
                      SELECT h[1] FROM tool_calls c,
                          regexp_matches(c.result_parts, '"sha256":"([0-9a-f]{64})"', 'g') h
                  )) AS "unreferenced!"
           FROM blobs"#
    )
    .fetch_one(&store.pool)
    .await;
    match blobs {
        Ok(row) => {
            report.blobs = u64::try_from(row.count).ok();
            report.blob_bytes = u64::try_from(row.bytes).ok();
            report.unreferenced_blobs = u64::try_from(row.unreferenced).ok();
        }
        Err(e) => report.not_checked.push(format!("blobs: {e}")),
    }
    Ok(report)
}

/// Bytes per table of the store's schema.
async fn table_sizes(pool: &PgPool) -> Result<BTreeMap<String, u64>, Error> {
    let rows = sqlx::query!(
        r#"SELECT c.relname AS "name!", pg_total_relation_size(c.oid) AS "bytes!"
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = current_schema() AND c.relkind = 'r'"#
    )
    .fetch_all(pool)
    .await
    .map_err(db("read table sizes"))?;
    Ok(rows
        .into_iter()
        .map(|r| (r.name, u64::try_from(r.bytes).unwrap_or(0)))
        .collect())
}
