//! Turning failures into [`ModelError`]s: non-2xx answers, `error` objects,
//! transport failures and undecodable JSON, each classified as retryable or
//! not, and described without the API key or any model output.

use reqwest::header::RETRY_AFTER;
use serde_json::{json, Value};

use turnstile_core::ModelError;
use turnstile_model_http::{error_body, excerpt, retryable_status, EXCERPT_CHARS};

use crate::OpenAiConfig;

/// The error for a non-2xx answer.
pub(crate) async fn status_error(
    config: &OpenAiConfig,
    mut response: reqwest::Response,
) -> ModelError {
    let status = response.status();
    let retry_after = response
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(|v| format!(" (retry after {})", excerpt(v, 40)))
        .unwrap_or_default();
    let text = error_body(&mut response).await;
    let detail = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| error_text(&v))
        .unwrap_or(text);
    let detail = excerpt(&config.redact(&detail), EXCERPT_CHARS);
    let mut message = format!("chat completions endpoint answered {status}{retry_after}");
    if !detail.is_empty() {
        message.push_str(": ");
        message.push_str(&detail);
    }
    let error = match retryable_status(status) {
        true => ModelError::retryable(message),
        false => ModelError::fatal(message),
    };
    error.with_status(status.as_u16())
}

/// The error for an `error` object in a successful answer or a stream.
pub(crate) fn error_object(config: &OpenAiConfig, error: &Value, place: &str) -> ModelError {
    let detail = error_text(&json!({ "error": error })).unwrap_or_default();
    let message = format!(
        "{place} reported an error: {}",
        excerpt(&config.redact(&detail), EXCERPT_CHARS)
    );
    // Such errors are mostly the server failing mid-answer; only a
    // refusal of the request itself is final.
    let code = error.get("code");
    let client_error = error.get("type").and_then(Value::as_str) == Some("invalid_request_error")
        || code
            .and_then(Value::as_u64)
            .is_some_and(|c| (400..500).contains(&c) && c != 408 && c != 429);
    match client_error {
        true => ModelError::fatal(message),
        false => ModelError::retryable(message),
    }
}

/// The error for a failure of the HTTP exchange itself.
pub(crate) fn transport_error(
    config: &OpenAiConfig,
    e: reqwest::Error,
    during: &str,
) -> ModelError {
    turnstile_model_http::transport_error(
        e,
        during,
        "the chat completions endpoint",
        config.timeout,
        config.key(),
    )
}

/// The human-readable part of an error body: `error.message`, `error` as a
/// string, or `message`.
pub(crate) fn error_text(body: &Value) -> Option<String> {
    let error = body.get("error");
    error
        .and_then(|e| e.get("message"))
        .or_else(|| error.filter(|e| e.is_string()))
        .or_else(|| body.get("message"))
        .and_then(Value::as_str)
        .map(str::to_owned)
        .or_else(|| error.map(Value::to_string))
}
