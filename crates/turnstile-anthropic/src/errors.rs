//! Turning failures into [`ModelError`]s: non-2xx answers, `error` events,
//! transport failures; each says what went wrong and what to do, never
//! the key or what the model wrote.

use serde_json::Value;

use turnstile_core::ModelError;
use turnstile_model_http::{error_body, excerpt, retryable_status, EXCERPT_CHARS};

use crate::wire::error_text;
use crate::AnthropicConfig;

/// The error for a non-2xx answer.
pub(crate) async fn status_error(
    config: &AnthropicConfig,
    mut response: reqwest::Response,
) -> ModelError {
    let status = response.status();
    let text = error_body(&mut response).await;
    let (kind, detail) = match serde_json::from_str::<Value>(&text) {
        Ok(body) => error_text(&body),
        Err(_) => (None, Some(text)),
    };
    let mut message = format!("the anthropic messages endpoint answered {status}");
    if let Some(kind) = &kind {
        message.push_str(&format!(" ({})", excerpt(kind, 40)));
    }
    if let Some(detail) = detail.filter(|d| !d.trim().is_empty()) {
        message.push_str(": ");
        message.push_str(&excerpt(&config.redact(&detail), EXCERPT_CHARS));
    }
    message.push_str(match status.as_u16() {
        401 => "; check the api key (x-api-key)",
        403 => "; the key may not use this model or feature",
        404 => "; check the model name and the base url",
        413 => "; the request is too large: shorten the context or its attachments",
        _ => "",
    });
    let error = if retryable_status(status) {
        ModelError::retryable(message)
    } else {
        ModelError::fatal(message)
    };
    error.with_status(status.as_u16())
}

/// The error for an `error` event in a stream: overloads and server errors
/// may pass on retry, a refused request will not.
pub(crate) fn stream_error(config: &AnthropicConfig, event: &Value) -> ModelError {
    let (kind, detail) = error_text(event);
    let kind = kind.unwrap_or_else(|| "error".into());
    let message = format!(
        "the anthropic stream reported {}: {}",
        excerpt(&kind, 40),
        excerpt(&config.redact(&detail.unwrap_or_default()), EXCERPT_CHARS)
    );
    match kind.as_str() {
        "invalid_request_error"
        | "authentication_error"
        | "permission_error"
        | "not_found_error"
        | "request_too_large" => ModelError::fatal(message),
        _ => ModelError::retryable(message),
    }
}

/// The error for a failure of the HTTP exchange itself.
pub(crate) fn transport_error(
    config: &AnthropicConfig,
    e: reqwest::Error,
    during: &str,
) -> ModelError {
    turnstile_model_http::transport_error(
        e,
        during,
        "the anthropic messages endpoint",
        config.timeout,
        config.key(),
    )
}
