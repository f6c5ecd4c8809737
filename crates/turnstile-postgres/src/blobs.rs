//! Images' and files' bytes, stored once by SHA-256 (`blobs`, migration
//! 0016). A step whose messages name blobs runs in a transaction that
//! stores them first: the message rows' triggers count the references and
//! refuse a row naming a blob that is not there.

use std::sync::Arc;

use sqlx::PgConnection;

use crate::codec::{db, to_i64};
use turnstile_core::backend::{checked_blob, missing_blob, wrong_blob_size, StepBlobs};
use turnstile_core::message::BlobHash;
use turnstile_core::Error;

/// Stores the bytes a step's messages carry, each once, and locks every
/// blob they name (one named without bytes is refused if it is not here,
/// or not of the size the reference claims): until the step commits, no
/// concurrent delete can remove a blob it names.
pub(crate) async fn store(conn: &mut PgConnection, blobs: &StepBlobs) -> Result<(), Error> {
    for (sha256, bytes) in &blobs.loaded {
        let key = sha256.to_hex();
        // Bytes already stored are locked, not sent again.
        let held = sqlx::query_scalar!("SELECT size FROM blobs WHERE sha256 = $1 FOR UPDATE", key)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db("lock blob"))?;
        if held.is_some() {
            continue;
        }
        let size = to_i64(bytes.len() as u64);
        let bytes: &[u8] = bytes;
        // The no-op update locks a row another transaction inserted
        // meanwhile; one it is deleting is waited for, then inserted again.
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
    for &(sha256, claimed) in &blobs.referenced {
        let key = sha256.to_hex();
        let stored =
            sqlx::query_scalar!("SELECT size FROM blobs WHERE sha256 = $1 FOR UPDATE", key)
                .fetch_optional(&mut *conn)
                .await
                .map_err(db("lock blob"))?;
        match stored {
            None => return Err(missing_blob(sha256)),
            Some(size) if u64::try_from(size).ok() != Some(claimed) => {
                return Err(wrong_blob_size(
                    sha256,
                    claimed,
                    u64::try_from(size).unwrap_or(0),
                ))
            }
            Some(_) => {}
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
