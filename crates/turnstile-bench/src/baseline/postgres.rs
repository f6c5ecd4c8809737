//! The PostgreSQL floor and what the bench needs of the server besides the
//! store: a bare single-row `INSERT` committing on its own (autocommit)
//! through sqlx, on one connection and on many at once; the server's
//! settings; and dropping the schemas a bench made.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection};
use tokio::task::JoinSet;
use turnstile::PostgresOptions;

use super::{BaselineError, Commits};

/// Says how the floor was written, for the report.
pub const WHAT: &str = "a single-row INSERT committing on its own (autocommit) through sqlx";

/// How long dropping a bench schema may wait for a lock.
const DROP_LOCK_TIMEOUT: &str = "10s";

const BARE_TABLE: &str = "CREATE TABLE bare_commit (id bigserial PRIMARY KEY, \
                          created_at bigint NOT NULL, body text NOT NULL)";
const BARE_INSERT: &str = "INSERT INTO bare_commit (created_at, body) VALUES ($1, $2)";

/// The settings of the server that decide how a commit reaches the disk.
#[derive(Debug)]
pub struct ServerSettings {
    /// `server_version`.
    pub version: String,
    /// `synchronous_commit`.
    pub synchronous_commit: String,
    /// `fsync`.
    pub fsync: String,
}

/// The floor on one connection and on many.
#[derive(Debug)]
pub struct Floor {
    /// The commits on one connection.
    pub single_connection: Commits,
    /// The commits spread over the connections at once.
    pub concurrent: Commits,
}

/// The server's settings.
///
/// # Errors
/// A connection that could not be opened, or the query.
pub async fn settings(url: &str) -> Result<ServerSettings, BaselineError> {
    let mut conn = connect_in_schema(url, None).await?;
    let (version, synchronous_commit, fsync) = sqlx::query_as::<_, (String, String, String)>(
        "SELECT current_setting('server_version'), current_setting('synchronous_commit'), \
                current_setting('fsync')",
    )
    .fetch_one(&mut conn)
    .await
    .map_err(failed("read the server's settings"))?;
    let _ = conn.close().await;
    Ok(ServerSettings {
        version,
        synchronous_commit,
        fsync,
    })
}

/// Drops each of `schemas` (`DROP SCHEMA … CASCADE`, names the bench made:
/// `turnstile_bench_` and hex digits); whether all went. What could not be
/// dropped is logged.
pub async fn drop_schemas(url: &str, schemas: &[String]) -> bool {
    if schemas.is_empty() {
        return true;
    }
    let mut conn = match connect_in_schema(url, None).await {
        Ok(conn) => conn,
        Err(error) => {
            tracing::warn!(%error, ?schemas, "could not drop the bench schemas");
            return false;
        }
    };
    let mut dropped = true;
    let set = format!("SET lock_timeout = '{DROP_LOCK_TIMEOUT}'");
    let _ = sqlx::query(&set).execute(&mut conn).await;
    for schema in schemas {
        let sql = format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE");
        if let Err(error) = sqlx::query(&sql).execute(&mut conn).await {
            tracing::warn!(%error, schema, "could not drop a bench schema");
            dropped = false;
        }
    }
    let _ = conn.close().await;
    dropped
}

/// The floor, in a new schema `schema` (a name the bench made): `commits`
/// single-row INSERTs of `body`, each its own transaction, on one
/// connection; then as many again spread over `connections` at once. Each
/// connection is opened (and its statement prepared) before the clock
/// starts.
///
/// # Errors
/// What failed, as `<step>: <cause>`.
pub async fn measure(
    url: &str,
    schema: &str,
    commits: u64,
    body: String,
    connections: u32,
) -> Result<Floor, BaselineError> {
    let body = Arc::new(body);
    let mut setup = connect_in_schema(url, None).await?;
    sqlx::query(&format!("CREATE SCHEMA \"{schema}\""))
        .execute(&mut setup)
        .await
        .map_err(failed("create the baseline schema"))?;
    let _ = setup.close().await;
    let mut conn = connect_in_schema(url, Some(schema)).await?;
    sqlx::query(BARE_TABLE)
        .execute(&mut conn)
        .await
        .map_err(failed("create the baseline table"))?;
    insert(&mut conn, &body).await?;
    let started = Instant::now();
    let latencies = inserts(&mut conn, commits, &body).await?;
    let single_connection = Commits {
        latencies,
        wall: started.elapsed(),
    };
    let _ = conn.close().await;

    let each = commits.div_ceil(u64::from(connections.max(1)));
    let mut conns = Vec::with_capacity(connections as usize);
    for _ in 0..connections {
        let mut conn = connect_in_schema(url, Some(schema)).await?;
        insert(&mut conn, &body).await?;
        conns.push(conn);
    }
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for mut conn in conns {
        let body = body.clone();
        tasks.spawn(async move {
            let latencies = inserts(&mut conn, each, &body).await;
            let _ = conn.close().await;
            latencies
        });
    }
    let mut latencies = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let part =
            joined.map_err(|e| BaselineError::new(format!("a baseline task failed: {e}")))?;
        latencies.extend(part?);
    }
    Ok(Floor {
        single_connection,
        concurrent: Commits {
            latencies,
            wall: started.elapsed(),
        },
    })
}

/// A plain connection to `url` with `search_path` set to `schema`.
async fn connect_in_schema(url: &str, schema: Option<&str>) -> Result<PgConnection, BaselineError> {
    let location = PostgresOptions::new(url)
        .location()
        .map_err(|e| BaselineError::new(e.to_string()))?;
    let mut options = url
        .parse::<PgConnectOptions>()
        .map_err(|e| BaselineError::new(format!("invalid PostgreSQL URL: {e}")))?
        .application_name("turnstile-bench");
    if let Some(schema) = schema {
        options = options.options([("search_path", schema)]);
    }
    options
        .connect()
        .await
        .map_err(|e| BaselineError::new(format!("cannot connect to {location}: {e}")))
}

async fn insert(conn: &mut PgConnection, body: &str) -> Result<(), BaselineError> {
    sqlx::query(BARE_INSERT)
        .bind(now_ms())
        .bind(body)
        .execute(conn)
        .await
        .map_err(failed("insert a baseline row"))?;
    Ok(())
}

async fn inserts(
    conn: &mut PgConnection,
    commits: u64,
    body: &str,
) -> Result<Vec<Duration>, BaselineError> {
    let mut latencies = Vec::with_capacity(commits as usize);
    for _ in 0..commits {
        let started = Instant::now();
        insert(conn, body).await?;
        latencies.push(started.elapsed());
    }
    Ok(latencies)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn failed(what: &'static str) -> impl FnOnce(sqlx::Error) -> BaselineError {
    move |e| BaselineError::new(format!("{what}: {e}"))
}
