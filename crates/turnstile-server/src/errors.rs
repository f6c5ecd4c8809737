//! Every error as one JSON object with the status that fits it.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use turnstile_core::Error;

/// An error answered as `{"error": {"kind", "message", "next"}}`: what went
/// wrong in a word, in a sentence, and what to do next.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    next: String,
}

#[derive(Serialize)]
struct Document<'a> {
    error: Body<'a>,
}

#[derive(Serialize)]
struct Body<'a> {
    kind: &'a str,
    message: &'a str,
    next: &'a str,
}

impl ApiError {
    /// An error of the request itself (`400`, or `status`).
    pub(crate) fn bad_request(
        status: StatusCode,
        kind: &'static str,
        message: impl Into<String>,
        next: impl Into<String>,
    ) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
            next: next.into(),
        }
    }

    /// A request that names no tenant this server knows.
    pub(crate) fn unauthorized(message: &str) -> Self {
        Self::bad_request(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            message,
            "send `Authorization: Bearer TOKEN` with a token from `turnstile token create`",
        )
    }

    /// The status it is answered with.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// Its kind, as the JSON names it.
    pub fn kind(&self) -> &'static str {
        self.kind
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let document = Document {
            error: Body {
                kind: self.kind,
                message: &self.message,
                next: &self.next,
            },
        };
        let mut response = (self.status, Json(document)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

impl From<Error> for ApiError {
    fn from(error: Error) -> Self {
        let message = error.to_string();
        let (status, kind, next) = match &error {
            Error::Busy { request_id, .. } => (
                StatusCode::CONFLICT,
                "busy",
                format!("request {request_id} holds the conversation: send again once it ends"),
            ),
            Error::RequestMismatch { .. } => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "request_mismatch",
                "this Idempotency-Key was used for another input: send a new key".into(),
            ),
            Error::RequestAbandoned { .. } => (
                StatusCode::CONFLICT,
                "abandoned",
                "the request with this key was abandoned: send a new key".into(),
            ),
            // Another namespace's conversation is not told apart from one
            // that does not exist.
            Error::NotFound { .. } | Error::NamespaceMismatch { .. } => {
                return Self::bad_request(
                    StatusCode::NOT_FOUND,
                    "not_found",
                    "no such conversation",
                    "check the conversation id",
                );
            }
            Error::Deleted { .. } => (
                StatusCode::GONE,
                "deleted",
                "the conversation was deleted: start another".into(),
            ),
            Error::InvalidInput(_) => (
                StatusCode::BAD_REQUEST,
                "invalid_input",
                "fix the request and send it again; nothing was written".into(),
            ),
            Error::AwaitingApproval { .. } => (
                StatusCode::CONFLICT,
                "awaiting_approval",
                "decide the waiting tool calls (`turnstile approvals`), then continue the request"
                    .into(),
            ),
            Error::Model { .. } => (
                StatusCode::BAD_GATEWAY,
                "model_failed",
                "the request keeps its checkpoint: continue it with `turnstile resume` once the \
                 model answers"
                    .into(),
            ),
            Error::Store(e) if e.is_full() => (
                StatusCode::INSUFFICIENT_STORAGE,
                "storage_full",
                "free space for the database, then send the same request again".into(),
            ),
            Error::Store(e) if e.is_busy() || e.is_unreachable() => (
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the database is busy or unreachable: send the same request again shortly".into(),
            ),
            _ if error.stopped_run().is_some() => (
                StatusCode::CONFLICT,
                "stopped",
                "the request keeps its checkpoint: continue it with `turnstile resume`".into(),
            ),
            _ => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "failure",
                "see the server's log; the same request may be sent again".into(),
            ),
        };
        Self {
            status,
            kind,
            message,
            next,
        }
    }
}

/// A path no route serves.
pub(crate) async fn no_route() -> ApiError {
    ApiError::bad_request(
        StatusCode::NOT_FOUND,
        "no_route",
        "no such route",
        "POST /v1/conversations/{id}/requests or GET /v1/conversations/{id}/events",
    )
}
