//! Opening a command's database (a SQLite file or a PostgreSQL database)
//! and closing it so the file alone is complete when the process exits.

use std::path::Path;
use std::sync::Arc;

use super::access::Access;
use super::db::DbLocation;
use super::exit::CliError;
use turnstile::{MigrationEvent, MigrationObserver, SqliteOptions, SqliteStore, StoreAdmin};

/// Closes the store after a command, whatever the command's result, so the
/// database file alone is complete when the process exits. A close kept
/// from folding the log whole by another process reading (or by a
/// read-only medium) is logged at debug: the next writer folds it, and
/// nothing committed is lost either way. A close that found no room to
/// fold it (a full disk) leaves the latest commits in the `-wal` file
/// beside the database: after a command that succeeded that is
/// [`CliError::Unfolded`], so the user learns that the file alone is not
/// the whole database; after one that failed, its own error stands.
pub(super) async fn closed<T>(
    store: &dyn StoreAdmin,
    result: Result<T, CliError>,
) -> Result<T, CliError> {
    match store.close().await {
        Err(turnstile::Error::Store(e)) if e.is_busy() => {
            tracing::debug!(error = %e, "the database was not closed cleanly");
        }
        Err(turnstile::Error::Store(e)) if e.is_full() && result.is_ok() => {
            return Err(CliError::Unfolded {
                source: turnstile::Error::Store(e),
                database: None,
            })
        }
        Err(error) => tracing::debug!(%error, "the database was not closed cleanly"),
        Ok(()) => {}
    }
    result
}

/// Opens the database: a file (unless `create`, a missing file is not
/// found, and is not created) or a PostgreSQL database (see
/// [`super::postgres`]).
pub(super) async fn open_store(
    db: &DbLocation,
    access: Access,
) -> Result<Arc<dyn StoreAdmin>, CliError> {
    match db {
        DbLocation::File(path) => open_file(path, access).await,
        DbLocation::Postgres(url) => Ok(Arc::new(super::postgres::open(url, access).await?)),
    }
}

async fn open_file(db: &Path, access: Access) -> Result<Arc<dyn StoreAdmin>, CliError> {
    match std::fs::metadata(db) {
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound && !matches!(access, Access::Create(_)) =>
        {
            return Err(CliError::MissingDatabase(db.display().to_string()));
        }
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(CliError::io(format!("inspect {}", db.display()))(e));
        }
        // `--db /dev/null`, a directory or a FIFO: SQLite would make a
        // journal beside it, or block on it.
        Ok(metadata) if !metadata.is_file() => return Err(not_a_database(db)),
        Ok(_) if !sqlite_or_empty(db)? => return Err(not_a_database(db)),
        _ => {}
    }
    let limits = access.limits();
    let defaults = SqliteOptions::default();
    let options = SqliteOptions {
        existing_only: access == Access::Read,
        max_database_bytes: limits.max_db_bytes,
        busy_timeout: limits.busy_timeout.unwrap_or(defaults.busy_timeout),
        on_migration: Some(migration_progress(db)),
        ..defaults
    };
    Ok(Arc::new(SqliteStore::open_with(db, options).await?))
}

/// Prints each migration that opening an older database applies on
/// stderr as it starts, a line per tenth of a table it copies, and the time
/// they all took once the last has committed: a large database's can take
/// a while, and a person waiting should know on what.
fn migration_progress(db: &Path) -> MigrationObserver {
    let db = super::output::plain(&db.display().to_string()).into_owned();
    let first_started = std::sync::OnceLock::new();
    let tenths_told = std::sync::atomic::AtomicU64::new(0);
    MigrationObserver::new(move |event| match event {
        MigrationEvent::Started {
            version,
            description,
            index,
            pending,
        } => {
            first_started.get_or_init(std::time::Instant::now);
            tenths_told.store(0, std::sync::atomic::Ordering::Relaxed);
            super::report(&format!(
                "turnstile: migrating {db} ({index} of {pending}): schema {version}, {description}…"
            ));
        }
        MigrationEvent::Copied {
            table, rows, of, ..
        } => {
            let tenths = (rows * 10).checked_div(*of).unwrap_or(10);
            if tenths > tenths_told.swap(tenths, std::sync::atomic::Ordering::Relaxed) {
                super::report(&format!(
                    "turnstile: migrating {db}: {table}, {rows} of {of} rows copied"
                ));
            }
        }
        MigrationEvent::Applied {
            version,
            index,
            pending,
            ..
        } if index == pending => {
            let took = first_started.get().map(|t| t.elapsed()).unwrap_or_default();
            super::report(&format!(
                "turnstile: migrated {db} to schema {version} in {:.1} s",
                took.as_secs_f64()
            ));
        }
        _ => {}
    })
}

/// Whether a file starts as every SQLite database does, or is empty (a
/// database not written yet). Checked before SQLite opens it, so a text
/// file or random bytes are refused as a directory or a FIFO is, with the
/// same words and exit code, rather than as a failed read.
fn sqlite_or_empty(db: &Path) -> Result<bool, CliError> {
    use std::io::Read;
    const MAGIC: &[u8; 16] = b"SQLite format 3\0";
    let mut head = Vec::with_capacity(MAGIC.len());
    std::fs::File::open(db)
        .and_then(|file| file.take(MAGIC.len() as u64).read_to_end(&mut head))
        .map_err(CliError::io(format!("read {}", db.display())))?;
    Ok(head.is_empty() || head == MAGIC)
}

/// What `--db` names is there but holds no database: a directory, a FIFO,
/// a device, a text file, random bytes.
fn not_a_database(db: &Path) -> CliError {
    CliError::Usage(format!(
        "{} is not a turnstile database (not a SQLite file): give --db the file a \
         writing command such as `turnstile run` created, or a path where no file \
         exists yet for `turnstile run` to create one",
        super::text::quote(&db.display().to_string())
    ))
}
