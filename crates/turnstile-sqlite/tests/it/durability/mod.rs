//! SQLite-file behaviour: atomicity under injected faults, reopening,
//! storage growth, schema versioning and a database of the previous
//! schema, corrupt rows, file mode and multi-process admission.

mod atomicity;
mod compat;
mod corrupt;
mod growth;
mod migrate_0021;
mod migrate_0024;
mod migrate_0025;
mod migration_kill;
mod processes;
mod reopen;
mod schema;

use std::path::Path;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

/// A plain sqlx pool on a database file, outside turnstile: what a test uses
/// to inspect or damage the file behind the store's back.
pub async fn raw_pool(path: &Path) -> Result<SqlitePool, sqlx::Error> {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .busy_timeout(Duration::from_secs(30));
    SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
}

/// Copies the whole WAL into the database file and empties the WAL.
pub async fn checkpoint_truncate(pool: &SqlitePool) -> Result<(), sqlx::Error> {
    let (busy, _, _): (i64, i64, i64) = sqlx::query_as("PRAGMA wal_checkpoint(TRUNCATE)")
        .fetch_one(pool)
        .await?;
    assert_eq!(busy, 0, "checkpoint blocked by a reader");
    Ok(())
}
