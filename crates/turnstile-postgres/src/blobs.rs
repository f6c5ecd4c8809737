//! Images' and files' bytes, stored once by SHA-256 (`blobs`, migration
//! 0016). A step whose messages name blobs runs in a transaction that
//! stores them first: the message rows' triggers count the references and
//! refuse a row naming a blob that is not there.

use std::sync::Arc;

use sqlx::PgConnection;

use crate::codec::{db, to_i64};
use turnstile_core::backend::{checked_blob, missing_blob, StepBlobs};
use turnstile_core::message::BlobHash;
use turnstile_core::Error;

/// Stores the bytes a step's messages carry, each once, and locks the
/// blobs they name without bytes (refused if one is not here): until the
/// step commits, no concurrent delete can remove a blob it names.
pub(crate) async fn store(conn: &mut PgConnection, blobs: &StepBlobs) -> Result<(), Error> {
    for (sha256, bytes) in &blobs.loaded {
        let key = sha256.to_hex();
        let size = to_i64(bytes.len() as u64);
        let bytes: &[u8] = bytes;
        // The no-op update locks a row that is there; one another
        // transaction is deleting is waited for, then inserted again.
        sqlx::query!(
            "INSERT INTO blobs (sha256, size, bytes) VALUES ($1, $2, $3)
             ON CONFLICT (sha256) DO UPDATE SET refs = blobs.refs",
            key,
            size,
            bytes
        )
        .execute(&mut *conn)
        .await
        .map_err(db("store blob"))?;
    }
    for sha256 in &blobs.referenced {
        let key = sha256.to_hex();
        let found = sqlx::query_scalar!(
            "SELECT 1 AS \"found!: i32\" FROM blobs WHERE sha256 = $1 FOR UPDATE",
            key
        )
        .fetch_optional(&mut *conn)
        .await
        .map_err(db("lock blob"))?;
        if found.is_none() {
            return Err(missing_blob(*sha256));
        }
    }
    Ok(())
}

/// Removes the blobs [`store`] wrote that no row came to name (the step
/// wrote no message: a replayed claim, say).
pub(crate) async fn drop_unnamed(conn: &mut PgConnection, blobs: &StepBlobs) -> Result<(), Error> {
    let keys = blobs.hashes();
    sqlx::query!(
        "DELETE FROM blobs WHERE refs = 0 AND sha256 = ANY($1)",
        &keys as &[String]
    )
    .execute(&mut *conn)
    .await
    .map_err(db("drop unnamed blobs"))?;
    Ok(())
}

/// A blob's bytes, if this database holds them.
pub(crate) async fn load(
    conn: &mut PgConnection,
    sha256: BlobHash,
) -> Result<Option<Arc<[u8]>>, Error> {
    let key = sha256.to_hex();
    let bytes = sqlx::query_scalar!("SELECT bytes FROM blobs WHERE sha256 = $1", key)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db("load blob"))?;
    bytes.map(|bytes| checked_blob(sha256, bytes)).transpose()
}
