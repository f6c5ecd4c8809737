//! Listings: conversations, requests and runs, newest first, or only what
//! stuck admissions hold. Each listing selects at most `limit` keys with
//! one query (its filters are optional parameters), then reads each row's
//! details by key, all in one repeatable-read transaction: one snapshot.

use std::time::Duration;

use sqlx::PgConnection;
use uuid::Uuid;

use super::cutoff;
use super::page::conversation_page;
use crate::codec::{db, now_ms, text, Row};
use crate::PostgresStore;
use turnstile_core::admin::{
    CheckpointMark, ConversationPage, ConversationSummary, HeldAdmission, ListFilter,
    RequestSummary, RunSummary,
};
use turnstile_core::backend::is_stuck;
use turnstile_core::checkpoint::CheckpointPhase;
use turnstile_core::ids::{ConversationId, Namespace, RequestId, Revision, RunId};
use turnstile_core::store::{RequestStatus, RunStatus};
use turnstile_core::Error;

/// A read-only transaction on one snapshot.
async fn snapshot(
    store: &PostgresStore,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, Error> {
    let mut tx = store.pool.begin().await.map_err(db("begin read"))?;
    sqlx::query!("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await
        .map_err(db("begin read"))?;
    Ok(tx)
}

/// The filter's parts as query parameters.
struct Keys<'a> {
    namespace: Option<&'a str>,
    conversation: Option<Uuid>,
    cutoff: i64,
    limit: i64,
    /// A lease expired before this (Unix milliseconds) is stuck.
    now: i64,
}

fn keys(filter: &ListFilter) -> Keys<'_> {
    Keys {
        now: now_ms(),
        namespace: filter.namespace.as_ref().map(Namespace::as_str),
        conversation: filter.conversation_id.map(|id| id.as_uuid()),
        cutoff: cutoff(filter.stale_after),
        limit: i64::from(filter.limit),
    }
}

/// The keys `(conversation, request, run)` of stuck admissions, stalest
/// first, ties by conversation id: held by a run that is not `running`,
/// has no row, or left the admission unchanged since the cutoff or,
/// holding a lease, let it expire, for a request that awaits no approval
/// (the rule of [`is_stuck`]).
async fn stuck_keys(
    conn: &mut PgConnection,
    k: &Keys<'_>,
) -> Result<Vec<(Uuid, Uuid, Option<Uuid>)>, Error> {
    let rows = sqlx::query!(
        r#"SELECT a.conversation_id, a.active_request_id AS "request_id!", a.run_id
           FROM admissions a
           JOIN conversations c ON c.conversation_id = a.conversation_id
           -- The holding run's status, looked up by its key: a scalar
           -- subquery, which the planner keeps per row (a join to the view
           -- would scan its every place).
           CROSS JOIN LATERAL (
               SELECT (SELECT r.status FROM all_runs r
                       WHERE r.conversation_id = a.conversation_id AND r.run_id = a.run_id)
                   AS status
           ) ru
           WHERE a.active_request_id IS NOT NULL
             AND (ru.status IS NULL OR ru.status <> 'running'
                  OR CASE WHEN a.lease_expires_at IS NULL THEN a.updated_at < $1
                          ELSE a.lease_expires_at < $5 END)
             AND NOT EXISTS (SELECT 1 FROM approvals ap
                          JOIN tool_calls t ON t.conversation_id = ap.conversation_id
                              AND t.request_id = ap.request_id AND t.turn = ap.turn
                              AND t.position = ap.position AND t.status = 'requested'
                          WHERE ap.conversation_id = a.conversation_id
                              AND ap.request_id = a.active_request_id AND ap.status = 'awaiting')
             AND ($2::text IS NULL OR c.namespace = $2)
             AND ($3::uuid IS NULL OR a.conversation_id = $3)
           ORDER BY a.updated_at, a.conversation_id LIMIT $4"#,
        k.cutoff,
        k.namespace,
        k.conversation,
        k.limit,
        k.now
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db("list stuck admissions"))?;
    Ok(rows
        .into_iter()
        .map(|r| (r.conversation_id, r.request_id, r.run_id))
        .collect())
}

pub(super) async fn list_conversations(
    store: &PostgresStore,
    filter: &ListFilter,
) -> Result<ConversationPage, Error> {
    filter.check_conversation_filters()?;
    let mut tx = snapshot(store).await?;
    let k = keys(filter);
    let (ids, next): (Vec<Uuid>, _) = if filter.stuck_only {
        let keys = stuck_keys(&mut tx, &k).await?;
        (keys.into_iter().map(|k| k.0).collect(), None)
    } else {
        conversation_page(&mut tx, filter).await?
    };
    let mut conversations = Vec::with_capacity(ids.len());
    for id in ids {
        let summary = conversation_summary(&mut tx, id, k.cutoff).await?;
        conversations.extend(summary.filter(|s| filter.admits(s)));
    }
    Ok(ConversationPage {
        conversations,
        next,
    })
}

pub(super) async fn one_conversation(
    store: &PostgresStore,
    id: ConversationId,
    stale_after: Duration,
) -> Result<Option<ConversationSummary>, Error> {
    let mut tx = snapshot(store).await?;
    conversation_summary(&mut tx, id.as_uuid(), cutoff(stale_after)).await
}

pub(super) async fn list_requests(
    store: &PostgresStore,
    filter: &ListFilter,
) -> Result<Vec<RequestSummary>, Error> {
    let mut tx = snapshot(store).await?;
    let k = keys(filter);
    let ids: Vec<Uuid> = if filter.stuck_only {
        stuck_keys(&mut tx, &k)
            .await?
            .into_iter()
            .map(|k| k.1)
            .collect()
    } else {
        sqlx::query_scalar!(
            "SELECT r.request_id FROM requests r
             JOIN conversations c ON c.conversation_id = r.conversation_id
             WHERE ($1::text IS NULL OR c.namespace = $1)
               AND ($2::uuid IS NULL OR r.conversation_id = $2)
             ORDER BY r.created_at DESC, r.request_id DESC LIMIT $3",
            k.namespace,
            k.conversation,
            k.limit
        )
        .fetch_all(&mut *tx)
        .await
        .map_err(db("list requests"))?
    };
    let mut summaries = Vec::with_capacity(ids.len());
    for id in ids {
        summaries.extend(request_summary(&mut tx, id, k.cutoff).await?);
    }
    Ok(summaries)
}

pub(super) async fn list_runs(
    store: &PostgresStore,
    filter: &ListFilter,
) -> Result<Vec<RunSummary>, Error> {
    let mut tx = snapshot(store).await?;
    let k = keys(filter);
    // Newest first by start: a request's first run carries the request's
    // id (`RunId::first_of`), not a time-ordered one.
    let ids: Vec<Uuid> = if filter.stuck_only {
        stuck_keys(&mut tx, &k)
            .await?
            .into_iter()
            .filter_map(|k| k.2)
            .collect()
    } else {
        sqlx::query_scalar!(
            r#"SELECT ru.run_id AS "run_id!" FROM all_runs ru
             JOIN conversations c ON c.conversation_id = ru.conversation_id
             WHERE ($1::text IS NULL OR c.namespace = $1)
               AND ($2::uuid IS NULL OR ru.conversation_id = $2)
             ORDER BY ru.started_at DESC, ru.run_id DESC LIMIT $3"#,
            k.namespace,
            k.conversation,
            k.limit
        )
        .fetch_all(&mut *tx)
        .await
        .map_err(db("list runs"))?
    };
    let mut summaries = Vec::with_capacity(ids.len());
    for id in ids {
        summaries.extend(run_summary(&mut tx, id, k.cutoff).await?);
    }
    Ok(summaries)
}

pub(super) async fn one_run(
    store: &PostgresStore,
    run_id: RunId,
    stale_after: Duration,
) -> Result<Option<RunSummary>, Error> {
    let mut tx = snapshot(store).await?;
    run_summary(&mut tx, run_id.as_uuid(), cutoff(stale_after)).await
}

async fn conversation_summary(
    conn: &mut PgConnection,
    id: Uuid,
    cutoff: i64,
) -> Result<Option<ConversationSummary>, Error> {
    let Some(row) = sqlx::query!(
        r#"SELECT c.namespace, c.version, c.created_at, a.revision, a.updated_at,
                  c.transcript_length AS "transcript_entries!"
           FROM conversations c JOIN admissions a ON a.conversation_id = c.conversation_id
           WHERE c.conversation_id = $1"#,
        id
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("load conversation summary"))?
    else {
        return Ok(None);
    };
    let key = Row {
        table: "conversations",
        key: &id,
    };
    let conversation_id = key.checked_id("conversation_id", id)?;
    Ok(Some(ConversationSummary {
        id: conversation_id,
        namespace: key.namespace(&row.namespace)?,
        version: key.u64("version", row.version)?,
        revision: Revision(key.u64("revision", row.revision)?),
        transcript_entries: key.u64("transcript_entries", row.transcript_entries)?,
        created_at: row.created_at,
        last_activity_at: row.updated_at,
        held: held_admission(&mut *conn, id, cutoff).await?,
        meta: crate::meta::meta_of(conn, conversation_id, false).await?.0,
    }))
}

async fn request_summary(
    conn: &mut PgConnection,
    id: Uuid,
    cutoff: i64,
) -> Result<Option<RequestSummary>, Error> {
    let Some(row) = sqlx::query!(
        r#"SELECT r.conversation_id, c.namespace, r.status, r.committed_run_id,
                  r.conversation_version, r.created_at, r.completed_at,
                  (SELECT COUNT(*) FROM all_runs ru WHERE ru.conversation_id = r.conversation_id
                       AND ru.request_id = r.request_id) AS "runs!",
                  (SELECT ru.run_id::text FROM all_runs ru
                   WHERE ru.conversation_id = r.conversation_id AND ru.request_id = r.request_id
                   ORDER BY ru.started_at DESC, ru.run_id DESC LIMIT 1) AS "newest_run?"
           FROM request_ids k
           JOIN requests r ON r.conversation_id = k.conversation_id AND r.request_id = k.request_id
           JOIN conversations c ON c.conversation_id = r.conversation_id
           WHERE k.request_id = $1"#,
        id
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("load request summary"))?
    else {
        return Ok(None);
    };
    let key = Row {
        table: "requests",
        key: &id,
    };
    let request_id: RequestId = key.checked_id("request_id", id)?;
    let held = held_admission(conn, row.conversation_id, cutoff)
        .await?
        .filter(|held| held.request_id == request_id);
    let newest = row
        .newest_run
        .map(|run| Uuid::parse_str(&run).map_err(|_| key.corrupt("run_id is not a uuid")))
        .transpose()?;
    let latest_run = match (row.committed_run_id, &held, newest) {
        (Some(committed), _, _) => Some(key.checked_id::<RunId>("committed_run_id", committed)?),
        (None, Some(held), _) => Some(held.run_id),
        (None, None, Some(newest)) => Some(key.checked_id::<RunId>("run_id", newest)?),
        (None, None, None) => None,
    };
    let (latest_run_status, last_checkpoint) = match latest_run {
        Some(run) => {
            let (status, _, mark) = run_position(conn, run).await?;
            (status, mark)
        }
        None => (None, None),
    };
    Ok(Some(RequestSummary {
        request_id,
        conversation_id: key.checked_id("conversation_id", row.conversation_id)?,
        namespace: key.namespace(&row.namespace)?,
        status: RequestStatus::parse(&row.status)
            .ok_or_else(|| key.corrupt(format!("unknown status {:?}", row.status)))?,
        conversation_version: row
            .conversation_version
            .map(|v| key.u64("conversation_version", v))
            .transpose()?,
        runs: key.u64("runs", row.runs)?,
        latest_run,
        latest_run_status,
        last_checkpoint,
        created_at: row.created_at,
        completed_at: row.completed_at,
        held,
    }))
}

async fn run_summary(
    conn: &mut PgConnection,
    id: Uuid,
    cutoff: i64,
) -> Result<Option<RunSummary>, Error> {
    let Some(row) = sqlx::query!(
        r#"SELECT ru.request_id AS "request_id!", ru.conversation_id AS "conversation_id!",
                  c.namespace, ru.resumed_from, ru.status AS "status!", ru.error,
                  ru.started_at AS "started_at!", ru.ended_at
           FROM all_runs ru JOIN conversations c ON c.conversation_id = ru.conversation_id
           WHERE ru.run_id = $1"#,
        id
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("load run summary"))?
    else {
        return Ok(None);
    };
    let key = Row {
        table: "runs",
        key: &id,
    };
    let run_id: RunId = key.checked_id("run_id", id)?;
    let (_, checkpoints, last_checkpoint) = run_position(conn, run_id).await?;
    Ok(Some(RunSummary {
        run_id,
        request_id: key.checked_id::<RequestId>("request_id", row.request_id)?,
        conversation_id: key.checked_id("conversation_id", row.conversation_id)?,
        namespace: key.namespace(&row.namespace)?,
        resumed_from: row
            .resumed_from
            .map(|r| key.checked_id("resumed_from", r))
            .transpose()?,
        status: RunStatus::parse(&row.status)
            .ok_or_else(|| key.corrupt(format!("unknown status {:?}", row.status)))?,
        error: row.error.map(|e| text(&key, "error", e)).transpose()?,
        checkpoints,
        last_checkpoint,
        started_at: row.started_at,
        ended_at: row.ended_at,
        held: held_admission(conn, row.conversation_id, cutoff)
            .await?
            .filter(|held| held.run_id == run_id),
    }))
}

/// The admission of a conversation, if an active request holds it.
async fn held_admission(
    conn: &mut PgConnection,
    conversation: Uuid,
    cutoff: i64,
) -> Result<Option<HeldAdmission>, Error> {
    let Some(row) = sqlx::query!(
        r#"SELECT a.revision, a.active_request_id AS "request_id!", a.run_id, a.updated_at,
                  a.lease_expires_at, EXISTS (SELECT 1 FROM approvals ap
                          JOIN tool_calls t ON t.conversation_id = ap.conversation_id
                              AND t.request_id = ap.request_id AND t.turn = ap.turn
                              AND t.position = ap.position AND t.status = 'requested'
                          WHERE ap.conversation_id = a.conversation_id
                              AND ap.request_id = a.active_request_id AND ap.status = 'awaiting') AS "awaiting_approval!"
           FROM admissions a
           WHERE a.conversation_id = $1 AND a.active_request_id IS NOT NULL"#,
        conversation
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("load held admission"))?
    else {
        return Ok(None);
    };
    let key = Row {
        table: "admissions",
        key: &conversation,
    };
    let conversation_id: ConversationId = key.checked_id("conversation_id", conversation)?;
    let run = row
        .run_id
        .ok_or_else(|| key.corrupt("held without a run_id"))?;
    let run_id = key.checked_id::<RunId>("run_id", run)?;
    let (run_status, _, last_checkpoint) = run_position(conn, run_id).await?;
    Ok(Some(HeldAdmission {
        conversation_id,
        revision: Revision(key.u64("revision", row.revision)?),
        request_id: key.checked_id::<RequestId>("active_request_id", row.request_id)?,
        run_id,
        run_status,
        updated_at: row.updated_at,
        last_checkpoint,
        stuck: is_stuck(
            run_status,
            row.awaiting_approval,
            row.updated_at,
            row.lease_expires_at,
            cutoff,
            now_ms(),
        ),
        lease_expires_at: row.lease_expires_at,
        awaiting_approval: row.awaiting_approval,
    }))
}

/// A run's status (`None` without a row), its number of checkpoint rows and
/// its latest one.
async fn run_position(
    conn: &mut PgConnection,
    run_id: RunId,
) -> Result<(Option<RunStatus>, u64, Option<CheckpointMark>), Error> {
    let row = sqlx::query!(
        r#"SELECT ru.status AS "status!",
                  (SELECT COUNT(*) FROM all_checkpoints c
                   WHERE c.conversation_id = ru.conversation_id AND c.run_id = ru.run_id)
                      AS "rows!",
                  l.turn AS "turn?", l.phase AS "phase?", l.created_at AS "created_at?"
           FROM all_runs ru
           LEFT JOIN LATERAL (
               SELECT turn, phase, created_at FROM all_checkpoints c
               WHERE c.conversation_id = ru.conversation_id AND c.run_id = ru.run_id
               ORDER BY turn DESC LIMIT 1
           ) l ON true
           WHERE ru.run_id = $1"#,
        run_id.as_uuid()
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("load latest checkpoint"))?;
    let Some(row) = row else {
        return Ok((None, 0, None));
    };
    let key = Row {
        table: "runs",
        key: &run_id,
    };
    let status = RunStatus::parse(&row.status)
        .ok_or_else(|| key.corrupt(format!("unknown status {:?}", row.status)))?;
    let mark = match (row.turn, row.phase, row.created_at) {
        (Some(turn), Some(phase), Some(created_at)) => Some(CheckpointMark {
            turn: key.u32("turn", turn)?,
            phase: CheckpointPhase::parse(&phase)
                .ok_or_else(|| key.corrupt(format!("unknown phase {phase:?}")))?,
            created_at,
        }),
        _ => None,
    };
    Ok((Some(status), key.u64("rows", row.rows)?, mark))
}
