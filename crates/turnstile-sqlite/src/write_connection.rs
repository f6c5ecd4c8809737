//! The one connection every write runs on.
//!
//! The writer is a connection of its own behind a lock, not a pool: sqlx's
//! pool pings a connection each time it comes back, a round trip to the
//! connection's worker thread per write transaction, which was a third of
//! the cost of a bare commit here. An in-memory database reads on it too
//! (`read_connections.rs`).

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection, SqliteConnection};
use tokio::sync::{Mutex, OwnedMappedMutexGuard, OwnedMutexGuard};

use super::codec::db;
use turnstile_core::Error;
use turnstile_core::StoreError;

#[derive(Clone, Debug)]
pub(super) struct WriteConnection(Arc<Owned>);

#[derive(Debug)]
pub(super) struct Owned {
    /// `None` once the store is closed.
    conn: Arc<Mutex<Option<SqliteConnection>>>,
    /// To open a replacement for a connection left inside a transaction.
    connect: SqliteConnectOptions,
    /// How long a write waits for the connection before it is told busy.
    wait: Duration,
}

/// The write connection, held: nobody else writes until it is dropped.
pub(super) struct Held(OwnedMappedMutexGuard<Option<SqliteConnection>, SqliteConnection>);

impl WriteConnection {
    /// Opens the writer connection.
    pub(super) async fn open(connect: SqliteConnectOptions, wait: Duration) -> Result<Self, Error> {
        let conn = connect.connect().await.map_err(db("open writer"))?;
        Ok(Self(Arc::new(Owned {
            conn: Arc::new(Mutex::new(Some(conn))),
            connect,
            wait,
        })))
    }

    /// Closes the writer once the writes ahead have let it go; a later
    /// write is told the store is closed.
    pub(super) async fn close(&self) {
        let closing = self.0.conn.lock().await.take();
        if let Some(conn) = closing {
            if let Err(e) = conn.close().await {
                tracing::debug!(error = %e, "closing the writer connection failed");
            }
        }
    }

    /// The connection if nobody holds it.
    pub(super) fn try_take(&self) -> Option<Held> {
        let guard = self.0.conn.clone().try_lock_owned().ok()?;
        OwnedMutexGuard::try_map(guard, Option::as_mut)
            .ok()
            .map(Held)
    }

    /// The connection, once the writes ahead have let it go, fit for a new
    /// transaction.
    pub(super) async fn take(&self) -> Result<Held, Error> {
        let owned = &self.0;
        let guard = tokio::time::timeout(owned.wait, owned.conn.clone().lock_owned())
            .await
            .map_err(|_| {
                Error::Store(
                    StoreError::new("the writer connection stayed busy too long", None).busy(),
                )
            })?;
        let open = OwnedMutexGuard::try_map(guard, Option::as_mut)
            .map_err(|_| Error::Store(StoreError::new("the store is closed", None)))?;
        let mut held = Held(open);
        self.repair(&mut held).await?;
        Ok(held)
    }

    /// Makes a held connection fit for a new transaction. SQLite rolls a
    /// whole transaction back by itself on some errors (`SQLITE_FULL` in a
    /// single-row write, I/O errors); the `ROLLBACK` sqlx then sends fails,
    /// sqlx keeps counting the transaction as open and would refuse every
    /// later `BEGIN`: one full disk would end the store's writes for good.
    /// Such a connection is replaced.
    pub(super) async fn repair(&self, held: &mut Held) -> Result<(), Error> {
        let (owned, conn) = (&self.0, &mut held.0);
        if !conn.is_in_transaction() {
            return Ok(());
        }
        // A dropped transaction's rollback is queued on the worker; wait
        // for it.
        if conn.ping().await.is_ok() && !conn.is_in_transaction() {
            return Ok(());
        }
        tracing::warn!("replacing the writer connection, left inside a transaction");
        let fresh = tokio::time::timeout(owned.wait, owned.connect.connect())
            .await
            .map_err(|_| {
                Error::Store(StoreError::new("reopening the writer took too long", None).busy())
            })?
            .map_err(db("reopen writer"))?;
        let stale = std::mem::replace(&mut **conn, fresh);
        drop(stale);
        Ok(())
    }
}

impl Deref for Held {
    type Target = SqliteConnection;

    fn deref(&self) -> &SqliteConnection {
        &self.0
    }
}

impl DerefMut for Held {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        &mut self.0
    }
}
