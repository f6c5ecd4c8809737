//! Listings: conversations, requests and runs, newest first, or only what
//! stuck admissions hold.
//!
//! Each listing first selects at most `limit` keys with a query an index
//! serves (by conversation, by namespace, the held-admissions partial index
//! for `stuck_only`; all rows of a kind scan that table's small rows), then
//! reads each row's details by key. Everything is read in one read
//! transaction: one consistent snapshot.

use sqlx::SqliteConnection;
use uuid::Uuid;

use super::cutoff;
use super::page::conversation_page;
use crate::codec::{db, now_ms, Row};
use crate::SqliteStore;
use turnstile_core::admin::{
    CheckpointMark, ConversationPage, ConversationSummary, HeldAdmission, ListFilter,
    RequestSummary, RunSummary,
};
use turnstile_core::backend::is_stuck;
use turnstile_core::checkpoint::CheckpointPhase;
use turnstile_core::ids::{ConversationId, Namespace, RequestId, Revision, RunId};
use turnstile_core::store::{RequestStatus, RunStatus};
use turnstile_core::Error;

/// The keys of one stuck admission.
struct StuckKeys {
    conversation: Vec<u8>,
    request: Vec<u8>,
    run: Option<Vec<u8>>,
}

/// Conversations, newest first: header, admission, transcript length.
///
/// # Errors
/// [`Error::Store`] if the database fails; [`Error::Corrupt`] for an
/// undecodable row.
pub(super) async fn list_conversations(
    store: &SqliteStore,
    filter: &ListFilter,
) -> Result<ConversationPage, Error> {
    filter.check_conversation_filters()?;
    let mut reader = store.reader.acquire().await?;
    let mut tx = sqlx::Connection::begin(&mut *reader)
        .await
        .map_err(db("begin read"))?;
    let cutoff = cutoff(filter.stale_after);
    let (keys, next) = if filter.stuck_only {
        let keys = stuck_keys(&mut tx, filter, cutoff).await?;
        (keys.into_iter().map(|k| k.conversation).collect(), None)
    } else if let Some(id) = filter.conversation_id {
        (vec![id.as_uuid().as_bytes().to_vec()], None)
    } else {
        conversation_page(&mut tx, filter).await?
    };
    let mut conversations = Vec::with_capacity(keys.len());
    for key in keys {
        if let Some(summary) = conversation_summary(&mut tx, &key, cutoff).await? {
            if in_namespace(filter, &summary.namespace) && filter.admits(&summary) {
                conversations.push(summary);
            }
        }
    }
    Ok(ConversationPage {
        conversations,
        next,
    })
}

/// One conversation, in any namespace; `None` if it does not exist.
/// `stale_after` decides whether its admission is stuck.
///
/// # Errors
/// As [`SqliteStore::list_conversations`].
pub(super) async fn one_conversation(
    store: &SqliteStore,
    id: ConversationId,
    stale_after: std::time::Duration,
) -> Result<Option<ConversationSummary>, Error> {
    let mut reader = store.reader.acquire().await?;
    let mut tx = sqlx::Connection::begin(&mut *reader)
        .await
        .map_err(db("begin read"))?;
    conversation_summary(&mut tx, id.as_uuid().as_bytes(), cutoff(stale_after)).await
}

/// Requests, newest first: status, runs, where the latest run stands.
///
/// # Errors
/// As [`SqliteStore::list_conversations`].
pub(super) async fn list_requests(
    store: &SqliteStore,
    filter: &ListFilter,
) -> Result<Vec<RequestSummary>, Error> {
    let mut reader = store.reader.acquire().await?;
    let mut tx = sqlx::Connection::begin(&mut *reader)
        .await
        .map_err(db("begin read"))?;
    let cutoff = cutoff(filter.stale_after);
    let limit = i64::from(filter.limit);
    let keys: Vec<Vec<u8>> = if filter.stuck_only {
        stuck_keys(&mut tx, filter, cutoff)
            .await?
            .into_iter()
            .map(|k| k.request)
            .collect()
    } else if let Some(id) = filter.conversation_id {
        let id = id.as_uuid();
        sqlx::query_scalar!(
            "SELECT request_id FROM requests WHERE conversation_id = ?1
             ORDER BY created_at DESC LIMIT ?2",
            id,
            limit
        )
        .fetch_all(&mut *tx)
        .await
        .map_err(db("list requests"))?
    } else if let Some(namespace) = &filter.namespace {
        let namespace = namespace.as_str();
        sqlx::query_scalar!(
            "SELECT r.request_id FROM conversations c JOIN requests r ON r.conversation_id = c.id
             WHERE c.namespace = ?1 ORDER BY r.created_at DESC LIMIT ?2",
            namespace,
            limit
        )
        .fetch_all(&mut *tx)
        .await
        .map_err(db("list requests"))?
    } else {
        sqlx::query_scalar!(
            "SELECT request_id FROM requests ORDER BY created_at DESC LIMIT ?1",
            limit
        )
        .fetch_all(&mut *tx)
        .await
        .map_err(db("list requests"))?
    };
    let mut summaries = Vec::with_capacity(keys.len());
    for key in keys {
        if let Some(summary) = request_summary(&mut tx, &key, cutoff).await? {
            if in_namespace(filter, &summary.namespace) {
                summaries.push(summary);
            }
        }
    }
    Ok(summaries)
}

/// Runs, newest first by start (a first run carries its request's id): status, error,
/// checkpoints, and the admission while the run owns it.
///
/// # Errors
/// As [`SqliteStore::list_conversations`].
pub(super) async fn list_runs(
    store: &SqliteStore,
    filter: &ListFilter,
) -> Result<Vec<RunSummary>, Error> {
    let mut reader = store.reader.acquire().await?;
    let mut tx = sqlx::Connection::begin(&mut *reader)
        .await
        .map_err(db("begin read"))?;
    let cutoff = cutoff(filter.stale_after);
    let limit = i64::from(filter.limit);
    let keys: Vec<Vec<u8>> = if filter.stuck_only {
        stuck_keys(&mut tx, filter, cutoff)
            .await?
            .into_iter()
            .filter_map(|k| k.run)
            .collect()
    } else if let Some(id) = filter.conversation_id {
        let id = id.as_uuid();
        // Both places by hand: SQLite pushes no `IN` filter into `all_runs`,
        // and would read it whole.
        sqlx::query_scalar!(
            "SELECT run_id FROM (
                 SELECT r.request_id AS run_id, r.created_at AS started_at FROM requests r
                 WHERE r.conversation_id = ?1 AND r.run_status IS NOT NULL
                 UNION ALL
                 SELECT ru.run_id, ru.started_at FROM requests r
                 JOIN runs ru ON ru.request_id = r.request_id
                 WHERE r.conversation_id = ?1)
             ORDER BY started_at DESC, run_id DESC LIMIT ?2",
            id,
            limit
        )
        .fetch_all(&mut *tx)
        .await
        .map_err(db("list runs"))?
    } else if let Some(namespace) = &filter.namespace {
        let namespace = namespace.as_str();
        sqlx::query_scalar!(
            "SELECT run_id FROM (
                 SELECT r.request_id AS run_id, r.created_at AS started_at FROM conversations c
                 JOIN requests r ON r.conversation_id = c.id
                 WHERE c.namespace = ?1 AND r.run_status IS NOT NULL
                 UNION ALL
                 SELECT ru.run_id, ru.started_at FROM conversations c
                 JOIN requests r ON r.conversation_id = c.id
                 JOIN runs ru ON ru.request_id = r.request_id
                 WHERE c.namespace = ?1)
             ORDER BY started_at DESC, run_id DESC LIMIT ?2",
            namespace,
            limit
        )
        .fetch_all(&mut *tx)
        .await
        .map_err(db("list runs"))?
    } else {
        sqlx::query_scalar!(
            r#"SELECT run_id AS "run_id!: Vec<u8>" FROM all_runs
               ORDER BY started_at DESC, run_id DESC LIMIT ?1"#,
            limit
        )
        .fetch_all(&mut *tx)
        .await
        .map_err(db("list runs"))?
    };
    let mut summaries = Vec::with_capacity(keys.len());
    for key in keys {
        if let Some(summary) = run_summary(&mut tx, &key, cutoff).await? {
            if in_namespace(filter, &summary.namespace) {
                summaries.push(summary);
            }
        }
    }
    Ok(summaries)
}

/// One run, or `None` if it does not exist.
///
/// # Errors
/// As [`SqliteStore::list_conversations`].
pub(super) async fn one_run(
    store: &SqliteStore,
    run_id: RunId,
    stale_after: std::time::Duration,
) -> Result<Option<RunSummary>, Error> {
    let mut reader = store.reader.acquire().await?;
    let mut tx = sqlx::Connection::begin(&mut *reader)
        .await
        .map_err(db("begin read"))?;
    run_summary(&mut tx, run_id.as_uuid().as_bytes(), cutoff(stale_after)).await
}

fn in_namespace(filter: &ListFilter, namespace: &Namespace) -> bool {
    filter.namespace.as_ref().is_none_or(|ns| ns == namespace)
}

/// The keys of stuck admissions, stalest first, ties by conversation id:
/// held, and owned by a run that is not `running`, has no row, or left the
/// admission unchanged since `cutoff` or, when it holds a lease, let it
/// expire, and whose request awaits no approval (the rule of [`is_stuck`]).
/// Served by the held-admissions index.
async fn stuck_keys(
    conn: &mut SqliteConnection,
    filter: &ListFilter,
    cutoff: i64,
) -> Result<Vec<StuckKeys>, Error> {
    let namespace = filter.namespace.as_ref().map(Namespace::as_str);
    let conversation = filter.conversation_id.map(|id| id.as_uuid());
    let limit = i64::from(filter.limit);
    let now = now_ms();
    let rows = sqlx::query!(
        r#"SELECT a.conversation_id, a.active_request_id AS "request_id!", a.run_id
           FROM admissions a
           JOIN conversations c ON c.id = a.conversation_id
           WHERE a.active_request_id IS NOT NULL
             AND (NOT EXISTS (SELECT 1 FROM all_runs WHERE run_id = a.run_id AND status = 'running')
                  OR CASE WHEN a.lease_expires_at IS NULL THEN a.updated_at < ?1
                          ELSE a.lease_expires_at < ?5 END)
             AND NOT EXISTS (SELECT 1 FROM approvals ap
                          JOIN tool_calls t ON t.request_id = ap.request_id AND t.turn = ap.turn
                              AND t.call_id = ap.call_id AND t.status = 'requested'
                          WHERE ap.request_id = a.active_request_id AND ap.status = 'awaiting')
             AND (?2 IS NULL OR c.namespace = ?2)
             AND (?3 IS NULL OR a.conversation_id = ?3)
           ORDER BY a.updated_at, a.conversation_id LIMIT ?4"#,
        cutoff,
        namespace,
        conversation,
        limit,
        now
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db("list stuck admissions"))?;
    Ok(rows
        .into_iter()
        .map(|r| StuckKeys {
            conversation: r.conversation_id,
            request: r.request_id,
            run: r.run_id,
        })
        .collect())
}

async fn conversation_summary(
    conn: &mut SqliteConnection,
    id: &[u8],
    cutoff: i64,
) -> Result<Option<ConversationSummary>, Error> {
    let Some(row) = sqlx::query!(
        r#"SELECT c.namespace, c.version, c.created_at, a.revision, a.updated_at,
                  c.transcript_length AS "transcript_entries!: i64"
           FROM conversations c JOIN admissions a ON a.conversation_id = c.id
           WHERE c.id = ?1"#,
        id
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("load conversation summary"))?
    else {
        return Ok(None);
    };
    let id = uuid_of("conversations", "id", id)?;
    let key = Row {
        table: "conversations",
        key: &id,
    };
    let conversation_id = key.checked_id("id", id)?;
    Ok(Some(ConversationSummary {
        id: conversation_id,
        namespace: key.namespace(&row.namespace)?,
        version: key.u64("version", row.version)?,
        revision: Revision(key.u64("revision", row.revision)?),
        transcript_entries: key.u64("transcript_entries", row.transcript_entries)?,
        created_at: row.created_at,
        last_activity_at: row.updated_at,
        held: held_admission(&mut *conn, id, cutoff).await?,
        meta: crate::meta::meta_of(conn, conversation_id).await?,
    }))
}

async fn request_summary(
    conn: &mut SqliteConnection,
    id: &[u8],
    cutoff: i64,
) -> Result<Option<RequestSummary>, Error> {
    let Some(row) = sqlx::query!(
        r#"SELECT r.conversation_id, c.namespace, r.status, r.committed_run_id,
                  r.conversation_version, r.created_at, r.completed_at,
                  (SELECT COUNT(*) FROM runs WHERE request_id = r.request_id)
                      + (r.run_status IS NOT NULL) AS "runs!: i64",
                  -- Runs after a folded first one are in `runs`, time-ordered.
                  COALESCE((SELECT MAX(run_id) FROM runs WHERE request_id = r.request_id),
                           IIF(r.run_status IS NOT NULL, r.request_id, NULL))
                      AS "newest_run?: Vec<u8>"
           FROM requests r JOIN conversations c ON c.id = r.conversation_id
           WHERE r.request_id = ?1"#,
        id
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("load request summary"))?
    else {
        return Ok(None);
    };
    let request_id: RequestId = id_of("requests", "request_id", id)?;
    let key = Row {
        table: "requests",
        key: &request_id,
    };
    let conversation = key.uuid("conversation_id", &row.conversation_id)?;
    let held = held_admission(conn, conversation, cutoff)
        .await?
        .filter(|held| held.request_id == request_id);
    let latest_run = match (&row.committed_run_id, &held, &row.newest_run) {
        (Some(committed), _, _) => Some(key.id::<RunId>("committed_run_id", committed)?),
        (None, Some(held), _) => Some(held.run_id),
        (None, None, Some(newest)) => Some(key.id::<RunId>("run_id", newest)?),
        (None, None, None) => None,
    };
    let (latest_run_status, last_checkpoint) = match latest_run {
        Some(run) => {
            let status = run_status(conn, run).await?;
            (status, run_position(conn, run).await?.1)
        }
        None => (None, None),
    };
    Ok(Some(RequestSummary {
        request_id,
        conversation_id: key.checked_id("conversation_id", conversation)?,
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
    conn: &mut SqliteConnection,
    id: &[u8],
    cutoff: i64,
) -> Result<Option<RunSummary>, Error> {
    let Some(row) = sqlx::query!(
        "SELECT ru.request_id, r.conversation_id, c.namespace, ru.resumed_from, ru.status,
                ru.error, ru.started_at, ru.ended_at
         FROM (SELECT * FROM all_runs WHERE run_id = ?1) ru
         JOIN requests r ON r.request_id = ru.request_id
         JOIN conversations c ON c.id = r.conversation_id",
        id
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("load run summary"))?
    else {
        return Ok(None);
    };
    let run_id: RunId = id_of("runs", "run_id", id)?;
    let key = Row {
        table: "runs",
        key: &run_id,
    };
    let conversation = key.uuid("conversation_id", &row.conversation_id)?;
    let (checkpoints, last_checkpoint) = run_position(conn, run_id).await?;
    Ok(Some(RunSummary {
        run_id,
        request_id: key.id::<RequestId>("request_id", &row.request_id)?,
        conversation_id: key.checked_id("conversation_id", conversation)?,
        namespace: key.namespace(&row.namespace)?,
        resumed_from: row
            .resumed_from
            .map(|r| key.id("resumed_from", &r))
            .transpose()?,
        status: RunStatus::parse(&row.status)
            .ok_or_else(|| key.corrupt(format!("unknown status {:?}", row.status)))?,
        error: row.error,
        checkpoints,
        last_checkpoint,
        started_at: row.started_at,
        ended_at: row.ended_at,
        held: held_admission(conn, conversation, cutoff)
            .await?
            .filter(|held| held.run_id == run_id),
    }))
}

/// The admission of a conversation, if an active request holds it.
async fn held_admission(
    conn: &mut SqliteConnection,
    conversation: Uuid,
    cutoff: i64,
) -> Result<Option<HeldAdmission>, Error> {
    let Some(row) = sqlx::query!(
        r#"SELECT a.revision, a.active_request_id AS "request_id!", a.run_id, a.updated_at,
                  a.lease_expires_at,
                  (SELECT status FROM all_runs WHERE run_id = a.run_id) AS "run_status?: String",
                  EXISTS (SELECT 1 FROM approvals ap
                          JOIN tool_calls t ON t.request_id = ap.request_id AND t.turn = ap.turn
                              AND t.call_id = ap.call_id AND t.status = 'requested'
                          WHERE ap.request_id = a.active_request_id AND ap.status = 'awaiting') AS "awaiting_approval!: bool"
           FROM admissions a
           WHERE a.conversation_id = ?1 AND a.active_request_id IS NOT NULL"#,
        conversation
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("load held admission"))?
    else {
        return Ok(None);
    };
    let conversation_id: ConversationId = Row {
        table: "admissions",
        key: &conversation,
    }
    .checked_id("conversation_id", conversation)?;
    let key = Row {
        table: "admissions",
        key: &conversation_id,
    };
    let run = row
        .run_id
        .ok_or_else(|| key.corrupt("held without a run_id"))?;
    let run_id = key.id::<RunId>("run_id", &run)?;
    let run_status = match row.run_status {
        Some(status) => Some(
            RunStatus::parse(&status)
                .ok_or_else(|| key.corrupt(format!("run has unknown status {status:?}")))?,
        ),
        None => None,
    };
    Ok(Some(HeldAdmission {
        conversation_id,
        revision: Revision(key.u64("revision", row.revision)?),
        request_id: key.id::<RequestId>("active_request_id", &row.request_id)?,
        run_id,
        run_status,
        updated_at: row.updated_at,
        last_checkpoint: run_position(conn, run_id).await?.1,
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

async fn run_status(
    conn: &mut SqliteConnection,
    run_id: RunId,
) -> Result<Option<RunStatus>, Error> {
    let uuid = run_id.as_uuid();
    let status = sqlx::query_scalar!("SELECT status FROM all_runs WHERE run_id = ?1", uuid)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db("load run status"))?;
    status
        .map(|s| {
            RunStatus::parse(&s).ok_or_else(|| {
                Row {
                    table: "runs",
                    key: &run_id,
                }
                .corrupt(format!("unknown status {s:?}"))
            })
        })
        .transpose()
}

/// A run's number of checkpoint rows and its latest one.
async fn run_position(
    conn: &mut SqliteConnection,
    run_id: RunId,
) -> Result<(u64, Option<CheckpointMark>), Error> {
    let uuid = run_id.as_uuid();
    let row = sqlx::query!(
        r#"SELECT turn, phase, created_at,
                  (SELECT COUNT(*) FROM all_checkpoints WHERE run_id = ?1) AS "rows!: i64"
           FROM all_checkpoints WHERE run_id = ?1 ORDER BY turn DESC LIMIT 1"#,
        uuid
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("load latest checkpoint"))?;
    let Some(row) = row else {
        return Ok((0, None));
    };
    let key = format!("{run_id}/{}", row.turn);
    let key = Row {
        table: "loop_checkpoints",
        key: &key,
    };
    Ok((
        key.u64("rows", row.rows)?,
        Some(CheckpointMark {
            turn: key.u32("turn", row.turn)?,
            phase: CheckpointPhase::parse(&row.phase)
                .ok_or_else(|| key.corrupt(format!("unknown phase {:?}", row.phase)))?,
            created_at: row.created_at,
        }),
    ))
}

fn uuid_of(table: &'static str, column: &str, bytes: &[u8]) -> Result<Uuid, Error> {
    Uuid::from_slice(bytes).map_err(|_| Error::Corrupt {
        table,
        key: format!("{bytes:02x?}"),
        reason: format!("{column} is not a 16-byte uuid"),
    })
}

/// A row's own id, before a [`Row`] can name it.
pub(super) fn id_of<T: TryFrom<Uuid>>(
    table: &'static str,
    column: &str,
    bytes: &[u8],
) -> Result<T, Error> {
    let uuid = uuid_of(table, column, bytes)?;
    Row { table, key: &uuid }.checked_id(column, uuid)
}
