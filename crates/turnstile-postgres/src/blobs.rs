//! Images' and files' bytes, stored once by SHA-256 (`blobs` and
//! `blob_bytes`, migration 0016). A step whose messages name blobs runs in a transaction that
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
        // The no-op update locks a row another transaction inserted
        // meanwhile (its bytes are there then); one it is deleting is
        // waited for, then inserted again. `xmax = 0` only on an insert.
        let blob = sqlx::query!(
            r#"INSERT INTO blobs (sha256, size) VALUES ($1, $2)
               ON CONFLICT (sha256) DO UPDATE SET refs = blobs.refs
               RETURNING id, (xmax = 0) AS "inserted!""#,
            key,
            size
        )
        .fetch_one(&mut *conn)
        .await
        .map_err(db("store blob"))?;
        if !blob.inserted {
            continue;
        }
        let bytes: &[u8] = bytes;
        // Whole chunks of 8,120 bytes, then the rest in pieces of at most
        // 2,000: see `blob_bytes` in migration 0016.
        sqlx::query!(
            "INSERT INTO blob_bytes (blob, chunk, bytes)
             SELECT $1, chunk, substring($2::bytea FROM start + 1 FOR size)
             FROM (SELECT length($2::bytea) / 8120 AS whole) AS n,
                  LATERAL (SELECT c AS chunk, c * 8120 AS start, 8120 AS size
                           FROM generate_series(0, n.whole - 1) AS c
                           UNION ALL
                           SELECT n.whole + p, n.whole * 8120 + p * 2000, 2000
                           FROM generate_series(
                               0, (length($2::bytea) - n.whole * 8120 + 1999) / 2000 - 1) AS p
                          ) AS piece",
            blob.id,
            bytes
        )
        .execute(&mut *conn)
        .await
        .map_err(db("store blob bytes"))?;
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
    let bytes = sqlx::query_scalar!(
        r#"SELECT coalesce((SELECT string_agg(c.bytes, ''::bytea ORDER BY c.chunk)
                            FROM blob_bytes c WHERE c.blob = b.id), ''::bytea) AS "bytes!"
           FROM blobs b WHERE b.sha256 = $1"#,
        key
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("load blob"))?;
    bytes.map(|bytes| checked_blob(sha256, bytes)).transpose()
}
