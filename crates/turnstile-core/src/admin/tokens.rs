//! Access tokens: a secret that stands for one namespace, for servers that
//! take requests from several tenants (`turnstile serve --tokens`). A store
//! keeps each token's SHA-256, never the secret, which is shown once.

use serde::Serialize;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::ids::Namespace;

/// What every secret starts with, so that one pasted into the wrong place
/// is recognizable.
pub const TOKEN_PREFIX: &str = "tst_";

/// A token as stored: its id, its namespace, the SHA-256 of its secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewToken {
    /// The token's id (what revoking names).
    pub id: Uuid,
    /// The namespace it stands for.
    pub namespace: Namespace,
    /// The SHA-256 of its secret.
    pub sha256: [u8; 32],
    /// Unix milliseconds.
    pub created_at: i64,
}

/// A token as issued: the secret is here, and nowhere else (its `Debug`
/// leaves it out, so that no log prints it).
#[derive(Clone, PartialEq, Eq, Serialize)]
pub struct IssuedToken {
    /// The token's id (what revoking names).
    pub id: Uuid,
    /// The namespace it stands for.
    pub namespace: Namespace,
    /// The secret a client sends as `Authorization: Bearer …`.
    pub token: String,
}

impl std::fmt::Debug for IssuedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedToken")
            .field("id", &self.id)
            .field("namespace", &self.namespace)
            .field("token", &"…")
            .finish()
    }
}

/// A token as listed: no secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TokenRecord {
    /// The token's id.
    pub id: Uuid,
    /// The namespace it stands for.
    pub namespace: Namespace,
    /// Unix milliseconds.
    pub created_at: i64,
    /// Unix milliseconds; a revoked token admits nothing.
    pub revoked_at: Option<i64>,
}

/// A new secret and the token that stores it: 244 random bits (two
/// version-4 UUIDs, from the operating system's generator) as hex after
/// [`TOKEN_PREFIX`].
pub fn new_token(namespace: &Namespace, created_at: i64) -> (IssuedToken, NewToken) {
    let random: Vec<u8> = [Uuid::new_v4(), Uuid::new_v4()]
        .iter()
        .flat_map(|u| *u.as_bytes())
        .collect();
    let token = format!("{TOKEN_PREFIX}{}", hex::encode(random));
    let stored = NewToken {
        // Time-ordered within this process, so a listing by (created_at,
        // id) is oldest first even within one millisecond.
        id: Uuid::now_v7(),
        namespace: namespace.clone(),
        sha256: token_sha256(&token),
        created_at,
    };
    let issued = IssuedToken {
        id: stored.id,
        namespace: namespace.clone(),
        token,
    };
    (issued, stored)
}

/// The SHA-256 a store keeps of `token`.
pub fn token_sha256(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}
