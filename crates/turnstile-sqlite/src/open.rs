//! Opening a database: file creation, pragmas, the schema check, the
//! embedded migrations and the installation of the durable steps.

use std::path::Path;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::sqlite::{
    SqliteAutoVacuum, SqliteConnectOptions, SqliteJournalMode, SqliteOwnedBuf, SqliteSynchronous,
};
use sqlx::{ConnectOptions, Connection, SqliteConnection};
use tracing::instrument;

use super::codec::{self, db};
use super::migrate::{self, MigrationObserver};
use super::read_connections::ReadConnections;
use super::steps;
use super::write_connection::WriteConnection;
use super::writer::GroupWriter;
use super::{Durability, SqliteOptions, SqliteStore};
use turnstile_core::store::PartLimits;
use turnstile_core::Error;
use turnstile_core::StoreError;

static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// The image of a new in-memory database with the current schema and
/// steps, built once per process by the migrations themselves: every
/// in-memory store starts as a copy of it instead of replaying them.
static MEMORY_TEMPLATE: tokio::sync::OnceCell<Vec<u8>> = tokio::sync::OnceCell::const_new();

/// The image of a new database file with the current schema and steps, as
/// [`MEMORY_TEMPLATE`], with the incremental auto-vacuum new files get.
static FILE_TEMPLATE: tokio::sync::OnceCell<Vec<u8>> = tokio::sync::OnceCell::const_new();

/// The page size of every new database, in memory or in a file (an
/// existing one keeps its own). A 500-byte message's transcript row fits 15
/// to an 8 KiB page and 7 to a 4 KiB one, so text takes 1.12× its bytes
/// instead of 1.20× (`docs/performance.md`, "Where the bytes go").
const NEW_DATABASE_PAGE_SIZE: u32 = 8192;

/// The page cache of the connection that migrates an existing database, as
/// `PRAGMA cache_size` takes it: negative, in KiB (256 MiB).
const MIGRATION_CACHE_KIB: &str = "-262144";

impl SqliteStore {
    /// Opens (creating if needed) a database file with the default options:
    /// WAL, `synchronous=FULL`, a 30 s busy timeout, foreign keys on.
    ///
    /// # Errors
    /// [`Error::SchemaTooNew`] for a database written by a newer turnstile
    /// (left untouched); [`Error::StepsTooNew`] for one whose durable steps
    /// are a newer turnstile's (left untouched); [`Error::Store`] when the
    /// file cannot be opened or is not a SQLite database.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        Self::open_with(path, SqliteOptions::default()).await
    }

    /// Opens (creating if needed) a database file. A new file is created
    /// readable and writable by its owner only.
    ///
    /// # Errors
    /// As [`SqliteStore::open`].
    #[instrument(skip_all, fields(path = %path.as_ref().display()), err)]
    pub async fn open_with(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self, Error> {
        let path = path.as_ref();
        if options.existing_only {
            // Not a directory, a FIFO or a device either: SQLite would
            // create a journal beside it, or wait for it.
            if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
                return Err(Error::NotFound {
                    what: "database",
                    id: path.display().to_string(),
                });
            }
        }
        // A new file starts as a copy of a database this process migrated
        // once; under a quota it is migrated as before, so a quota too small
        // for the schema is still told so.
        let copied = !options.existing_only
            && options.max_database_bytes.is_none()
            && create_from_template(path).await?;
        let created = copied || (!options.existing_only && create_owner_only(path)?);
        // Openers racing on a new file can meet a lock that SQLite reports
        // without waiting for the busy timeout (the switch to WAL), or a
        // migration another opener just applied (SQLite's migrator takes no
        // lock): the loser checks the schema again and retries, briefly.
        let look_only = options.existing_only && only_readable(path);
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::open_once(path, &options, look_only, copied).await {
                Err(Error::Store(e)) if e.is_busy() && attempt < OPEN_ATTEMPTS => {
                    tracing::debug!(attempt, error = %e, "opening raced another opener; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(10 * attempt)).await;
                }
                Err(Error::Store(e)) if e.is_full() && created => {
                    // A quota (or a disk) too small for the schema: the file
                    // this call created holds no database, and goes; unless
                    // an opener racing this one completed its schema. (One
                    // still migrating it with a larger quota at this very
                    // moment is not seen: two first opens of one new file
                    // with different quotas are not supported.)
                    if !has_whole_schema(path).await {
                        remove_new_file(path);
                    }
                    return Err(Error::Store(e));
                }
                Err(Error::Store(e))
                    if options.existing_only
                        && !look_only
                        && !writable(path)
                        && beside(path, "-wal").exists() =>
                {
                    return Err(unreadable_with_log(path, e));
                }
                other => return other,
            }
        }
    }

    /// `copied`: the file was just created as a copy of [`FILE_TEMPLATE`],
    /// migrated and with its steps installed already.
    async fn open_once(
        path: &Path,
        options: &SqliteOptions,
        look_only: bool,
        copied: bool,
    ) -> Result<Self, Error> {
        // SQLite takes the timeout in milliseconds as an `int`.
        let busy_timeout = options.busy_timeout.min(MAX_BUSY_TIMEOUT);
        let plain = SqliteConnectOptions::new()
            .filename(path)
            .busy_timeout(busy_timeout);
        let (plain, connect) = match look_only {
            true => {
                let plain = plain.read_only(true).immutable(true);
                (plain.clone(), plain.foreign_keys(true))
            }
            false => (
                plain.clone(),
                plain
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(match options.durability {
                        Durability::Full => SqliteSynchronous::Full,
                        Durability::Normal => SqliteSynchronous::Normal,
                    })
                    .foreign_keys(true),
            ),
        };
        // The schema check runs before anything could write to the file. The
        // probe sets no journal mode: switching a rollback-journal database
        // to WAL rewrites its header, and a refused database stays untouched.
        let mut probe = plain.connect().await.map_err(db("open database"))?;
        let found = check_schema(&mut probe).await?;
        let supported = Self::supported_schema_version();
        if options.existing_only && found != Some(supported) {
            let _ = probe.close().await;
            return Err(match found {
                None => Error::NotFound {
                    what: "turnstile database",
                    id: path.display().to_string(),
                },
                Some(found) => Error::SchemaTooOld { found, supported },
            });
        }
        let empty = is_empty(&mut probe).await?;
        // An existing database migrates past its quota: a migration that
        // copies a table needs room for both copies for a moment, and the
        // quota is for what the store writes, not for upgrading a file that
        // fits it. A new one's schema is held to it.
        let unbounded = connect.clone();
        let connect = match options.max_database_bytes {
            Some(bytes) => {
                let pages = max_page_count(&mut probe, bytes, empty).await?;
                connect.pragma("max_page_count", pages.to_string())
            }
            None => connect,
        };
        probe.close().await.map_err(db("close probe"))?;

        // A write waits for the connection as long as SQLite would wait for
        // another process's lock, and then some: the step ahead of it may
        // itself be waiting out the busy timeout.
        let wait = busy_timeout
            .saturating_mul(2)
            .saturating_add(Duration::from_secs(5));
        // A look-only open found this build's schema (checked above) and
        // can write nothing: there is nothing to migrate or install.
        // Nor on a copy of this build's template: migrated and installed.
        let current_copy = copied && found == Some(supported);
        if !look_only && !current_copy {
            let migrating = if empty { &connect } else { &unbounded };
            migrate(migrating, empty, found, options).await?;
        }
        let writer = WriteConnection::open(connect.clone(), wait).await?;
        let reader = ReadConnections::open(connect, options.readers, wait);
        Ok(Self {
            group: GroupWriter::spawn(writer.clone()),
            writer,
            reader,
            path: Some(path.to_owned()),
            look_only,
            part_limits: options.part_limits,
            claim_memory: Default::default(),
        })
    }

    /// A private in-memory database for tests and harnesses, on one
    /// connection of its own: it lives exactly as long as the store (and its
    /// clones). It starts as a copy of a database this process migrated
    /// once, so opening one replays no migration. It holds up to 1 GiB
    /// (the default limit of SQLite's `memdb`, which holds a copied
    /// database; a write past it is told the database is full).
    ///
    /// # Errors
    /// [`Error::Store`] if SQLite cannot create it.
    pub async fn in_memory() -> Result<Self, Error> {
        let template = MEMORY_TEMPLATE.get_or_try_init(memory_template).await?;
        let connect = memory_options();
        let copy =
            SqliteOwnedBuf::try_from(&template[..]).map_err(db("copy in-memory database"))?;
        let conn = memory_copy(&connect, copy).await?;
        // One connection serves reads and writes. Reads and writes wait for
        // it as long as sqlx's pool waited.
        let writer = WriteConnection::in_memory(conn, connect, Duration::from_secs(30));
        Ok(Self {
            group: GroupWriter::spawn(writer.clone()),
            reader: ReadConnections::Writer(writer.clone()),
            writer,
            path: None,
            look_only: false,
            part_limits: PartLimits::default(),
            claim_memory: Default::default(),
        })
    }

    /// The newest schema version this build knows.
    pub fn supported_schema_version() -> i64 {
        MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
    }
}

/// How an in-memory database is connected to: each connection a private
/// database of its own (not sqlx's `sqlite::memory:`, a shared-cache
/// database every connection of one options value joins).
pub(super) fn memory_options() -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .journal_mode(SqliteJournalMode::Memory)
        .foreign_keys(true)
}

/// A new in-memory database with the current schema and steps, migrated
/// the slow way, as an image.
async fn memory_template() -> Result<Vec<u8>, Error> {
    template(memory_options().page_size(NEW_DATABASE_PAGE_SIZE)).await
}

/// The same for a new file: with incremental auto-vacuum (see [`migrate`]).
async fn file_template() -> Result<Vec<u8>, Error> {
    template(
        memory_options()
            .page_size(NEW_DATABASE_PAGE_SIZE)
            .auto_vacuum(SqliteAutoVacuum::Incremental),
    )
    .await
}

/// A database in memory of `options`, migrated, as an image.
async fn template(options: SqliteConnectOptions) -> Result<Vec<u8>, Error> {
    let mut conn = options
        .connect()
        .await
        .map_err(db("open in-memory template"))?;
    migrate_on(&mut conn, None, false, None).await?;
    let image = conn
        .serialize(None)
        .await
        .map_err(db("copy in-memory template"))?;
    let image = image.to_vec();
    conn.close().await.map_err(db("close in-memory template"))?;
    Ok(image)
}

/// A connection to a new in-memory database holding `image`.
pub(super) async fn memory_copy(
    connect: &SqliteConnectOptions,
    image: SqliteOwnedBuf,
) -> Result<SqliteConnection, Error> {
    let mut conn = connect
        .connect()
        .await
        .map_err(db("open in-memory database"))?;
    conn.deserialize(None, image, false)
        .await
        .map_err(db("copy in-memory database"))?;
    Ok(conn)
}

/// Applies the embedded migrations and installs the durable steps
/// (`steps/`) on a connection of their own, closed
/// before the store opens its writer and readers. `Migrator::run` wants a
/// pool or a connection it can acquire for any lifetime, which a future
/// that must be `Send` cannot give; sqlx's `run_direct` takes the
/// connection itself (hidden from its docs, and there for this reason). A
/// short-lived pool instead left a stray connection open now and then: one
/// that keeps a minimum size may reopen one around its close.
///
/// An empty database (a new file) gets incremental auto-vacuum, which lets
/// `prune` give freed pages back to the file system. The setting only takes
/// effect before the first table, and on an existing file the pragma still
/// rewrites the header page: asked on every connection, it was a commit for
/// nothing each time one opened.
///
/// `found` is the schema version the database had when it was checked;
/// `existing_only` opens for tools that only look, which installs no steps.
/// The observer of `options` is told of the migrations of a database that
/// had a schema, not of a new one's.
async fn migrate(
    connect: &SqliteConnectOptions,
    empty: bool,
    found: Option<i64>,
    options: &SqliteOptions,
) -> Result<(), Error> {
    let connect = match empty {
        true => connect
            .clone()
            .page_size(NEW_DATABASE_PAGE_SIZE)
            .auto_vacuum(SqliteAutoVacuum::Incremental),
        // A migration that rewrites a table's rows keeps them in memory until
        // it commits instead of spilling them to the log as it goes: 0021
        // rewrote 650,000 request rows in 6.9 s with SQLite's default 2 MiB
        // cache, 3.0 s with 256 MiB. Pages are taken as used, and given back
        // when this connection closes.
        false => connect.clone().pragma("cache_size", MIGRATION_CACHE_KIB),
    };
    let mut conn = connect
        .connect()
        .await
        .map_err(db("open migration connection"))?;
    let observer = options.on_migration.as_ref().filter(|_| found.is_some());
    let migrated = migrate_on(&mut conn, found, options.existing_only, observer).await;
    conn.close()
        .await
        .map_err(db("close migration connection"))?;
    migrated
}

async fn migrate_on(
    conn: &mut SqliteConnection,
    found: Option<i64>,
    existing_only: bool,
    observer: Option<&MigrationObserver>,
) -> Result<(), Error> {
    let supported = SqliteStore::supported_schema_version();
    if found.is_some_and(|found| found < supported) {
        steps::drop_before_migrating(conn, supported).await?;
    }
    if let Err(failed) = migrate::run(&MIGRATOR, conn, observer).await {
        // Another opener that applied the same migration first makes this
        // one's SQL fail, and one applying it now holds the lock this one
        // needs: a retry finds it applied. A migration that fails where
        // nobody else applied it fails again, so it is not retried.
        let now = check_schema(conn).await.ok().flatten();
        let raced = locked_out(&failed.error)
            || failed
                .applying
                .is_some_and(|version| now.is_some_and(|now| now >= version));
        return Err(migrate_error(failed.error, raced));
    }
    steps::install(conn, existing_only).await
}

/// Whether the database has no pages yet (a new or empty file).
async fn is_empty(conn: &mut SqliteConnection) -> Result<bool, Error> {
    // A PRAGMA: a runtime query (the offline query macros cannot describe it).
    let pages: i64 = sqlx::query_scalar("PRAGMA page_count")
        .fetch_one(&mut *conn)
        .await
        .map_err(db("read page count"))?;
    Ok(pages == 0)
}

/// Refuses a database whose applied migrations are newer than ours.
/// The schema version a database has (`None`: no turnstile schema yet).
async fn check_schema(conn: &mut SqliteConnection) -> Result<Option<i64>, Error> {
    let has_table = sqlx::query_scalar!(
        r#"SELECT COUNT(*) AS "n!: i64" FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'"#
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(db("read schema"))?;
    if has_table == 0 {
        return Ok(None);
    }
    let found = sqlx::query_scalar!(r#"SELECT MAX(version) AS "v: i64" FROM _sqlx_migrations"#)
        .fetch_one(&mut *conn)
        .await
        .map_err(db("read schema version"))?
        .unwrap_or(0);
    let supported = SqliteStore::supported_schema_version();
    if found > supported {
        return Err(Error::SchemaTooNew { found, supported });
    }
    Ok(Some(found))
}

/// The size quota in whole pages of the database (the page size a new
/// database will get, for a new file); at least one page, as 0 would mean no
/// quota to SQLite.
async fn max_page_count(
    conn: &mut SqliteConnection,
    bytes: u64,
    empty: bool,
) -> Result<u64, Error> {
    let page_size = match empty {
        true => i64::from(NEW_DATABASE_PAGE_SIZE),
        // A PRAGMA: a runtime query (the offline query macros cannot
        // describe it).
        false => sqlx::query_scalar("PRAGMA page_size")
            .fetch_one(&mut *conn)
            .await
            .map_err(db("read page size"))?,
    };
    let page_size = u64::try_from(page_size).unwrap_or(0).max(512);
    // SQLite's largest page count.
    Ok((bytes / page_size).clamp(1, 0xffff_fffe))
}

/// The longest busy timeout SQLite can take (`i32::MAX` milliseconds,
/// about 24.8 days); a longer one is this.
const MAX_BUSY_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);

/// How often an opener retries after racing another opener.
const OPEN_ATTEMPTS: u64 = 10;

/// Whether a migration failed on a lock another connection held
/// (`SQLITE_BUSY`, `SQLITE_LOCKED`, any extended code).
fn locked_out(error: &sqlx::migrate::MigrateError) -> bool {
    use sqlx::migrate::MigrateError;
    let (MigrateError::Execute(e) | MigrateError::ExecuteMigration(e, _)) = error else {
        return false;
    };
    matches!(codec::primary_code(e), Some(5 | 6))
}

/// A migration that failed while another opener applied it (`raced`) is
/// taken as a race, and retried by
/// [`SqliteStore::open_with`]; except on a full database (or a quota below
/// the schema's size), which no retry mends. A migration the database
/// disagrees with (a changed or missing version, a dirty one) is not a
/// race: no retry mends it either.
fn migrate_error(e: sqlx::migrate::MigrateError, raced: bool) -> Error {
    // A migration refused by a constraint (a row it cannot convert) fails
    // again until the row changes; its transaction was undone.
    const SQLITE_CONSTRAINT: i32 = 19;
    let next = match &e {
        sqlx::migrate::MigrateError::ExecuteMigration(cause, version)
            if codec::primary_code(cause) == Some(SQLITE_CONSTRAINT) =>
        {
            format!(
                "; migration {version} was undone, so the file is as it was before it: it \
                 holds a row this version cannot convert; keep using the previous version, or \
                 restore the file from a backup"
            )
        }
        _ => String::new(),
    };
    let error = codec::classified(format!("migrate: {e}{next}"), Box::new(e));
    Error::Store(if raced && !error.is_full() {
        error.busy()
    } else {
        error
    })
}

/// Whether the file holds this build's whole schema (false when it
/// cannot be read).
async fn has_whole_schema(path: &Path) -> bool {
    let Ok(mut conn) = SqliteConnectOptions::new().filename(path).connect().await else {
        return false;
    };
    let found = check_schema(&mut conn).await;
    let _ = conn.close().await;
    matches!(found, Ok(Some(v)) if v == SqliteStore::supported_schema_version())
}

/// Removes a database file this opener created, and whatever SQLite put
/// beside it. Best effort: the error that led here is the one reported.
fn remove_new_file(path: &Path) {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let _ = std::fs::remove_file(beside(path, suffix));
    }
}

/// Whether a database file is to be read as immutable: this process may
/// not write it (opening it for writing, which changes nothing, fails: a
/// read-only medium, another user's file), and no `-wal` file is beside it
/// (SQLite keeps one while a connection has the database open, or after a
/// close that could not fold it), nor a `-journal`, so the file alone
/// holds every commit.
/// SQLite then creates no `-wal` or `-shm` file beside it, which this
/// process could not remove, or not create at all.
pub(crate) fn only_readable(path: &Path) -> bool {
    // A rollback journal beside it (a database in another journal mode,
    // cut off mid-transaction) is a hot journal an immutable read would
    // ignore: such a file is opened the usual way.
    !writable(path) && !beside(path, "-wal").exists() && !beside(path, "-journal").exists()
}

/// Whether this process may write the file: opening it for writing
/// changes nothing.
fn writable(path: &Path) -> bool {
    std::fs::OpenOptions::new().write(true).open(path).is_ok()
}

/// The file SQLite (or this store) keeps beside a database: its path with
/// `suffix` appended (`-wal`, `-shm`, `-journal`).
pub(crate) fn beside(path: &Path, suffix: &str) -> std::path::PathBuf {
    let mut file = path.as_os_str().to_owned();
    file.push(suffix);
    file.into()
}

/// A look at a file this process cannot write, with a `-wal` file beside
/// it, that failed: SQLite reads such a log only through a `-shm` file it
/// can create or write. Says so, and what to do.
fn unreadable_with_log(path: &Path, error: StoreError) -> Error {
    Error::Store(StoreError::new(
        format!(
            "cannot read {} without writing: a write-ahead log ({}) is beside it, which \
             SQLite reads only through a -shm file it may create or write; read it as a user \
             who may write the database and its directory, or once its writer has closed it \
             (which folds the log into the file)",
            path.display(),
            beside(path, "-wal").display(),
        ),
        Some(Box::new(error)),
    ))
}

/// Creates `path`, readable and writable by its owner only, holding a copy
/// of [`FILE_TEMPLATE`]; `false` when it exists already, or when the copy
/// cannot be made (a file system without hard links, a full disk): the
/// file is then created and migrated as before, which says what is wrong.
/// Nor beside a `-wal` or `-journal` left by a database that was there:
/// SQLite deletes those for an empty file, but would replay them into a
/// copy. The copy is written beside the path (`NAME.new-UUID`, which a
/// crash before the link leaves behind, to be deleted) and linked into
/// place whole, so an opener racing this one sees either no file or the
/// whole database, never a part of it.
async fn create_from_template(path: &Path) -> Result<bool, Error> {
    let taken = |suffix| std::fs::symlink_metadata(beside(path, suffix)).is_ok();
    if taken("") || taken("-wal") || taken("-journal") {
        return Ok(false);
    }
    let image = match FILE_TEMPLATE.get_or_try_init(file_template).await {
        Ok(image) => image,
        Err(e) => {
            tracing::debug!(error = %e, "no template for a new database file; migrating it");
            return Ok(false);
        }
    };
    let staged = beside(path, &format!(".new-{}", uuid::Uuid::new_v4()));
    let written = (|| {
        use std::io::Write;
        let mut open = std::fs::OpenOptions::new();
        open.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
        let mut file = open.open(&staged)?;
        file.write_all(image)?;
        file.sync_all()
    })();
    let linked = written.and_then(|()| std::fs::hard_link(&staged, path));
    let _ = std::fs::remove_file(&staged);
    match linked {
        Ok(()) => Ok(true),
        Err(e) => {
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                tracing::debug!(error = %e, "a new database file could not be copied; migrating it");
            }
            Ok(false)
        }
    }
}

/// Creates a missing database file with mode 0600 before SQLite opens it;
/// SQLite gives its -wal and -shm files the same mode.
/// Returns whether it created it.
fn create_owner_only(path: &Path) -> Result<bool, Error> {
    let mut open = std::fs::OpenOptions::new();
    open.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
    match open.open(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(Error::Store(StoreError::new(
            format!("create database file {}: {e}", path.display()),
            Some(Box::new(e)),
        ))),
    }
}
