//! Images' and files' bytes, stored once by SHA-256 (`blobs` and
//! `blob_bytes`, migration 0016). A step whose messages name blobs stores
//! them first, in its own transaction: the message rows' triggers count the
//! references and refuse a row naming a blob that is not there.

use std::sync::Arc;

use sqlx::SqliteConnection;

use crate::codec::{db, to_i64};
use turnstile_core::backend::{checked_blob, missing_blob, to_json, wrong_blob_size, StepBlobs};
use turnstile_core::message::BlobHash;
use turnstile_core::Error;

/// Stores the bytes a step's messages carry, each once, and checks that
/// the blobs they name without bytes are here, of the size they claim.
pub(crate) async fn store(conn: &mut SqliteConnection, blobs: &StepBlobs) -> Result<(), Error> {
    for (sha256, bytes) in &blobs.loaded {
        let key = sha256.to_hex();
        let size = to_i64(bytes.len() as u64);
        let new = sqlx::query!(
            "INSERT INTO blobs (sha256, size) VALUES (?1, ?2) ON CONFLICT (sha256) DO NOTHING",
            key,
            size
        )
        .execute(&mut *conn)
        .await
        .map_err(db("store blob"))?;
        // Bytes already stored under their hash are not sent again.
        if new.rows_affected() == 1 {
            let bytes: &[u8] = bytes;
            sqlx::query!(
                "INSERT INTO blob_bytes (sha256, bytes) VALUES (?1, ?2)",
                key,
                bytes
            )
            .execute(&mut *conn)
            .await
            .map_err(db("store blob bytes"))?;
        }
    }
    for &(sha256, claimed) in &blobs.referenced {
        let key = sha256.to_hex();
        let stored = sqlx::query_scalar!("SELECT size FROM blobs WHERE sha256 = ?1", key)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db("find blob"))?;
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
/// wrote no message: a replayed claim, say); their bytes go with them.
pub(crate) async fn drop_unnamed(
    conn: &mut SqliteConnection,
    blobs: &StepBlobs,
) -> Result<(), Error> {
    let keys = to_json(&blobs.hashes())?;
    sqlx::query!(
        "DELETE FROM blobs WHERE refs = 0 AND sha256 IN (SELECT value FROM json_each(?1))",
        keys
    )
    .execute(&mut *conn)
    .await
    .map_err(db("drop unnamed blobs"))?;
    Ok(())
}

/// A blob's bytes, if this database holds them.
pub(crate) async fn load(
    conn: &mut SqliteConnection,
    sha256: BlobHash,
) -> Result<Option<Arc<[u8]>>, Error> {
    let key = sha256.to_hex();
    let bytes = sqlx::query_scalar!("SELECT bytes FROM blob_bytes WHERE sha256 = ?1", key)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db("load blob"))?;
    bytes.map(|bytes| checked_blob(sha256, bytes)).transpose()
}
