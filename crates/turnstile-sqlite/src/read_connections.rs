//! The connections reads run on.
//!
//! Owned, not pooled, for the reason the writer is (`write_connection.rs`):
//! sqlx's pool pings every connection it takes back, from a task it spawns
//! for it (`return_to_pool` in sqlx 0.8.6, with no option to turn it off),
//! so each pooled read cost a second round trip to the connection's worker
//! thread and a task hand-off: about 10 context switches against 4. Here a
//! read waits for one of at most `max` connections, each opened when first
//! needed, and gives it back when its guard drops. An in-memory database
//! reads on its writer connection, the one connection that holds it.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection, SqliteConnection};
use tokio::sync::{Mutex, OwnedMappedMutexGuard, OwnedMutexGuard, OwnedSemaphorePermit, Semaphore};

use super::codec::db;
use super::write_connection::{Held, WriteConnection};
use turnstile_core::{Error, StoreError};

#[derive(Clone, Debug)]
pub(super) enum ReadConnections {
    Owned(Arc<Readers>),
    Writer(WriteConnection),
}

#[derive(Debug)]
pub(super) struct Readers {
    connect: SqliteConnectOptions,
    /// `None` until first used, and again once the store is closed.
    slots: Vec<Arc<Mutex<Option<SqliteConnection>>>>,
    /// One per slot; a read holds one while it holds a slot. Closed with
    /// the store.
    permits: Arc<Semaphore>,
    /// How long a read waits for a connection before it is told busy.
    wait: Duration,
}

/// A connection to read on, given back when dropped.
pub(super) enum Reader {
    Owned {
        // Declared first, so it is given back before the permit.
        conn: OwnedMappedMutexGuard<Option<SqliteConnection>, SqliteConnection>,
        _permit: OwnedSemaphorePermit,
    },
    Writer(Held),
}

impl ReadConnections {
    /// At most `max` reader connections of a file database.
    pub(super) fn open(connect: SqliteConnectOptions, max: u32, wait: Duration) -> Self {
        let max = max.max(1);
        Self::Owned(Arc::new(Readers {
            connect,
            slots: (0..max).map(|_| Arc::new(Mutex::new(None))).collect(),
            permits: Arc::new(Semaphore::new(max as usize)),
            wait,
        }))
    }

    /// A connection, once one is free.
    pub(super) async fn acquire(&self) -> Result<Reader, Error> {
        let readers = match self {
            Self::Owned(readers) => readers,
            Self::Writer(writer) => return writer.take().await.map(Reader::Writer),
        };
        let permit = tokio::time::timeout(readers.wait, readers.permits.clone().acquire_owned())
            .await
            .map_err(|_| {
                Error::Store(StoreError::new("every reader stayed busy too long", None).busy())
            })?
            .map_err(|_| closed())?;
        // With a permit, some slot is free: the earliest is taken, so a
        // store read by one task at a time opens one connection.
        for slot in &readers.slots {
            let Ok(mut guard) = slot.clone().try_lock_owned() else {
                continue;
            };
            readers.make_fit(&mut guard).await?;
            let conn = OwnedMutexGuard::try_map(guard, Option::as_mut).map_err(|_| closed())?;
            return Ok(Reader::Owned {
                conn,
                _permit: permit,
            });
        }
        Err(Error::Store(
            StoreError::new("no reader was free", None).busy(),
        ))
    }

    /// Closes the reader connections once the reads in progress give them
    /// back, and refuses later reads.
    pub(super) async fn close(&self) {
        let Self::Owned(readers) = self else {
            return;
        };
        readers.permits.close();
        for slot in &readers.slots {
            let closing = slot.lock().await.take();
            if let Some(conn) = closing {
                if let Err(e) = conn.close().await {
                    tracing::debug!(error = %e, "closing a reader connection failed");
                }
            }
        }
    }
}

impl Readers {
    /// Opens the slot's connection if it has none, or replaces one that a
    /// dropped read left inside its transaction (after waiting for the
    /// rollback sqlx queued for it).
    async fn make_fit(&self, slot: &mut Option<SqliteConnection>) -> Result<(), Error> {
        if self.permits.is_closed() {
            return Err(closed());
        }
        if let Some(conn) = slot {
            if !conn.is_in_transaction() {
                return Ok(());
            }
            if conn.ping().await.is_ok() && !conn.is_in_transaction() {
                return Ok(());
            }
        }
        let fresh = self.connect.connect().await.map_err(db("open reader"))?;
        if let Some(stale) = slot.replace(fresh) {
            drop(stale);
        }
        Ok(())
    }
}

fn closed() -> Error {
    Error::Store(StoreError::new("the store is closed", None))
}

impl Deref for Reader {
    type Target = SqliteConnection;

    fn deref(&self) -> &SqliteConnection {
        match self {
            Reader::Owned { conn, .. } => conn,
            Reader::Writer(held) => held,
        }
    }
}

impl DerefMut for Reader {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        match self {
            Reader::Owned { conn, .. } => conn,
            Reader::Writer(held) => held,
        }
    }
}
