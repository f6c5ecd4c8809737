//! Access tokens (`migrations/0023_tokens.sql`): stored, looked up by the
//! SHA-256 of their secret, revoked, listed.

use turnstile_core::admin::{NewToken, TokenRecord};
use turnstile_core::ids::Namespace;
use turnstile_core::Error;

use crate::codec::{db, hex, now_ms, Row};
use crate::SqliteStore;

pub(super) async fn store(store: &SqliteStore, token: &NewToken) -> Result<(), Error> {
    let mut conn = store.writer.take().await?;
    let (id, namespace) = (token.id, token.namespace.as_str());
    let sha256 = token.sha256.as_slice();
    sqlx::query!(
        "INSERT INTO tokens (id, namespace, sha256, created_at) VALUES (?1, ?2, ?3, ?4)",
        id,
        namespace,
        sha256,
        token.created_at
    )
    .execute(&mut *conn)
    .await
    .map_err(db("store token"))?;
    Ok(())
}

pub(super) async fn namespace(
    store: &SqliteStore,
    sha256: &[u8; 32],
) -> Result<Option<Namespace>, Error> {
    let mut conn = store.reader.acquire().await?;
    let hash = sha256.as_slice();
    let found = sqlx::query!(
        "SELECT id, namespace FROM tokens WHERE sha256 = ?1 AND revoked_at IS NULL",
        hash
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("look up token"))?;
    found
        .map(|row| {
            let key = hex(&row.id);
            Row {
                table: "tokens",
                key: &key,
            }
            .namespace(&row.namespace)
        })
        .transpose()
}

pub(super) async fn revoke(store: &SqliteStore, id: uuid::Uuid) -> Result<bool, Error> {
    let mut conn = store.writer.take().await?;
    let now = now_ms();
    let revoked = sqlx::query!(
        "UPDATE tokens SET revoked_at = ?1 WHERE id = ?2 AND revoked_at IS NULL",
        now,
        id
    )
    .execute(&mut *conn)
    .await
    .map_err(db("revoke token"))?;
    Ok(revoked.rows_affected() == 1)
}

pub(super) async fn list(store: &SqliteStore) -> Result<Vec<TokenRecord>, Error> {
    let mut conn = store.reader.acquire().await?;
    let rows = sqlx::query!(
        "SELECT id, namespace, created_at, revoked_at FROM tokens ORDER BY created_at, id"
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db("list tokens"))?;
    rows.into_iter()
        .map(|row| {
            let key = hex(&row.id);
            let row_of = Row {
                table: "tokens",
                key: &key,
            };
            Ok(TokenRecord {
                id: row_of.uuid("id", &row.id)?,
                namespace: row_of.namespace(&row.namespace)?,
                created_at: row.created_at,
                revoked_at: row.revoked_at,
            })
        })
        .collect()
}
