//! Access tokens: a secret stands for one namespace until it is revoked;
//! the store keeps its SHA-256, never the secret.

use turnstile_core::admin::{token_sha256, TOKEN_PREFIX};
use turnstile_core::Namespace;

use crate::activity::SharedAdmin;
use crate::support::TestResult;

pub async fn a_token_stands_for_its_namespace_until_revoked_and_its_secret_is_not_kept(
    store: SharedAdmin,
) -> TestResult {
    let tenant_a = Namespace::new("tenant-a")?;
    let tenant_b = Namespace::new("tenant-b")?;
    let a = store.create_token(&tenant_a).await?;
    let b = store.create_token(&tenant_b).await?;
    assert!(a.token.starts_with(TOKEN_PREFIX));
    assert_ne!(a.token, b.token);
    assert_ne!(a.id, b.id);

    let namespace_of = |token: String| {
        let store = store.clone();
        async move { store.token_namespace(&token_sha256(&token)).await }
    };
    assert_eq!(namespace_of(a.token.clone()).await?, Some(tenant_a.clone()));
    assert_eq!(namespace_of(b.token.clone()).await?, Some(tenant_b.clone()));
    // A secret nobody was given, or one a character off, stands for nothing.
    assert_eq!(namespace_of(format!("{TOKEN_PREFIX}0")).await?, None);
    let mut off = a.token.clone();
    off.pop();
    off.push('x');
    assert_eq!(namespace_of(off).await?, None);

    // Listed without secrets, oldest first.
    let listed = store.tokens().await?;
    assert_eq!(
        listed
            .iter()
            .map(|t| (t.id, t.namespace.clone()))
            .collect::<Vec<_>>(),
        [(a.id, tenant_a.clone()), (b.id, tenant_b.clone())]
    );
    assert!(listed
        .iter()
        .all(|t| t.revoked_at.is_none() && t.created_at > 0));

    // Revoked: it admits nothing; the other token still does.
    assert!(store.revoke_token(a.id).await?);
    assert!(!store.revoke_token(a.id).await?, "revoked once only");
    assert!(!store.revoke_token(uuid::Uuid::new_v4()).await?);
    assert_eq!(namespace_of(a.token.clone()).await?, None);
    assert_eq!(namespace_of(b.token.clone()).await?, Some(tenant_b));
    let listed = store.tokens().await?;
    assert!(listed[0].revoked_at.is_some() && listed[1].revoked_at.is_none());
    Ok(())
}
