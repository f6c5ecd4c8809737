//! Retention: delete what no replay needs from requests finished before a
//! cutoff (and, on request, whole idle conversations), then `VACUUM` the
//! tables so the space is reused.
//!
//! What a completed request keeps is exactly what its replay reads: the
//! request row, the committing run's row and its last (`completed`)
//! checkpoint, its verification reports and its transcript rows. An
//! abandoned request keeps its row (and its `request_ids` row), so its id
//! stays burned. Active requests are never selected.
//!
//! Work goes in batches of [`BATCH`] requests (or conversations), one
//! transaction each. A dry run does the same deletes and rolls each batch
//! back: its counts are exact.

use sqlx::PgConnection;
use uuid::Uuid;

use super::cutoff;
use super::doctor::table_bytes;
use crate::codec::db;
use crate::PostgresStore;
use turnstile_core::admin::{PruneOptions, PruneReport, TableCounts};
use turnstile_core::store::RequestStatus;
use turnstile_core::Error;

/// Requests (or conversations) per transaction.
const BATCH: i64 = 256;

#[tracing::instrument(skip_all, fields(older_than = ?options.older_than, dry_run = options.dry_run), err)]
pub(super) async fn prune(
    store: &PostgresStore,
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
    let database_bytes_before = table_bytes(&store.pool).await?;
    let mut deleted = TableCounts::default();
    // Conversations first: a request of a conversation deleted whole is not
    // counted twice.
    if options.include_transcripts {
        let mut after = Uuid::nil();
        loop {
            let mut tx = store.pool.begin().await.map_err(db("begin"))?;
            let batch = prune_conversations(&mut tx, &mut after, idle_cutoff, &mut deleted).await?;
            finish(tx, options.dry_run).await?;
            if batch < BATCH {
                break;
            }
        }
    }
    let mut requests_examined = 0;
    let mut after = Uuid::nil();
    loop {
        let mut tx = store.pool.begin().await.map_err(db("begin"))?;
        let selection = Selection {
            status,
            cutoff,
            keep_last,
            idle_cutoff: options.include_transcripts.then_some(idle_cutoff),
        };
        let batch = prune_requests(&mut tx, &mut after, &selection, &mut deleted).await?;
        finish(tx, options.dry_run).await?;
        requests_examined += batch as u64;
        if batch < BATCH {
            break;
        }
    }
    if !options.dry_run && deleted.total() > 0 {
        // Outside a transaction, as VACUUM must be: the space is reused.
        for table in TABLES {
            sqlx::query(&format!("VACUUM {table}"))
                .execute(&store.pool)
                .await
                .map_err(db("vacuum"))?;
        }
    }
    let database_bytes_after = table_bytes(&store.pool).await?;
    tracing::info!(rows = deleted.total(), "pruned");
    Ok(PruneReport {
        dry_run: options.dry_run,
        cutoff,
        requests_examined,
        deleted,
        database_bytes_before,
        wal_bytes_before: 0,
        database_bytes_after,
        wal_bytes_after: 0,
        pages_freed: 0,
        free_pages_after: 0,
        wal_checkpoint_busy: false,
    })
}

/// The tables prune deletes from.
const TABLES: [&str; 14] = [
    "conversations",
    "admissions",
    "request_ids",
    "requests",
    "runs",
    "run_messages",
    "loop_checkpoints",
    "first_run_checkpoints",
    "verification_reports",
    "tool_calls",
    "approvals",
    "transcript",
    "summaries",
    "events",
];

async fn finish(
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    dry_run: bool,
) -> Result<(), Error> {
    if dry_run {
        tx.rollback().await.map_err(db("roll back dry run"))
    } else {
        tx.commit().await.map_err(db("commit prune"))
    }
}

fn count(value: Option<i64>) -> u64 {
    value.and_then(|v| u64::try_from(v).ok()).unwrap_or(0)
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
    conn: &mut PgConnection,
    after: &mut Uuid,
    selection: &Selection<'_>,
    deleted: &mut TableCounts,
) -> Result<i64, Error> {
    // With `include_transcripts`, requests of conversations old enough to
    // be deleted whole were counted with them.
    let rows = sqlx::query!(
        r#"SELECT r.conversation_id, r.request_id, r.status, r.committed_run_id,
             -- its admitted and settling events, kept in its row (migration 0028)
             (r.admitted_event IS NOT NULL)::int + (r.settled_event IS NOT NULL)::int
                 AS "folded_events!"
         FROM request_ids k
         JOIN requests r ON r.conversation_id = k.conversation_id AND r.request_id = k.request_id
         WHERE k.request_id > $1 AND r.status IN ('completed', 'abandoned')
           AND ($2::text IS NULL OR r.status = $2) AND r.completed_at < $3
           AND NOT ($4::bigint IS NOT NULL AND EXISTS (SELECT 1 FROM admissions a
                        WHERE a.conversation_id = r.conversation_id
                          AND a.active_request_id IS NULL AND a.updated_at < $4))
           AND ($6::bigint = 0 OR (SELECT COUNT(*) FROM requests n
                           WHERE n.conversation_id = r.conversation_id
                             AND (n.created_at, n.request_id) > (r.created_at, r.request_id))
                          >= $6::bigint)
         ORDER BY k.request_id LIMIT $5"#,
        *after,
        selection.status,
        selection.cutoff,
        selection.idle_cutoff,
        BATCH,
        selection.keep_last
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db("select finished requests"))?;
    let Some(last) = rows.last() else {
        return Ok(0);
    };
    *after = last.request_id;
    let conversations: Vec<Uuid> = rows.iter().map(|r| r.conversation_id).collect();
    let requests: Vec<Uuid> = rows.iter().map(|r| r.request_id).collect();
    let abandoned: Vec<bool> = rows.iter().map(|r| r.status == "abandoned").collect();
    // The nil uuid stands for "no committing run" (an abandoned request).
    let committing: Vec<Uuid> = rows
        .iter()
        .map(|r| r.committed_run_id.unwrap_or_else(Uuid::nil))
        .collect();
    // One statement: every delete reads the batch from the same arrays. The
    // committing run keeps its row and its last checkpoint, the `completed`
    // one the replay outcome is read from.
    let counts = sqlx::query!(
        r#"WITH batch AS (
               SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::boolean[], $4::uuid[])
                   AS b(conversation_id, request_id, abandoned, committing_run)
           ), checkpoints AS (
               DELETE FROM loop_checkpoints c USING runs ru, batch b
               WHERE ru.conversation_id = b.conversation_id AND ru.request_id = b.request_id
                 AND c.conversation_id = ru.conversation_id AND c.run_id = ru.run_id
                 AND (ru.run_id <> b.committing_run
                      OR c.turn < (SELECT MAX(k.turn) FROM loop_checkpoints k
                                   WHERE k.conversation_id = c.conversation_id
                                     AND k.run_id = c.run_id))
               RETURNING 1
           ), first_checkpoints AS (
               -- A folded run's (migration 0027) earlier turns, whether it
               -- committed (its last checkpoint, in the request's row, stays)
               -- or not.
               DELETE FROM first_run_checkpoints f USING batch b
               WHERE f.conversation_id = b.conversation_id AND f.request_id = b.request_id
               RETURNING 1
           ), folded_runs AS (
               SELECT q.conversation_id, q.request_id, q.phase IS NOT NULL AS checkpointed
               FROM requests q JOIN batch b
                   ON q.conversation_id = b.conversation_id AND q.request_id = b.request_id
               WHERE q.request_id <> b.committing_run AND q.run_status IS NOT NULL
           ), unfolded AS (
               -- A folded run that did not commit leaves its request's row,
               -- with its checkpoint.
               UPDATE requests q
               SET run_status = NULL, run_error = NULL, run_ended_at = NULL, turn = NULL,
                   phase = NULL, input_tokens = NULL, output_tokens = NULL,
                   cache_read_tokens = NULL, cache_write_tokens = NULL, tool_calls_count = NULL,
                   reports_count = NULL, message_count = NULL, checkpoint_at = NULL
               FROM folded_runs f
               WHERE q.conversation_id = f.conversation_id AND q.request_id = f.request_id
           ), asked AS (
               -- Deleted here to be counted (the journal's would cascade).
               DELETE FROM approvals a USING batch b
               WHERE a.conversation_id = b.conversation_id AND a.request_id = b.request_id
               RETURNING 1
           ), journal AS (
               DELETE FROM tool_calls t USING batch b
               WHERE t.conversation_id = b.conversation_id AND t.request_id = b.request_id
               RETURNING 1
           ), pending AS (
               DELETE FROM run_messages m USING batch b
               WHERE m.conversation_id = b.conversation_id AND m.request_id = b.request_id
               RETURNING 1
           ), reports AS (
               DELETE FROM verification_reports v USING batch b
               WHERE v.conversation_id = b.conversation_id AND v.request_id = b.request_id
                 AND b.abandoned
               RETURNING 1
           ), logged AS (
               DELETE FROM events e USING batch b
               WHERE e.conversation_id = b.conversation_id AND e.request_id = b.request_id
               RETURNING 1
           ), old_runs AS (
               DELETE FROM runs ru USING batch b
               WHERE ru.conversation_id = b.conversation_id AND ru.request_id = b.request_id
                 AND ru.run_id <> b.committing_run
               RETURNING 1
           )
           SELECT (SELECT COUNT(*) FROM checkpoints) + (SELECT COUNT(*) FROM first_checkpoints)
                      + (SELECT COUNT(*) FROM folded_runs WHERE checkpointed) AS checkpoints,
                  (SELECT COUNT(*) FROM journal) AS journal,
                  (SELECT COUNT(*) FROM asked) AS approvals,
                  (SELECT COUNT(*) FROM pending) AS pending,
                  (SELECT COUNT(*) FROM reports) AS reports,
                  (SELECT COUNT(*) FROM logged) AS events,
                  (SELECT COUNT(*) FROM old_runs) + (SELECT COUNT(*) FROM folded_runs)
                      AS runs"#,
        &conversations,
        &requests,
        &abandoned,
        &committing
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(db("prune requests"))?;
    deleted.loop_checkpoints += count(counts.checkpoints);
    deleted.tool_calls += count(counts.journal);
    deleted.approvals += count(counts.approvals);
    deleted.run_messages += count(counts.pending);
    deleted.verification_reports += count(counts.reports);
    deleted.runs += count(counts.runs);
    deleted.events += count(counts.events)
        + rows
            .iter()
            .map(|r| u64::try_from(r.folded_events).unwrap_or(0))
            .sum::<u64>();
    // A statement of its own: the one above updates some of these rows.
    sqlx::query!(
        "UPDATE requests q
         SET admitted_event = NULL, admitted_entry = NULL, admitted_run_id = NULL,
             settled_event = NULL
         FROM UNNEST($1::uuid[], $2::uuid[]) AS b(conversation_id, request_id)
         WHERE q.conversation_id = b.conversation_id AND q.request_id = b.request_id
           AND (q.admitted_event IS NOT NULL OR q.settled_event IS NOT NULL)",
        &conversations,
        &requests
    )
    .execute(&mut *conn)
    .await
    .map_err(db("prune folded events"))?;
    Ok(rows.len() as i64)
}

/// One batch of idle conversations last active before `cutoff`, after the
/// key `after`: counted per table, then deleted (the foreign keys cascade
/// to everything but `request_ids`, deleted here). Returns the batch size.
async fn prune_conversations(
    conn: &mut PgConnection,
    after: &mut Uuid,
    cutoff: i64,
    deleted: &mut TableCounts,
) -> Result<i64, Error> {
    // Locked: no request can claim one of these conversations before they
    // are gone (a claim waits, then finds no admission).
    let ids = sqlx::query_scalar!(
        "SELECT conversation_id FROM admissions
         WHERE conversation_id > $1 AND active_request_id IS NULL AND updated_at < $2
         ORDER BY conversation_id LIMIT $3
         FOR UPDATE",
        *after,
        cutoff,
        BATCH
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db("select idle conversations"))?;
    let Some(last) = ids.last() else {
        return Ok(0);
    };
    *after = *last;
    let counts = sqlx::query!(
        r#"SELECT
             (SELECT COUNT(*) FROM transcript WHERE conversation_id = ANY($1)) AS "transcript!",
             (SELECT COUNT(*) FROM requests WHERE conversation_id = ANY($1)) AS "requests!",
             (SELECT COUNT(*) FROM all_runs WHERE conversation_id = ANY($1)) AS "runs!",
             (SELECT COUNT(*) FROM all_checkpoints WHERE conversation_id = ANY($1))
                 AS "loop_checkpoints!",
             (SELECT COUNT(*) FROM verification_reports WHERE conversation_id = ANY($1))
                 AS "verification_reports!",
             (SELECT COUNT(*) FROM tool_calls WHERE conversation_id = ANY($1)) AS "tool_calls!",
             (SELECT COUNT(*) FROM approvals WHERE conversation_id = ANY($1)) AS "approvals!",
             (SELECT COUNT(*) FROM run_messages WHERE conversation_id = ANY($1))
                 AS "run_messages!",
             (SELECT COUNT(*) FROM events WHERE conversation_id = ANY($1))
             + (SELECT COUNT(admitted_event) + COUNT(settled_event) FROM requests
                WHERE conversation_id = ANY($1)) AS "events!""#,
        &ids
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(db("count conversation rows"))?;
    let gone = sqlx::query_scalar!(
        r#"WITH keys AS (
               DELETE FROM request_ids WHERE conversation_id = ANY($1)
           ), gone AS (
               DELETE FROM conversations WHERE conversation_id = ANY($1) RETURNING 1
           )
           SELECT COUNT(*) AS "gone!" FROM gone"#,
        &ids
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(db("delete conversations"))?;
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    deleted.conversations += n(gone);
    deleted.admissions += n(gone);
    deleted.transcript += n(counts.transcript);
    deleted.requests += n(counts.requests);
    deleted.runs += n(counts.runs);
    deleted.loop_checkpoints += n(counts.loop_checkpoints);
    deleted.verification_reports += n(counts.verification_reports);
    deleted.tool_calls += n(counts.tool_calls);
    deleted.approvals += n(counts.approvals);
    deleted.run_messages += n(counts.run_messages);
    deleted.events += n(counts.events);
    Ok(ids.len() as i64)
}
