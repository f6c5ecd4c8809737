//! `GET /`: a page to pick a conversation, send a message, watch its
//! events and live text, and decide the calls waiting for approval. Static
//! files in the binary: no build step, nothing fetched from elsewhere. The
//! page's own API calls carry the tenant's token; the page itself is no
//! secret.

use axum::http::header::{CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS};
use axum::http::HeaderName;
use axum::response::IntoResponse;

const INDEX: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/page.js");

/// Scripts from the server only, no inline script or markup-borne
/// handler: a model's text that slipped into the page as HTML would run
/// nothing.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; \
                      connect-src 'self'; base-uri 'none'; form-action 'none'; \
                      frame-ancestors 'none'";

const CONTENT_SECURITY_POLICY: HeaderName = HeaderName::from_static("content-security-policy");

pub(crate) async fn index() -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, "text/html; charset=utf-8"),
            (CONTENT_SECURITY_POLICY, POLICY),
            (X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        INDEX,
    )
}

pub(crate) async fn script() -> impl IntoResponse {
    (
        [
            (CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        SCRIPT,
    )
}
