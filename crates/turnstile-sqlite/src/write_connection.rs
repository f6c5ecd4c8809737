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
use super::open::memory_copy;
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
    /// The database lives in the connection itself (in memory): a
    /// replacement gets a copy of it.
    in_memory: bool,
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
            in_memory: false,
            wait,
        })))
    }

    /// The writer of an in-memory database: `conn`, which holds it.
    pub(super) fn in_memory(
        conn: SqliteConnection,
        connect: SqliteConnectOptions,
        wait: Duration,
    ) -> Self {
        Self(Arc::new(Owned {
            conn: Arc::new(Mutex::new(Some(conn))),
            connect,
            in_memory: true,
            wait,
        }))
    }

    /// Whether the database lives in the connection itself (no file).
    pub(super) fn is_in_memory(&self) -> bool {
        self.0.in_memory
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
        let reopen = async {
            match owned.in_memory {
                // SQLite rolled the transaction back: what the database
                // holds is whole; the replacement takes a copy of it.
                true => {
                    // As a statement of its own, which sqlx does not count:
                    // should SQLite not have rolled back, nothing half
                    // written is copied.
                    let _ = sqlx::query("ROLLBACK").execute(&mut **conn).await;
                    let image = conn.serialize(None).await.map_err(db("copy writer"))?;
                    memory_copy(&owned.connect, image).await
                }
                false => owned.connect.connect().await.map_err(db("reopen writer")),
            }
        };
        let fresh = tokio::time::timeout(owned.wait, reopen)
            .await
            .map_err(|_| {
                Error::Store(StoreError::new("reopening the writer took too long", None).busy())
            })??;
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

#[cfg(test)]
mod tests {
    use sqlx::{Connection, Executor};

    use super::*;
    use crate::open::{memory_copy, memory_options};

    /// A writer whose database lives in it, left inside a transaction
    /// SQLite rolled back by itself (a full database), is replaced by a
    /// connection holding a copy of what the database held: nothing is
    /// lost, and the replacement takes transactions again.
    #[tokio::test]
    async fn an_in_memory_writer_left_inside_a_transaction_is_replaced_by_a_copy() {
        // Held as the store holds it: a copy of a database's image.
        let connect = memory_options();
        let mut template = connect.connect().await.unwrap();
        template
            .execute("CREATE TABLE t (x BLOB NOT NULL); INSERT INTO t VALUES (x'01')")
            .await
            .unwrap();
        let image = template.serialize(None).await.unwrap();
        let conn = memory_copy(&connect, image).await.unwrap();
        let writer = WriteConnection::in_memory(conn, connect, Duration::from_secs(5));
        let mut held = writer.take().await.unwrap();
        let pages: i64 = sqlx::query_scalar("PRAGMA page_count")
            .fetch_one(&mut *held)
            .await
            .unwrap();
        sqlx::query(&format!("PRAGMA max_page_count = {pages}"))
            .execute(&mut *held)
            .await
            .unwrap();
        {
            let mut tx = held.begin().await.unwrap();
            let full = sqlx::query("INSERT INTO t VALUES (zeroblob(1000000))")
                .execute(&mut *tx)
                .await
                .unwrap_err();
            assert!(full.to_string().contains("full"), "{full}");
        }
        assert!(
            held.is_in_transaction(),
            "the stuck state this test is about"
        );
        writer.repair(&mut held).await.unwrap();
        assert!(!held.is_in_transaction());
        let rows: Vec<Vec<u8>> = sqlx::query_scalar("SELECT x FROM t")
            .fetch_all(&mut *held)
            .await
            .unwrap();
        assert_eq!(rows, vec![vec![1u8]]);
        let mut tx = held.begin().await.unwrap();
        sqlx::query("INSERT INTO t VALUES (x'02')")
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
}
