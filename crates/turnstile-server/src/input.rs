//! What a route reads from a request (the ids of its path, its query, its
//! JSON body), each refused with a `400`-class error that says what to
//! send instead. Nothing is written before all of it is read.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::Json;
use turnstile_core::ids::{ConversationId, RequestId};

use crate::errors::ApiError;

/// The conversation a route's path names.
pub(crate) fn conversation(
    path: Result<Path<String>, PathRejection>,
) -> Result<ConversationId, ApiError> {
    let Path(text) = path.map_err(|rejection| invalid_id(rejection.body_text()))?;
    parse_conversation(&text)
}

/// The conversation and the request a route's path names.
pub(crate) fn conversation_and_request(
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<(ConversationId, RequestId), ApiError> {
    let Path((conversation, request)) =
        path.map_err(|rejection| invalid_id(rejection.body_text()))?;
    let request = request
        .parse()
        .map_err(|_| invalid_id(format!("{request:?} is not a request id")))?;
    Ok((parse_conversation(&conversation)?, request))
}

fn parse_conversation(text: &str) -> Result<ConversationId, ApiError> {
    text.parse()
        .map_err(|_| invalid_id(format!("{text:?} is not a conversation id")))
}

fn invalid_id(message: String) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_id",
        message,
        "name conversations and requests by UUIDs that are not nil",
    )
}

/// A route's query string; `shape` names the parameters it takes.
pub(crate) fn query<T>(
    query: Result<Query<T>, QueryRejection>,
    shape: &str,
) -> Result<T, ApiError> {
    let Query(query) = query.map_err(|rejection| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            rejection.body_text(),
            format!("the parameters are {shape}"),
        )
    })?;
    Ok(query)
}

/// A route's JSON body; `shape` shows what it takes.
pub(crate) fn body<T>(body: Result<Json<T>, JsonRejection>, shape: &str) -> Result<T, ApiError> {
    let Json(body) = body.map_err(|rejection| {
        let kind = match rejection {
            _ if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => "too_large",
            JsonRejection::MissingJsonContentType(_) => "unsupported_media_type",
            JsonRejection::JsonSyntaxError(_) => "malformed_json",
            _ => "invalid_body",
        };
        ApiError::new(
            rejection.status(),
            kind,
            rejection.body_text(),
            format!(
                "send Content-Type: application/json and a body of {shape} within the size \
                 limit; nothing was written"
            ),
        )
    })?;
    Ok(body)
}

/// A page's size: `limit`, or `default` without one; refused unless 1 to
/// `max`.
pub(crate) fn page_limit(limit: Option<u64>, default: u64, max: u64) -> Result<u64, ApiError> {
    let limit = limit.unwrap_or(default);
    if limit == 0 || limit > max {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            format!("limit={limit} is not 1 to {max}"),
            format!("ask for at most {max} a page, and follow `next` for the rest"),
        ));
    }
    Ok(limit)
}
