//! `--db postgres://…`: opening a [`PostgresStore`] the way the commands
//! open a SQLite file, with the same errors and exit codes.
//!
//! - A read command (`Access::Read`) connects with `existing_only`: a
//!   database turnstile never wrote to is "not found" (4), like a missing
//!   file, and nothing is created or migrated. Writing commands migrate.
//! - The store tries one plain connection before its pool: a server that
//!   is not there is then one clear error (exit 1; `doctor` reports it as
//!   "cannot open", exit 7), where the pool would wait out its acquire
//!   timeout and look busy. A database the server does not have is "not
//!   found" (4).
//! - `--busy-timeout` bounds both the wait for a pooled connection and each
//!   statement (`statement_timeout`, which includes waiting for a row lock
//!   another process holds); past it the command exits busy (3). Without it
//!   the acquire timeout is 30 s and statements run under the server's own
//!   `statement_timeout`.
//! - `--max-db-bytes` is a SQLite file quota and is refused for a URL.
//!
//! No message here quotes the URL as given: only [`PgUrl::redacted`] and
//! [`location`] are ever shown.

use std::collections::BTreeMap;
use std::time::Duration;

use super::access::{Access, Limits};
use super::db::PgUrl;
use super::exit::CliError;
use turnstile::admin::DoctorReport;
use turnstile::{Error, PostgresOptions, PostgresStore, StoreAdmin, StoreError};

/// Connections per command: a command runs one session's steps in turn.
const POOL_SIZE: u32 = 4;
/// `--busy-timeout` is taken within these bounds: connecting and a
/// statement need some time, and the server takes at most `i32::MAX` ms.
const MIN_WAIT: Duration = Duration::from_secs(1);
const MAX_WAIT: Duration = Duration::from_millis(i32::MAX as u64);

/// `postgres://user@host:port/database`, as [`PostgresStore::location`]
/// writes it: never a password. Refused as a usage error (the parser of
/// `--db` already checked the URL, so this does not happen in practice).
pub(super) fn location(url: &PgUrl) -> Result<String, CliError> {
    PostgresOptions::new(url.secret())
        .location()
        .map_err(|e| CliError::Usage(e.to_string()))
}

/// Why no connection could be opened: the store's cause without its
/// `connect: ` context (the message names it already).
fn why_unreachable(error: &StoreError) -> &str {
    let message = error.message();
    message.strip_prefix("connect: ").unwrap_or(message)
}

/// The store's options for a command with `limits`.
fn store_options(url: &PgUrl, limits: Limits, existing_only: bool) -> PostgresOptions {
    let mut options = PostgresOptions::new(url.secret());
    options.pool_size = POOL_SIZE;
    options.existing_only = existing_only;
    if let Some(wait) = limits.busy_timeout {
        let wait = wait.clamp(MIN_WAIT, MAX_WAIT);
        options.acquire_timeout = wait;
        options.statement_timeout = Some(wait);
    }
    options
}

/// Refuses what has no meaning on a server.
pub(super) fn check_limits(limits: Limits) -> Result<(), CliError> {
    if limits.max_db_bytes.is_some() {
        return Err(CliError::Usage(
            "--max-db-bytes is a size quota for a SQLite file; it has no meaning for a \
             PostgreSQL database (use the server's own limits)"
                .into(),
        ));
    }
    Ok(())
}

/// Opens the store for a command (see the module docs).
pub(super) async fn open(url: &PgUrl, access: Access) -> Result<PostgresStore, CliError> {
    let limits = access.limits();
    check_limits(limits)?;
    let options = store_options(url, limits, access == Access::Read);
    let path = location(url)?;
    PostgresStore::connect_with(options)
        .await
        .map_err(|e| match e {
            Error::NotFound {
                what: "database", ..
            } => CliError::MissingDatabase(path),
            // Only the schema check of `existing_only` says this.
            Error::NotFound { .. } if access == Access::Read => CliError::MissingSchema(path),
            Error::Store(e) if e.is_unreachable() => {
                CliError::Failed(format!("cannot connect to {path}: {}", why_unreachable(&e)))
            }
            e => e.into(),
        })
}

/// `doctor`: the store's report, or one of its own when there is nothing to
/// connect to. A database without the schema is not found (4), as a missing
/// file is; one whose schema this build does not read is reported with why.
pub(super) async fn doctor(url: &PgUrl, stale_after: Duration) -> Result<DoctorReport, CliError> {
    let mut options = store_options(url, Limits::default(), true);
    options.pool_size = 1;
    let path = location(url)?;
    let store = match PostgresStore::connect_with(options).await {
        Ok(store) => store,
        Err(Error::NotFound {
            what: "database", ..
        }) => return Err(CliError::MissingDatabase(path)),
        Err(Error::NotFound { .. }) => return Err(CliError::MissingSchema(path)),
        Err(Error::Store(e)) if e.is_unreachable() => {
            let why = why_unreachable(&e).to_owned();
            return Ok(report_without_store(path, Some(why), None, Vec::new()));
        }
        Err(e @ (Error::SchemaTooOld { found, .. } | Error::SchemaTooNew { found, .. })) => {
            return Ok(report_without_store(
                path,
                None,
                Some(found),
                vec![e.to_string()],
            ))
        }
        Err(e) => return Err(e.into()),
    };
    let report = store.doctor(stale_after).await;
    let _ = StoreAdmin::close(&store).await;
    Ok(report?)
}

/// A report of what could not be checked.
fn report_without_store(
    location: String,
    cannot_open: Option<String>,
    schema_version: Option<i64>,
    not_checked: Vec<String>,
) -> DoctorReport {
    DoctorReport {
        location,
        integrity_ok: None,
        cannot_open,
        integrity: Vec::new(),
        schema_version,
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
        not_checked,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> PgUrl {
        use clap::builder::TypedValueParser;
        match super::super::db::DbLocationParser
            .parse_ref(&clap::Command::new("t"), None, std::ffi::OsStr::new(text))
            .unwrap()
        {
            super::super::db::DbLocation::Postgres(url) => url,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn busy_timeout_bounds_the_acquire_and_each_statement_within_limits() {
        let u = url("postgres://u:pw@h/db");
        let default = store_options(&u, Limits::default(), false);
        assert_eq!(default.acquire_timeout, Duration::from_secs(30));
        assert_eq!(default.statement_timeout, None);
        let limits = |secs: u64| Limits {
            max_db_bytes: None,
            busy_timeout: Some(Duration::from_secs(secs)),
        };
        let ten = store_options(&u, limits(10), false);
        assert_eq!(ten.acquire_timeout, Duration::from_secs(10));
        assert_eq!(ten.statement_timeout, Some(Duration::from_secs(10)));
        assert_eq!(store_options(&u, limits(0), true).acquire_timeout, MIN_WAIT);
        assert_eq!(
            store_options(&u, limits(u64::MAX / 2), true).statement_timeout,
            Some(MAX_WAIT)
        );
        assert!(!format!("{default:?}").contains("pw"));
    }

    #[test]
    fn the_location_has_no_password() {
        let location = location(&url("postgres://me:pw@db.example:6543/app")).unwrap();
        assert_eq!(location, "postgres://me@db.example:6543/app");
    }

    #[test]
    fn max_db_bytes_is_refused() {
        let limits = Limits {
            max_db_bytes: Some(1),
            busy_timeout: None,
        };
        assert!(matches!(check_limits(limits), Err(CliError::Usage(_))));
    }
}
