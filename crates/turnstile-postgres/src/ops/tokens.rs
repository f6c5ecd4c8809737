//! Access tokens (`migrations/0023_tokens.sql`): stored, looked up by the
//! SHA-256 of their secret, revoked, listed.

use sqlx::PgConnection;
use turnstile_core::admin::{NewToken, TokenRecord};
use turnstile_core::ids::Namespace;
use turnstile_core::Error;
use uuid::Uuid;

use crate::codec::{db, now_ms, Row};

/// Idempotent: a retry after a lost acknowledgement finds its row.
pub(super) async fn store(conn: &mut PgConnection, token: &NewToken) -> Result<(), Error> {
    sqlx::query!(
        "INSERT INTO tokens (id, namespace, sha256, created_at) VALUES ($1, $2, $3, $4)
         ON CONFLICT (id) DO NOTHING",
        token.id,
        token.namespace.as_str(),
        token.sha256.as_slice(),
        token.created_at
    )
    .execute(conn)
    .await
    .map_err(db("store token"))?;
    Ok(())
}

pub(super) async fn namespace(
    conn: &mut PgConnection,
    sha256: &[u8; 32],
) -> Result<Option<Namespace>, Error> {
    let found = sqlx::query!(
        "SELECT id, namespace FROM tokens WHERE sha256 = $1 AND revoked_at IS NULL",
        sha256.as_slice()
    )
    .fetch_optional(conn)
    .await
    .map_err(db("look up token"))?;
    found
        .map(|row| {
            let key = row.id.to_string();
            Row {
                table: "tokens",
                key: &key,
            }
            .namespace(&row.namespace)
        })
        .transpose()
}

/// Retried after a lost acknowledgement, a revoke whose first attempt
/// took effect finds the token revoked, and answers as that attempt would.
pub(super) async fn revoke(conn: &mut PgConnection, id: Uuid, retry: bool) -> Result<bool, Error> {
    let revoked = sqlx::query_scalar!(
        r#"WITH revoked AS (
               UPDATE tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL
               RETURNING 1
           )
           SELECT EXISTS (SELECT 1 FROM revoked) AS "revoked!""#,
        now_ms(),
        id
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(db("revoke token"))?;
    Ok(revoked || retry && was_revoked(conn, id).await?)
}

async fn was_revoked(conn: &mut PgConnection, id: Uuid) -> Result<bool, Error> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM tokens WHERE id = $1 AND revoked_at IS NOT NULL)
               AS "revoked!""#,
        id
    )
    .fetch_one(conn)
    .await
    .map_err(db("read token"))
}

pub(super) async fn list(conn: &mut PgConnection) -> Result<Vec<TokenRecord>, Error> {
    let rows = sqlx::query!(
        "SELECT id, namespace, created_at, revoked_at FROM tokens ORDER BY created_at, id"
    )
    .fetch_all(conn)
    .await
    .map_err(db("list tokens"))?;
    rows.into_iter()
        .map(|row| {
            let key = row.id.to_string();
            Ok(TokenRecord {
                id: row.id,
                namespace: Row {
                    table: "tokens",
                    key: &key,
                }
                .namespace(&row.namespace)?,
                created_at: row.created_at,
                revoked_at: row.revoked_at,
            })
        })
        .collect()
}
