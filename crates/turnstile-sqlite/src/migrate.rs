//! Applying the pending migrations one at a time, telling an observer of
//! each: a migration that copies a large table takes a while, and whoever
//! opened the database should know what it is waiting for.
//!
//! This is sqlx's `Migrator::run_direct` with a call before and after each
//! migration, which sqlx does not offer; each migration is still applied by
//! sqlx (`Migrate::apply`: its SQL and its `_sqlx_migrations` row in one
//! transaction), so a migration killed at any point leaves the database
//! as it was before that migration, and the next open applies it again.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::migrate::{Migrate, MigrateError, Migrator};
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
        conn.apply(migration).await.map_err(|error| Failed {
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
