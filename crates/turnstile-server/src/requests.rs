//! `POST /v1/conversations/{id}/requests`: one request, admitted by its
//! idempotency key, run to its commit.

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Extension;
use axum::Json;
use serde::{Deserialize, Serialize};
use turnstile_core::agent::RunContext;
use turnstile_core::ids::{ConversationId, RequestId};
use turnstile_core::outcome::Outcome;

use crate::errors::ApiError;
use crate::tenant::Tenant;
use crate::Server;

/// The body: the user's input, nothing else.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewRequestBody {
    input: String,
}

/// The answer: the outcome, with its conversation.
#[derive(Serialize)]
pub(crate) struct Answer {
    conversation_id: ConversationId,
    #[serde(flatten)]
    outcome: Outcome,
}

pub(crate) async fn post_request(
    State(server): State<Server>,
    Extension(tenant): Extension<Tenant>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Json<NewRequestBody>, JsonRejection>,
) -> Result<Json<Answer>, ApiError> {
    let conversation_id = conversation_id(path)?;
    let request_id = idempotency_key(&headers)?;
    if request_id.as_uuid() == conversation_id.as_uuid() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_key",
            "the Idempotency-Key is the conversation's id",
            "send a key of its own for each request",
        ));
    }
    let Json(body) = body.map_err(rejected)?;
    let session = server.session(tenant.namespace, conversation_id);
    // Its own task: a client that goes away does not stop the run between
    // two steps; it goes on to its commit, which the same key then replays,
    // and `serve` waits for it before it returns.
    let run = server.runs.spawn(async move {
        session
            .run(request_id, body.input, RunContext::default())
            .await
    });
    let outcome = run.await.map_err(|e| {
        tracing::error!(error = %e, %request_id, "a request's task ended without an outcome");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "failure",
            "the request's task ended without an outcome",
            "send the same request again: 200 replays its answer; 409 means it was admitted and \
             stopped, for an operator to continue with `turnstile resume` or `abandon`",
        )
    })??;
    Ok(Json(Answer {
        conversation_id,
        outcome,
    }))
}

pub(crate) fn conversation_id(
    path: Result<Path<String>, PathRejection>,
) -> Result<ConversationId, ApiError> {
    let invalid = |what: String| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_id",
            what,
            "name the conversation by a UUID that is not nil",
        )
    };
    let Path(text) = path.map_err(|rejection| invalid(rejection.body_text()))?;
    text.parse()
        .map_err(|_| invalid(format!("{text:?} is not a conversation id")))
}

fn idempotency_key(headers: &HeaderMap) -> Result<RequestId, ApiError> {
    let missing = || {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_key",
            "no Idempotency-Key header, or not a UUID",
            "send a new UUID as the Idempotency-Key of each request, and the same one to retry it",
        )
    };
    headers
        .get("idempotency-key")
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.trim().parse().ok())
        .ok_or_else(missing)
}

/// A body that is not `{"input": "…"}` as JSON.
fn rejected(rejection: JsonRejection) -> ApiError {
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
        "send Content-Type: application/json and a body of {\"input\": \"…\"} within the size \
         limit; nothing was written",
    )
}
