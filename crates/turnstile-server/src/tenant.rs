//! Who a request acts for: the namespace of its bearer token, or the
//! server's one namespace when it takes no tokens (and then only from a
//! loopback name, so that a web page cannot reach it through a name of its
//! own that resolves to 127.0.0.1). Checked before a body is read.

use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, HOST};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use turnstile_core::admin::token_sha256;
use turnstile_core::ids::Namespace;

use crate::errors::ApiError;
use crate::Server;

/// The namespace a request acts in, and its token's SHA-256 when it came
/// with one (a long event stream checks it again).
#[derive(Clone)]
pub(crate) struct Tenant {
    pub(crate) namespace: Namespace,
    pub(crate) token: Option<[u8; 32]>,
}

/// Puts the request's [`Tenant`] in its extensions, or answers `401`
/// (`403` for a name that is not loopback's on a server without tokens).
pub(crate) async fn admit(
    State(server): State<Server>,
    mut request: Request,
    next: Next,
) -> Response {
    match tenant_of(&server, request.headers()).await {
        Ok(tenant) => {
            request.extensions_mut().insert(tenant);
            next.run(request).await
        }
        Err(error) => error.into_response(),
    }
}

async fn tenant_of(server: &Server, headers: &HeaderMap) -> Result<Tenant, ApiError> {
    if !server.tokens {
        if !loopback_host(headers) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden_host",
                "a server without tokens answers loopback names only",
                "reach it as 127.0.0.1 or localhost, or serve with --tokens",
            ));
        }
        return Ok(Tenant {
            namespace: server.namespace.clone(),
            token: None,
        });
    }
    let token = headers
        .get(AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .filter(|token| !token.is_empty())
        .ok_or_else(|| ApiError::unauthorized("no bearer token"))?;
    let sha256 = token_sha256(token);
    let namespace = server
        .store
        .token_namespace(&sha256)
        .await?
        .ok_or_else(|| ApiError::unauthorized("the token is unknown or revoked"))?;
    Ok(Tenant {
        namespace,
        token: Some(sha256),
    })
}

/// A `Host` of `localhost`, `127.0.0.1` or `[::1]` (any port), or none.
fn loopback_host(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(HOST) else {
        return true;
    };
    let Ok(host) = host.to_str() else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.split(':').next().unwrap_or_default(),
    };
    matches!(
        name.to_ascii_lowercase().as_str(),
        "localhost" | "127.0.0.1" | "::1"
    )
}
