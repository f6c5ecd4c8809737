//! Applying the pending migrations one at a time, telling an observer of
//! each: a migration that copies a large table takes a while, and whoever
//! opened the database should know what it is waiting for.
//!
//! This is sqlx's `Migrator::run_direct` with a call before and after each
//! migration, which sqlx does not offer. A migration is applied as sqlx's
//! `Migrate::apply` does, its SQL and its `_sqlx_migrations` row in one
//! transaction, so one killed at any point leaves the database as it was
//! before it, and the next open applies it again. A migration that copies a
//! table marks the copy (see [`BATCH_START`]), and its copy runs in batches
//! of rowids inside that transaction, telling how many rows are done.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::migrate::{Migrate, MigrateError, Migration, Migrator};
use sqlx::SqliteConnection;

/// A migration an open is about to apply, or has applied; see
/// [`SqliteOptions::on_migration`](crate::SqliteOptions::on_migration).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MigrationEvent {
    /// The `index`-th (from 1) of the `pending` migrations starts.
    Started {
        version: i64,
        description: String,
        index: usize,
        pending: usize,
    },
    /// Its copy of `table` has copied `rows` of its `of` rows (told after
    /// each batch, inside the migration's transaction: none of it is
    /// committed before [`MigrationEvent::Applied`]).
    Copied {
        version: i64,
        table: String,
        rows: u64,
        of: u64,
    },
    /// It committed, `elapsed` after it started.
    Applied {
        version: i64,
        description: String,
        index: usize,
        pending: usize,
        elapsed: Duration,
    },
}

/// Told of each migration that opening an existing database applies, as it
/// starts and once it has committed. It runs on the task opening the
/// store, between migrations, so it should return quickly.
#[derive(Clone)]
pub struct MigrationObserver(Arc<dyn Fn(&MigrationEvent) + Send + Sync>);

impl MigrationObserver {
    /// An observer calling `f` with each event.
    pub fn new(f: impl Fn(&MigrationEvent) + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }
}

impl fmt::Debug for MigrationObserver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MigrationObserver")
    }
}

/// Why [`run`] stopped: sqlx's error, and the version of the migration it
/// was applying (none when it failed before applying any).
#[derive(Debug)]
pub(super) struct Failed {
    pub(super) error: MigrateError,
    pub(super) applying: Option<i64>,
}

impl From<MigrateError> for Failed {
    fn from(error: MigrateError) -> Self {
        Self {
            error,
            applying: None,
        }
    }
}

/// Applies every migration of `migrator` that `conn` has not applied, in
/// order, telling `observer`. Refuses, as sqlx does, a database marked
/// dirty by a failed migration, one that applied a migration this build
/// does not have, and one whose applied migration differs from this
/// build's.
pub(super) async fn run(
    migrator: &Migrator,
    conn: &mut SqliteConnection,
    observer: Option<&MigrationObserver>,
) -> Result<(), Failed> {
    conn.ensure_migrations_table().await?;
    if let Some(version) = conn.dirty_version().await? {
        return Err(MigrateError::Dirty(version).into());
    }
    let applied: HashMap<i64, Vec<u8>> = conn
        .list_applied_migrations()
        .await?
        .into_iter()
        .map(|m| (m.version, m.checksum.into_owned()))
        .collect();
    if let Some(&missing) = applied
        .keys()
        .find(|v| !migrator.iter().any(|m| m.version == **v))
    {
        return Err(MigrateError::VersionMissing(missing).into());
    }
    let mut pending = Vec::new();
    for migration in migrator
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
    {
        match applied.get(&migration.version) {
            Some(checksum) if *checksum != *migration.checksum => {
                return Err(MigrateError::VersionMismatch(migration.version).into());
            }
            Some(_) => {}
            None => pending.push(migration),
        }
    }
    let tell = |event: MigrationEvent| {
        if let Some(observer) = observer {
            (observer.0)(&event);
        }
    };
    let count = pending.len();
    for (index, migration) in pending.into_iter().enumerate() {
        let (version, description) = (migration.version, migration.description.to_string());
        tell(MigrationEvent::Started {
            version,
            description: description.clone(),
            index: index + 1,
            pending: count,
        });
        let started = Instant::now();
        let applied = match batched(&migration.sql) {
            Some(copy) => apply_in_batches(conn, migration, copy, &tell).await,
            None => conn.apply(migration).await.map(drop),
        };
        applied.map_err(|error| Failed {
            error,
            applying: Some(version),
        })?;
        tell(MigrationEvent::Applied {
            version,
            description,
            index: index + 1,
            pending: count,
            elapsed: started.elapsed(),
        });
    }
    Ok(())
}

/// The line that starts a migration's batched copy, followed by the table
/// it copies from. The statement after it, up to [`BATCH_END`], copies the
/// rows of that table whose rowid lies between `?1` and `?2`, and every row
/// when nothing is bound (as when sqlx applies the file whole).
const BATCH_START: &str = "-- turnstile: batched copy of ";
const BATCH_END: &str = "-- turnstile: end of batched copy";
/// Rowids per batch: about that many rows, each batch well under a second.
const BATCH_ROWIDS: i64 = 50_000;

/// A migration's SQL split around its batched copy.
struct BatchedCopy<'a> {
    before: &'a str,
    table: &'a str,
    copy: &'a str,
    after: &'a str,
}

/// The batched copy of `sql`, if it marks one.
fn batched(sql: &str) -> Option<BatchedCopy<'_>> {
    let start = sql.find(BATCH_START)?;
    let line_end = start + sql[start..].find('\n')?;
    let table = sql[start + BATCH_START.len()..line_end].trim();
    let named = !table.is_empty() && table.chars().all(|c| c.is_ascii_lowercase() || c == '_');
    let end = line_end + sql[line_end..].find(BATCH_END)?;
    let rest = end + sql[end..].find('\n').map_or(sql.len() - end, |i| i + 1);
    named.then(|| BatchedCopy {
        before: &sql[..start],
        table,
        copy: &sql[line_end + 1..end],
        after: &sql[rest..],
    })
}

/// Applies `migration` as `Migrate::apply` does, in one transaction with
/// its `_sqlx_migrations` row, its copy in batches of [`BATCH_ROWIDS`].
async fn apply_in_batches(
    conn: &mut SqliteConnection,
    migration: &Migration,
    copy: BatchedCopy<'_>,
    tell: &impl Fn(MigrationEvent),
) -> Result<(), MigrateError> {
    let started = Instant::now();
    sqlx::query("BEGIN").execute(&mut *conn).await?;
    if let Err(e) = copy_and_record(conn, migration, copy, tell).await {
        let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
        return Err(e);
    }
    sqlx::query("COMMIT").execute(&mut *conn).await?;
    let nanos = i64::try_from(started.elapsed().as_nanos()).unwrap_or(i64::MAX);
    sqlx::query("UPDATE _sqlx_migrations SET execution_time = ?1 WHERE version = ?2")
        .bind(nanos)
        .bind(migration.version)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The work of [`apply_in_batches`], inside its transaction.
async fn copy_and_record(
    conn: &mut SqliteConnection,
    migration: &Migration,
    copy: BatchedCopy<'_>,
    tell: &impl Fn(MigrationEvent),
) -> Result<(), MigrateError> {
    let version = migration.version;
    let failed = |e| MigrateError::ExecuteMigration(e, version);
    sqlx::query(copy.before)
        .execute(&mut *conn)
        .await
        .map_err(failed)?;
    // The table's name is the migration's own text, checked by `batched`.
    let extent = format!(
        "SELECT COUNT(*), MIN(rowid), MAX(rowid) FROM {}",
        copy.table
    );
    let (of, low, high): (i64, Option<i64>, Option<i64>) = sqlx::query_as(&extent)
        .fetch_one(&mut *conn)
        .await
        .map_err(failed)?;
    let of = u64::try_from(of).unwrap_or(0);
    let mut rows = 0;
    if let (Some(low), Some(high)) = (low, high) {
        let mut from = low;
        loop {
            let to = from.saturating_add(BATCH_ROWIDS - 1).min(high);
            rows += sqlx::query(copy.copy)
                .bind(from)
                .bind(to)
                .execute(&mut *conn)
                .await
                .map_err(failed)?
                .rows_affected();
            tell(MigrationEvent::Copied {
                version,
                table: copy.table.to_owned(),
                rows,
                of,
            });
            if to >= high {
                break;
            }
            from = to + 1;
        }
    }
    sqlx::query(copy.after)
        .execute(&mut *conn)
        .await
        .map_err(failed)?;
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES (?1, ?2, TRUE, ?3, -1)",
    )
    .bind(version)
    .bind(&*migration.description)
    .bind(&*migration.checksum)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transcript_migration_splits_around_its_copy_and_loses_no_text() {
        let sql = include_str!("../migrations/0017_transcript_by_conversation_key.sql");
        let copy = batched(sql).expect("a batched copy");
        assert_eq!(copy.table, "transcript");
        assert!(copy
            .copy
            .trim_start()
            .starts_with("INSERT INTO transcript_by_key"));
        assert!(copy.copy.contains("BETWEEN COALESCE(?1"));
        assert!(copy.before.contains("CREATE TABLE transcript_by_key"));
        assert!(copy.after.starts_with("-- Dropping a table"));
        assert_eq!(
            [copy.before, copy.copy, copy.after].concat().len()
                + BATCH_START.len()
                + "transcript\n".len()
                + BATCH_END.len()
                + 1,
            sql.len()
        );
    }

    #[test]
    fn sql_without_markers_or_with_a_strange_table_name_is_applied_whole() {
        assert!(batched("CREATE TABLE t (x);").is_none());
        let named = |table: &str| {
            format!("{BATCH_START}{table}\nINSERT INTO a SELECT * FROM b;\n{BATCH_END}\n")
        };
        assert!(batched(&named("b")).is_some());
        assert!(batched(&named("b; DROP TABLE a")).is_none());
        assert!(batched(&format!("{BATCH_START}b\nINSERT INTO a SELECT * FROM b;\n")).is_none());
    }
}
