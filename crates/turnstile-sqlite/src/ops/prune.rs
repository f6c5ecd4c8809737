//! Retention: delete what no replay needs from requests finished before a
//! cutoff (and, on request, whole idle conversations), then give the freed
//! pages back to the file system.
//!
//! What a completed request keeps is exactly what its replay reads: the
//! request row, the committing run's row and its last (`completed`)
//! checkpoint, its verification reports and its transcript rows. An
//! abandoned request keeps its row, so its id stays burned. Active requests
//! are never selected, so an active admission's work is never touched.
//!
//! Work goes in batches of [`BATCH`] requests (or conversations), one write
//! transaction each, so other writers wait at most one batch. A dry run does
//! the same deletes and rolls each batch back: its counts are exact.

use std::path::Path;

use sqlx::Connection;

use super::cutoff;
use crate::codec::db;
use crate::SqliteStore;
use turnstile_core::admin::{PruneOptions, PruneReport, TableCounts};
use turnstile_core::store::RequestStatus;
use turnstile_core::Error;

/// Requests (or conversations) per write transaction.
const BATCH: i64 = 256;

/// Deletes what no replay needs from requests finished before
/// `now - older_than` (see the module docs), optionally whole idle
/// conversations, then runs `PRAGMA incremental_vacuum` and
/// `PRAGMA wal_checkpoint(TRUNCATE)` so the file shrinks.
///
/// # Errors
/// [`Error::InvalidInput`] for `status: Some(Active)`; [`Error::Store`]
/// if the database fails (batches already committed stay committed).
///
/// # Cancel safety
/// Each batch is one transaction: dropping the future leaves every batch
/// deleted whole or not at all.
#[tracing::instrument(skip_all, fields(older_than = ?options.older_than, dry_run = options.dry_run), err)]
pub(super) async fn prune(
    store: &SqliteStore,
    options: &PruneOptions,
) -> Result<PruneReport, Error> {
    let status = match options.status {
        None => None,
        Some(RequestStatus::Completed) => Some("completed"),
        Some(RequestStatus::Abandoned) => Some("abandoned"),
        Some(RequestStatus::Active) => {
            return Err(Error::InvalidInput(
                "prune never deletes active requests: choose completed or abandoned".into(),
            ))
        }
    };
    let cutoff = cutoff(options.older_than);
    let idle_cutoff = super::cutoff(options.conversation_age());
    let keep_last = i64::from(options.keep_last_requests);
    let (database_bytes_before, wal_bytes_before) = store_file_sizes(store);
    let mut deleted = TableCounts::default();
    // Conversations first: a request of a conversation deleted whole is
    // not counted twice (in a dry run, nothing is deleted in between).
    if options.include_transcripts {
        let mut after = Vec::new();
        while prune_conversations(
            store,
            &mut after,
            idle_cutoff,
            options.dry_run,
            &mut deleted,
        )
        .await?
            == BATCH
        {}
    }
    let mut requests_examined = 0;
    let mut after = Vec::new();
    loop {
        let batch = prune_requests(
            store,
            &mut after,
            Selection {
                status,
                cutoff,
                keep_last,
                idle_cutoff: options.include_transcripts.then_some(idle_cutoff),
            },
            options.dry_run,
            &mut deleted,
        )
        .await?;
        requests_examined += batch as u64;
        if batch < BATCH {
            break;
        }
    }
    let (pages_freed, free_pages_after, wal_checkpoint_busy) = if options.dry_run {
        (0, free_pages_now(store).await?, false)
    } else {
        reclaim(store).await?
    };
    let (database_bytes_after, wal_bytes_after) = store_file_sizes(store);
    tracing::info!(rows = deleted.total(), pages_freed, "pruned");
    Ok(PruneReport {
        dry_run: options.dry_run,
        cutoff,
        requests_examined,
        deleted,
        database_bytes_before,
        wal_bytes_before,
        database_bytes_after,
        wal_bytes_after,
        pages_freed,
        free_pages_after,
        wal_checkpoint_busy,
    })
}

/// Which finished requests a prune pass takes.
struct Selection<'a> {
    status: Option<&'a str>,
    /// Finished before this (Unix ms).
    cutoff: i64,
    /// Spare the newest this many requests of each conversation.
    keep_last: i64,
    /// Skip the requests of conversations idle since before this: the
    /// conversations pass deleted (or counted) them whole.
    idle_cutoff: Option<i64>,
}

/// One batch of finished requests after the key `after` (which moves to
/// the batch's last key). Returns the batch size.
async fn prune_requests(
    store: &SqliteStore,
    after: &mut Vec<u8>,
    selection: Selection<'_>,
    dry_run: bool,
    deleted: &mut TableCounts,
) -> Result<i64, Error> {
    let mut conn = store.writer.take().await?;
    let mut tx = conn
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(db("begin write transaction"))?;
    let from = after.as_slice();
    // With `include_transcripts`, requests of conversations old enough to
    // be deleted whole were counted with them.
    let rows = sqlx::query!(
        r#"SELECT r.request_id, r.status, r.committed_run_id,
             -- its admitted and settling events, kept in its row (migration 0025)
             (r.admitted_event IS NOT NULL) + (r.settled_event IS NOT NULL)
                 AS "folded_events!: u32"
         FROM requests r
         WHERE r.request_id > ?1 AND r.status IN ('completed', 'abandoned')
           AND (?2 IS NULL OR r.status = ?2) AND r.completed_at < ?3
           AND NOT (?4 IS NOT NULL AND EXISTS (SELECT 1 FROM admissions a
                        WHERE a.conversation_id = r.conversation_id
                          AND a.active_request_id IS NULL AND a.updated_at < ?4))
           AND (?6 = 0 OR (SELECT COUNT(*) FROM requests n
                           WHERE n.conversation_id = r.conversation_id
                             AND (n.created_at, n.request_id) > (r.created_at, r.request_id))
                          >= ?6)
         ORDER BY r.request_id LIMIT ?5"#,
        from,
        selection.status,
        selection.cutoff,
        selection.idle_cutoff,
        BATCH,
        selection.keep_last
    )
    .fetch_all(&mut *tx)
    .await
    .map_err(db("select finished requests"))?;
    let Some(last) = rows.last() else {
        return Ok(0);
    };
    after.clone_from(&last.request_id);
    // The batch as JSON arrays of hex keys, expanded with json_each.
    let requests = hex_array(rows.iter().map(|r| r.request_id.as_slice()));
    let abandoned = hex_array(
        rows.iter()
            .filter(|r| r.status == "abandoned")
            .map(|r| r.request_id.as_slice()),
    );
    let committing_runs = hex_array(rows.iter().filter_map(|r| r.committed_run_id.as_deref()));

    let earlier_runs_checkpoints = sqlx::query!(
        "DELETE FROM loop_checkpoints
         WHERE run_id IN (SELECT run_id FROM runs
                          WHERE request_id IN (SELECT unhex(value) FROM json_each(?1)))
           AND run_id NOT IN (SELECT unhex(value) FROM json_each(?2))",
        requests,
        committing_runs
    )
    .execute(&mut *tx)
    .await
    .map_err(db("prune checkpoints of earlier runs"))?
    .rows_affected();
    // The committing run keeps its last checkpoint: the `completed` one
    // the replay outcome is read from.
    let superseded_checkpoints = sqlx::query!(
        "DELETE FROM loop_checkpoints AS c
         WHERE c.run_id IN (SELECT unhex(value) FROM json_each(?1))
           AND c.turn < (SELECT MAX(k.turn) FROM loop_checkpoints k WHERE k.run_id = c.run_id)",
        committing_runs
    )
    .execute(&mut *tx)
    .await
    .map_err(db("prune superseded checkpoints"))?
    .rows_affected();
    let tool_calls = sqlx::query!(
        "DELETE FROM tool_calls WHERE request_id IN (SELECT unhex(value) FROM json_each(?1))",
        requests
    )
    .execute(&mut *tx)
    .await
    .map_err(db("prune tool journal"))?
    .rows_affected();
    let approvals = sqlx::query!(
        "DELETE FROM approvals WHERE request_id IN (SELECT unhex(value) FROM json_each(?1))",
        requests
    )
    .execute(&mut *tx)
    .await
    .map_err(db("prune approvals"))?
    .rows_affected();
    // Through the log's key: the conversations of the batch, then their
    // requests' events.
    let events = sqlx::query!(
        "DELETE FROM events
         WHERE conversation_key IN (
                   SELECT c.key FROM requests r JOIN conversations c ON c.id = r.conversation_id
                   WHERE r.request_id IN (SELECT unhex(value) FROM json_each(?1)))
           AND request_id IN (SELECT unhex(value) FROM json_each(?1))",
        requests
    )
    .execute(&mut *tx)
    .await
    .map_err(db("prune events"))?
    .rows_affected();
    sqlx::query!(
        "UPDATE requests
         SET admitted_event = NULL, admitted_entry = NULL, admitted_run_id = NULL,
             settled_event = NULL
         WHERE request_id IN (SELECT unhex(value) FROM json_each(?1))
           AND (admitted_event IS NOT NULL OR settled_event IS NOT NULL)",
        requests
    )
    .execute(&mut *tx)
    .await
    .map_err(db("prune folded events"))?;
    let run_messages = sqlx::query!(
        "DELETE FROM run_messages WHERE request_id IN (SELECT unhex(value) FROM json_each(?1))",
        requests
    )
    .execute(&mut *tx)
    .await
    .map_err(db("prune pending messages"))?
    .rows_affected();
    let verification_reports = sqlx::query!(
        "DELETE FROM verification_reports
         WHERE request_id IN (SELECT unhex(value) FROM json_each(?1))",
        abandoned
    )
    .execute(&mut *tx)
    .await
    .map_err(db("prune reports of abandoned requests"))?
    .rows_affected();
    let runs = sqlx::query!(
        "DELETE FROM runs
         WHERE request_id IN (SELECT unhex(value) FROM json_each(?1))
           AND run_id NOT IN (SELECT unhex(value) FROM json_each(?2))",
        requests,
        committing_runs
    )
    .execute(&mut *tx)
    .await
    .map_err(db("prune runs"))?
    .rows_affected();
    // A folded run's (`claim.sql`) earlier turns, whether it committed (its
    // last checkpoint, in the request's row, stays) or not.
    let first_run_checkpoints = sqlx::query!(
        "DELETE FROM first_run_checkpoints
         WHERE request_id IN (SELECT unhex(value) FROM json_each(?1))",
        requests
    )
    .execute(&mut *tx)
    .await
    .map_err(db("prune earlier checkpoints of folded runs"))?
    .rows_affected();
    // A folded run that did not commit leaves its request's row, with its
    // checkpoint.
    let folded_checkpoints = sqlx::query!(
        "UPDATE requests
         SET turn = NULL, checkpoint_phase = NULL, input_tokens = NULL, output_tokens = NULL,
             cache_read_tokens = NULL, cache_write_tokens = NULL, tool_calls_count = NULL,
             reports_count = NULL, message_count = NULL, checkpoint_early_at = NULL
         WHERE request_id IN (SELECT unhex(value) FROM json_each(?1))
           AND request_id NOT IN (SELECT unhex(value) FROM json_each(?2))
           AND phase IS NOT NULL",
        requests,
        committing_runs
    )
    .execute(&mut *tx)
    .await
    .map_err(db("prune checkpoints of folded runs"))?
    .rows_affected();
    let folded_runs = sqlx::query!(
        "UPDATE requests SET run_state = NULL, run_error = NULL, run_ended_early_at = NULL
         WHERE request_id IN (SELECT unhex(value) FROM json_each(?1))
           AND request_id NOT IN (SELECT unhex(value) FROM json_each(?2))
           AND run_status IS NOT NULL",
        requests,
        committing_runs
    )
    .execute(&mut *tx)
    .await
    .map_err(db("prune folded runs"))?
    .rows_affected();
    finish(tx, dry_run).await?;
    deleted.loop_checkpoints += earlier_runs_checkpoints
        + superseded_checkpoints
        + first_run_checkpoints
        + folded_checkpoints;
    deleted.tool_calls += tool_calls;
    deleted.approvals += approvals;
    deleted.events += events + rows.iter().map(|r| u64::from(r.folded_events)).sum::<u64>();
    deleted.run_messages += run_messages;
    deleted.verification_reports += verification_reports;
    deleted.runs += runs + folded_runs;
    Ok(rows.len() as i64)
}

/// One batch of idle conversations last active before `cutoff`, after
/// the key `after`: counted per table, then deleted (the foreign keys
/// cascade to everything else). Returns the batch size.
async fn prune_conversations(
    store: &SqliteStore,
    after: &mut Vec<u8>,
    cutoff: i64,
    dry_run: bool,
    deleted: &mut TableCounts,
) -> Result<i64, Error> {
    let mut conn = store.writer.take().await?;
    let mut tx = conn
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(db("begin write transaction"))?;
    let from = after.as_slice();
    // Inside the write transaction: no request can claim one of these
    // conversations before they are gone.
    let ids = sqlx::query_scalar!(
        "SELECT c.id FROM conversations c JOIN admissions a ON a.conversation_id = c.id
         WHERE c.id > ?1 AND a.active_request_id IS NULL AND a.updated_at < ?2
         ORDER BY c.id LIMIT ?3",
        from,
        cutoff,
        BATCH
    )
    .fetch_all(&mut *tx)
    .await
    .map_err(db("select idle conversations"))?;
    let Some(last) = ids.last() else {
        return Ok(0);
    };
    after.clone_from(last);
    let doomed = hex_array(ids.iter().map(Vec::as_slice));
    let counts = sqlx::query!(
        r#"WITH doomed(id) AS (SELECT unhex(value) FROM json_each(?1)),
                reqs(id) AS (SELECT request_id FROM requests
                             WHERE conversation_id IN (SELECT id FROM doomed)),
                -- a folded run (`claim.sql`) has its request's id
                rns(id) AS (SELECT run_id FROM runs WHERE request_id IN (SELECT id FROM reqs)
                            UNION ALL
                            SELECT request_id FROM requests
                            WHERE conversation_id IN (SELECT id FROM doomed)
                              AND run_status IS NOT NULL)
           SELECT
             (SELECT COUNT(*) FROM transcript
              WHERE conversation_key IN (SELECT key FROM conversations
                                         WHERE id IN (SELECT id FROM doomed)))
                 AS "transcript!: i64",
             (SELECT COUNT(*) FROM reqs) AS "requests!: i64",
             (SELECT COUNT(*) FROM rns) AS "runs!: i64",
             (SELECT COUNT(*) FROM all_checkpoints
              WHERE run_id IN (SELECT id FROM rns)) AS "loop_checkpoints!: i64",
             (SELECT COUNT(*) FROM verification_reports
              WHERE request_id IN (SELECT id FROM reqs)) AS "verification_reports!: i64",
             (SELECT COUNT(*) FROM tool_calls
              WHERE request_id IN (SELECT id FROM reqs)) AS "tool_calls!: i64",
             (SELECT COUNT(*) FROM run_messages
              WHERE request_id IN (SELECT id FROM reqs)) AS "run_messages!: i64",
             (SELECT COUNT(*) FROM approvals
              WHERE request_id IN (SELECT id FROM reqs)) AS "approvals!: i64",
             (SELECT COUNT(*) FROM events
              WHERE conversation_key IN (SELECT key FROM conversations
                                         WHERE id IN (SELECT id FROM doomed)))
             + (SELECT COUNT(admitted_event) + COUNT(settled_event) FROM requests
                WHERE conversation_id IN (SELECT id FROM doomed))
                 AS "events!: i64""#,
        doomed
    )
    .fetch_one(&mut *tx)
    .await
    .map_err(db("count conversation rows"))?;
    let conversations = sqlx::query!(
        "DELETE FROM conversations WHERE id IN (SELECT unhex(value) FROM json_each(?1))",
        doomed
    )
    .execute(&mut *tx)
    .await
    .map_err(db("delete conversations"))?
    .rows_affected();
    finish(tx, dry_run).await?;
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    deleted.conversations += conversations;
    deleted.admissions += conversations;
    deleted.transcript += n(counts.transcript);
    deleted.requests += n(counts.requests);
    deleted.runs += n(counts.runs);
    deleted.loop_checkpoints += n(counts.loop_checkpoints);
    deleted.verification_reports += n(counts.verification_reports);
    deleted.tool_calls += n(counts.tool_calls);
    deleted.run_messages += n(counts.run_messages);
    deleted.approvals += n(counts.approvals);
    deleted.events += n(counts.events);
    Ok(ids.len() as i64)
}

/// Gives free pages back and truncates the log. Returns the pages freed,
/// the free pages left and whether the checkpoint was blocked.
pub(crate) async fn reclaim(store: &SqliteStore) -> Result<(u64, u64, bool), Error> {
    // Both write, so they run on the writer connection. Under WAL the
    // vacuum's truncation reaches the file at the checkpoint, hence this
    // order.
    let mut conn = store.writer.take().await?;
    let before = free_pages(&mut conn).await?;
    // PRAGMAs are runtime queries: the offline query macros cannot
    // describe them.
    sqlx::query("PRAGMA incremental_vacuum")
        .execute(&mut *conn)
        .await
        .map_err(db("incremental vacuum"))?;
    let after = free_pages(&mut conn).await?;
    let busy = crate::close::fold_log(&mut conn).await?;
    Ok((before.saturating_sub(after), after, busy))
}

async fn free_pages_now(store: &SqliteStore) -> Result<u64, Error> {
    let mut conn = store.reader.acquire().await?;
    free_pages(&mut conn).await
}

/// Sizes of the database file and its write-ahead log (0 when missing
/// or in memory).
pub(super) fn store_file_sizes(store: &SqliteStore) -> (u64, u64) {
    match &store.path {
        Some(path) => file_sizes(path),
        None => (0, 0),
    }
}

/// Sizes of a database file and its write-ahead log (0 when missing).
pub(super) fn file_sizes(path: &Path) -> (u64, u64) {
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    (size(path), size(&crate::open::beside(path, "-wal")))
}

async fn free_pages(conn: &mut sqlx::SqliteConnection) -> Result<u64, Error> {
    // A PRAGMA: a runtime query (see `reclaim`).
    let free: i64 = sqlx::query_scalar("PRAGMA freelist_count")
        .fetch_one(&mut *conn)
        .await
        .map_err(db("read the free page count"))?;
    Ok(u64::try_from(free).unwrap_or(0))
}

async fn finish(tx: sqlx::Transaction<'_, sqlx::Sqlite>, dry_run: bool) -> Result<(), Error> {
    if dry_run {
        tx.rollback().await.map_err(db("roll back the dry run"))
    } else {
        tx.commit().await.map_err(db("commit the prune batch"))
    }
}

/// Keys as a JSON array of hex strings, for `unhex(value) FROM json_each(?)`.
fn hex_array<'a>(keys: impl Iterator<Item = &'a [u8]>) -> String {
    let keys: Vec<String> = keys
        .map(|k| k.iter().map(|b| format!("{b:02x}")).collect())
        .collect();
    serde_json::Value::from(keys).to_string()
}
