//! The HTTP exchange's edges both clients share: the endpoint URL, what a
//! response says it holds, bounded reads of answers and error bodies, and
//! which statuses may pass when sent again.

use std::time::Duration;

use reqwest::header::CONTENT_TYPE;
use reqwest::StatusCode;
use turnstile_core::ModelError;

use crate::key::redact;
use crate::text::chain;

/// How much of an error body is read.
const MAX_ERROR_BODY_BYTES: usize = 16 << 10;

/// How many characters of a server's error text go into a
/// [`ModelError`].
pub const EXCERPT_CHARS: usize = 300;

/// `{base_url}{path}`, checked to be an `http`/`https` URL; errors name
/// the client (`what`: "openai", "anthropic").
///
/// # Errors
/// A fatal [`ModelError`] for an empty or invalid base URL or another
/// scheme.
pub fn endpoint_url(base_url: &str, path: &str, what: &str) -> Result<reqwest::Url, ModelError> {
    let base = base_url.trim().trim_end_matches('/');
    if base.is_empty() {
        return Err(ModelError::fatal(format!("the {what} base url is empty")));
    }
    let url = reqwest::Url::parse(&format!("{base}{path}"))
        .map_err(|e| ModelError::fatal(format!("invalid {what} base url: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ModelError::fatal(format!(
            "invalid {what} base url: scheme {} is not http or https",
            url.scheme()
        )));
    }
    Ok(url)
}

/// Whether a response says its body is JSON (rather than an event stream).
pub fn is_json(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("application/json"))
}

/// Why a body could not be read whole.
#[derive(Debug)]
pub enum BodyError {
    /// It is over the limit given.
    TooLarge,
    /// The connection failed while it was read.
    Transport(reqwest::Error),
}

/// The whole body, refused once it passes `max` bytes.
///
/// # Errors
/// [`BodyError::TooLarge`] past `max`; [`BodyError::Transport`] when the
/// connection fails.
pub async fn read_body(response: &mut reqwest::Response, max: usize) -> Result<Vec<u8>, BodyError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(BodyError::Transport)? {
        if body.len() + chunk.len() > max {
            return Err(BodyError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// At most 16 KiB of an error answer's body, as text. A body that cannot be
/// read only costs the detail.
pub async fn error_body(response: &mut reqwest::Response) -> String {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        let room = MAX_ERROR_BODY_BYTES.saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() >= MAX_ERROR_BODY_BYTES {
            break;
        }
    }
    String::from_utf8_lossy(&body).into_owned()
}

/// The error for a failure of the HTTP exchange itself, `during` one of
/// its steps ("reading the response"), with `endpoint` naming where it was
/// sent ("the chat completions endpoint"). Timeouts, refused connections
/// and dropped ones may pass on retry; a request that could not be built or
/// was redirected will not. `key` is redacted from the detail.
pub fn transport_error(
    e: reqwest::Error,
    during: &str,
    endpoint: &str,
    timeout: Duration,
    key: Option<&str>,
) -> ModelError {
    let e = e.without_url();
    if e.is_timeout() {
        return ModelError::retryable(format!(
            "{endpoint} timed out while {during} (timeout {timeout:?})"
        ));
    }
    let detail = redact(key, &chain(&e));
    if e.is_builder() || e.is_redirect() || e.is_decode() {
        ModelError::fatal(format!(
            "the request to {endpoint} failed while {during}: {detail}"
        ))
    } else if e.is_connect() {
        ModelError::retryable(format!("cannot connect to {endpoint}: {detail}"))
    } else {
        ModelError::retryable(format!("the connection failed while {during}: {detail}"))
    }
}

/// Whether an answer with this status may pass when sent again: request
/// timeouts (408), rate limits (429) and server errors (5xx, an overload's
/// 529 included).
pub fn retryable_status(status: StatusCode) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS
        || status == StatusCode::REQUEST_TIMEOUT
        || status.is_server_error()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_urls_are_checked() {
        assert_eq!(
            endpoint_url("http://127.0.0.1:8080/v1/", "/chat/completions", "openai")
                .unwrap()
                .as_str(),
            "http://127.0.0.1:8080/v1/chat/completions"
        );
        let error = endpoint_url("", "/x", "anthropic").unwrap_err();
        assert_eq!(error.message, "the anthropic base url is empty");
        assert!(endpoint_url("ftp://example.com", "/x", "openai")
            .unwrap_err()
            .message
            .contains("scheme ftp is not http or https"));
        assert!(endpoint_url("not a url", "/x", "openai").is_err());
    }

    #[test]
    fn retryable_statuses() {
        for (status, retryable) in [
            (408, true),
            (429, true),
            (500, true),
            (529, true),
            (400, false),
            (401, false),
            (404, false),
        ] {
            assert_eq!(
                retryable_status(StatusCode::from_u16(status).unwrap()),
                retryable,
                "{status}"
            );
        }
    }
}
