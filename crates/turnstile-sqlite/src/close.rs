//! Closing a store: the write-ahead log folded into the database file, so
//! the file alone is complete, and the connections closed.

use sqlx::SqliteConnection;
use turnstile_core::{Error, StoreError};

use crate::codec::db;
use crate::SqliteStore;

impl SqliteStore {
    /// Waits for the writes in progress, folds the write-ahead log into the
    /// database file (`PRAGMA wal_checkpoint(TRUNCATE)`) and closes every
    /// connection, so SQLite removes the `-wal` and `-shm` files. Afterwards
    /// the database file alone holds every committed step: it can be copied
    /// or moved. Every clone of the store is closed with it: a later call
    /// on any of them fails with [`Error::Store`].
    /// The same as [`StoreAdmin::close`](turnstile_core::StoreAdmin::close).
    ///
    /// # Errors
    /// [`Error::Store`] if the log could not be folded whole (another
    /// process was reading; [`StoreError::is_busy`]) or the database failed.
    /// Nothing committed is lost either way.
    pub async fn close(&self) -> Result<(), Error> {
        let folded = match self.look_only {
            true => Ok(false),
            false => self.fold_now().await,
        };
        self.writer.close().await;
        self.reader.close().await;
        if folded? {
            return Err(Error::Store(
                StoreError::new(
                    "the write-ahead log was not folded whole: another connection was reading",
                    None,
                )
                .busy(),
            ));
        }
        Ok(())
    }
}

impl SqliteStore {
    /// Folds the log without waiting for another process's readers or
    /// writers: a checkpoint that waited would hold their writes back for up
    /// to the busy timeout. Returns whether one kept it from folding whole.
    async fn fold_now(&self) -> Result<bool, Error> {
        let mut conn = self.writer.take().await?;
        // PRAGMAs are runtime queries (see `fold_log`). The connection is
        // closed right after, so its timeout need not be restored.
        sqlx::query("PRAGMA busy_timeout = 0")
            .execute(&mut *conn)
            .await
            .map_err(db("stop waiting for locks"))?;
        fold_log(&mut conn).await
    }
}

/// `PRAGMA wal_checkpoint(TRUNCATE)`: copies every logged page into the
/// file and empties the log. Returns whether a reader blocked it. (A PRAGMA
/// is a runtime query: the offline query macros cannot describe it.)
pub(crate) async fn fold_log(conn: &mut SqliteConnection) -> Result<bool, Error> {
    let (busy, _log, _checkpointed): (i64, i64, i64) =
        sqlx::query_as("PRAGMA wal_checkpoint(TRUNCATE)")
            .fetch_one(&mut *conn)
            .await
            .map_err(db("checkpoint the log"))?;
    Ok(busy != 0)
}
