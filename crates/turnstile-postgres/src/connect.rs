//! Connecting: the pool, the schema check and the embedded migrations.

use std::str::FromStr;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};
use tracing::instrument;

use super::codec::{db, sqlstate, unreachable};
use super::retry::retrying;
use super::{PostgresOptions, PostgresStore};
use turnstile_core::{Error, StoreError};

static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// How long a pooled connection may sit idle and still be used without a
/// ping first.
const IDLE_BEFORE_PING: Duration = Duration::from_secs(1);

/// The SQLSTATE of a server that has no database of the name asked for
/// (`invalid_catalog_name`).
const NO_SUCH_DATABASE: &str = "3D000";

impl PostgresOptions {
    /// Where [`url`](Self::url) points, as the store reports it:
    /// `postgres://user@host:port/database`, never the password. Checks the
    /// URL as [`PostgresStore::connect_with`] does, without connecting.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a malformed URL; its message names the
    /// part that is wrong, never its value.
    pub fn location(&self) -> Result<String, Error> {
        Ok(location(&parse_url(&self.url)?))
    }
}

impl PostgresStore {
    /// Connects with the default options (see [`PostgresOptions`]) and
    /// migrates the database to this build's schema. `url` is a libpq-style
    /// URL (`postgres://user@host:port/database`); a password left out of it
    /// is taken from `PGPASSWORD` or `~/.pgpass`, as libpq does, and so are
    /// the other `PG*` variables.
    ///
    /// # Errors
    /// Each way connecting can fail is told apart without a driver type:
    /// - [`Error::InvalidInput`] for a malformed URL or schema name;
    /// - [`Error::Store`] marked
    ///   [unreachable](turnstile_core::StoreError::is_unreachable) when no
    ///   connection could be opened: nothing listens at the address, the
    ///   host is unknown, the server refused the login, or no connection
    ///   came within
    ///   [`acquire_timeout`](PostgresOptions::acquire_timeout). Its
    ///   [message](turnstile_core::StoreError::message) is `connect: ` and
    ///   the cause; a server still starting is retried first;
    /// - [`Error::NotFound`] with `what: "database"` (and the
    ///   [location](PostgresStore::location) as `id`) when the server
    ///   answered that it has no such database (SQLite answers a missing
    ///   file the same way); nothing is created;
    /// - [`Error::SchemaTooNew`] for a database written by a newer
    ///   turnstile (left untouched);
    /// - [`Error::Store`] for any other failure of the database.
    pub async fn connect(url: &str) -> Result<Self, Error> {
        Self::connect_with(PostgresOptions::new(url)).await
    }

    /// Connects with `options`.
    ///
    /// # Errors
    /// As [`PostgresStore::connect`]; with
    /// [`existing_only`](PostgresOptions::existing_only),
    /// [`Error::NotFound`] with `what: "turnstile schema"` for a database
    /// without the schema (told apart from `what: "database"`, a database
    /// the server does not have) and [`Error::SchemaTooOld`] for an older
    /// one.
    #[instrument(skip_all, err)]
    pub async fn connect_with(options: PostgresOptions) -> Result<Self, Error> {
        let mut connect = parse_url(&options.url)?.application_name("turnstile");
        let location = location(&connect);
        if let Some(schema) = &options.schema {
            check_schema_name(schema)?;
            connect = connect.options([("search_path", schema.as_str())]);
        }
        // A transaction of the store never waits for anything but its own
        // statements; one left open by a client that froze or lost its
        // network would hold its conversation's admission lock until TCP
        // gave up (hours). The server ends it after this long instead.
        connect = connect.options([("idle_in_transaction_session_timeout", "30000")]);
        if let Some(timeout) = options.statement_timeout {
            let millis = timeout.as_millis().clamp(1, i32::MAX as u128).to_string();
            connect = connect.options([("statement_timeout", millis.as_str())]);
        }
        first_connection(&connect, &location, options.acquire_timeout).await?;
        let pool = PgPoolOptions::new()
            .max_connections(options.pool_size.max(1))
            .acquire_timeout(options.acquire_timeout)
            // A connection in steady use is not pinged before each step (a
            // round trip as dear as the step's own); one that sat idle may
            // have been dropped by the server or the network, and is pinged
            // first. A connection that fails mid-step is closed, not reused
            // (`retry.rs`).
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    Ok(meta.idle_for < IDLE_BEFORE_PING || conn.ping().await.is_ok())
                })
            })
            .connect_lazy_with(connect);
        let store = PostgresStore {
            pool,
            location,
            schema: options.schema.clone(),
            part_limits: options.part_limits,
            claim_memory: Default::default(),
        };
        retrying!(|_retry| store.prepare_schema(options.existing_only))?;
        Ok(store)
    }

    /// The schema version this build reads and writes.
    pub fn supported_schema_version() -> i64 {
        MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
    }

    async fn prepare_schema(&self, existing_only: bool) -> Result<(), Error> {
        let supported = Self::supported_schema_version();
        if let (Some(schema), false) = (&self.schema, existing_only) {
            create_schema(&self.pool, schema).await?;
        }
        match (schema_version(&self.pool).await?, existing_only) {
            (Some(found), _) if found > supported => Err(Error::SchemaTooNew { found, supported }),
            (None, true) => Err(Error::NotFound {
                what: "turnstile schema",
                id: self.location.clone(),
            }),
            (Some(found), true) if found < supported => {
                Err(Error::SchemaTooOld { found, supported })
            }
            (_, true) => Ok(()),
            (_, false) => MIGRATOR.run(&self.pool).await.map_err(migrate_error),
        }
    }
}

/// One plain connection, closed at once, so that a server that cannot be
/// reached (or refuses the login) is that error, not a pool timing out as
/// if the store were busy, and a database the server does not have is not
/// found. Transient failures (a server still starting) are retried like
/// any step; each attempt waits at most `wait`.
async fn first_connection(
    connect: &PgConnectOptions,
    location: &str,
    wait: Duration,
) -> Result<(), Error> {
    let failed = |e: sqlx::Error| match sqlstate(&e).as_deref() {
        Some(NO_SUCH_DATABASE) => Error::NotFound {
            what: "database",
            id: location.to_owned(),
        },
        // Whatever else kept the connection from opening (refused, no such
        // host, a failed login) is one kind: the server was not reached.
        _ => unreachable(db("connect")(e)),
    };
    retrying!(|_retry| async {
        match tokio::time::timeout(wait, PgConnection::connect_with(connect)).await {
            Ok(Ok(conn)) => conn.close().await.map_err(failed),
            Ok(Err(e)) => Err(failed(e)),
            Err(_) => Err(Error::Store(
                StoreError::new(format!("connect: no connection within {wait:?}"), None)
                    .unreachable(),
            )),
        }
    })
}

/// The connect options of a libpq-style URL.
fn parse_url(url: &str) -> Result<PgConnectOptions, Error> {
    // The scheme in any case, as a URL's scheme is.
    let has_scheme = |scheme: &str| {
        url.get(..scheme.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(scheme))
    };
    if !has_scheme("postgres://") && !has_scheme("postgresql://") {
        return Err(Error::InvalidInput(
            "a PostgreSQL URL starts with postgres:// or postgresql://".into(),
        ));
    }
    // The driver's messages name the part that is wrong, never its value.
    PgConnectOptions::from_str(url).map_err(|e| {
        let why = e.to_string();
        let why = why
            .strip_prefix("error with configuration: ")
            .unwrap_or(&why);
        Error::InvalidInput(format!("PostgreSQL URL: {why}"))
    })
}

/// Where the store is, for reports: never the password.
fn location(options: &PgConnectOptions) -> String {
    format!(
        "postgres://{}@{}:{}/{}",
        options.get_username(),
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or(options.get_username())
    )
}

/// A schema name is an identifier turnstile creates and quotes itself:
/// lowercase letters, digits and `_`, not starting with a digit.
fn check_schema_name(schema: &str) -> Result<(), Error> {
    let valid = (1..=63).contains(&schema.len())
        && schema
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !schema.as_bytes()[0].is_ascii_digit();
    if valid {
        Ok(())
    } else {
        Err(Error::InvalidInput(format!(
            "schema name {schema:?}: use 1 to 63 lowercase letters, digits and _, not starting with a digit"
        )))
    }
}

async fn create_schema(pool: &PgPool, schema: &str) -> Result<(), Error> {
    // A role without CREATE on the database can use a schema made for it:
    // `CREATE SCHEMA IF NOT EXISTS` checks the privilege first.
    let exists = sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1) AS "exists!""#,
        schema
    )
    .fetch_one(pool)
    .await
    .map_err(db("find schema"))?;
    if exists {
        return Ok(());
    }
    // An identifier cannot be a bind parameter; the name was checked above.
    let sql = format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\"");
    match sqlx::query(&sql).execute(pool).await {
        Ok(_) => Ok(()),
        // Two processes creating it at once: the other one won.
        Err(e) if super::codec::sqlstate(&e).as_deref() == Some("23505") => Ok(()),
        Err(e) => Err(db("create schema")(e)),
    }
}

/// The highest applied migration, or `None` for a database without the
/// schema (in the connection's search path).
pub(crate) async fn schema_version(pool: &PgPool) -> Result<Option<i64>, Error> {
    let exists =
        sqlx::query_scalar!(r#"SELECT to_regclass('_sqlx_migrations') IS NOT NULL AS "exists!""#)
            .fetch_one(pool)
            .await
            .map_err(db("read schema version"))?;
    if !exists {
        return Ok(None);
    }
    // A runtime query: the table is created by the migrator, so the offline
    // macros cannot describe it before the first migration.
    sqlx::query_scalar::<_, Option<i64>>("SELECT MAX(version) FROM _sqlx_migrations")
        .fetch_one(pool)
        .await
        .map_err(db("read schema version"))
}

fn migrate_error(e: sqlx::migrate::MigrateError) -> Error {
    match e {
        sqlx::migrate::MigrateError::Execute(inner) => db("migrate")(inner),
        other => Error::Store(turnstile_core::StoreError::new(
            format!("migrate: {other}"),
            Some(Box::new(other)),
        )),
    }
}
