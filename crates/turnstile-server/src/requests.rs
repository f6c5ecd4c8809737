//! A conversation's requests: `POST …/requests` admits one by its
//! idempotency key and runs it to its commit; `…/requests/{id}/continue`
//! continues one that stopped (for approval, or on a failure) from its
//! checkpoint; `…/requests/{id}/abandon` releases one without a commit.

use std::future::Future;

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Extension;
use axum::Json;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use serde::{Deserialize, Serialize};
use turnstile_core::agent::RunContext;
use turnstile_core::ids::{ConversationId, RequestId, Revision};
use turnstile_core::message::{Attachment, Content, Part};
use turnstile_core::outcome::Outcome;
use turnstile_core::Error;

use crate::errors::ApiError;
use crate::input;
use crate::tenant::Tenant;
use crate::Server;

/// The body of a new request: the user's input, and the files sent with
/// it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewRequestBody {
    input: String,
    #[serde(default)]
    attachments: Vec<AttachmentBody>,
}

/// Files one request may send at most.
const MAX_ATTACHMENTS: usize = 32;

/// A file sent with the input: an `image/…` goes as an image, anything
/// else as a file with its name.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AttachmentBody {
    media_type: String,
    name: Option<String>,
    /// The bytes, base64 (standard alphabet, padded).
    data: String,
}

impl NewRequestBody {
    /// The input with its files after its text, each refused past what one
    /// request may attach in all.
    fn content(self, attachments_within: usize) -> Result<Content, ApiError> {
        if self.attachments.is_empty() {
            return Ok(Content::from(self.input));
        }
        if self.attachments.len() > MAX_ATTACHMENTS {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!(
                    "{} attachments, over {MAX_ATTACHMENTS}",
                    self.attachments.len()
                ),
                "send fewer files; nothing was written",
            ));
        }
        let mut parts = vec![Part::text(self.input)];
        let mut total = 0;
        for (index, file) in self.attachments.into_iter().enumerate() {
            let bytes = BASE64.decode(file.data.as_bytes()).map_err(|_| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_body",
                    format!("attachment {index}'s data is not base64"),
                    "send each file's bytes as standard base64; nothing was written",
                )
            })?;
            if bytes.is_empty() {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_body",
                    format!("attachment {index} is empty"),
                    "send each file's bytes; nothing was written",
                ));
            }
            total += bytes.len();
            if total > attachments_within {
                return Err(ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "too_large",
                    format!("the attachments are over {attachments_within} bytes in all"),
                    "send fewer or smaller files; nothing was written",
                ));
            }
            let image = file.media_type.starts_with("image/");
            let mut attachment = Attachment::new(file.media_type, bytes)?;
            if let Some(name) = file.name {
                attachment = attachment.with_name(name);
            }
            parts.push(match image {
                true => Part::Image(attachment),
                false => Part::File(attachment),
            });
        }
        Ok(Content::new(parts))
    }
}

/// The body of `continue` and `abandon`: the admission's revision, as the
/// stop or the last approval decision left it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AtRevision {
    revision: Revision,
}

/// A request's outcome, with its conversation.
#[derive(Serialize)]
pub(crate) struct Answer {
    conversation_id: ConversationId,
    #[serde(flatten)]
    outcome: Outcome,
}

/// The admission's revision after a change.
#[derive(Serialize)]
pub(crate) struct Moved {
    revision: Revision,
}

pub(crate) async fn post_request(
    State(server): State<Server>,
    Extension(tenant): Extension<Tenant>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Json<NewRequestBody>, JsonRejection>,
) -> Result<Json<Answer>, ApiError> {
    let conversation_id = input::conversation(path)?;
    let request_id = idempotency_key(&headers)?;
    if request_id.as_uuid() == conversation_id.as_uuid() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_key",
            "the Idempotency-Key is the conversation's id",
            "send a key of its own for each request",
        ));
    }
    let body = input::body(
        body,
        r#"{"input": "…", "attachments": [{"media_type", "name", "data"}] (optional)}"#,
    )?;
    let content = body.content(server.attachments_within)?;
    let session = server.session(tenant.namespace, conversation_id);
    let live = server.live.clone();
    let outcome = to_the_end(&server, request_id, async move {
        let run = session.stream(request_id, content, RunContext::default());
        live.drive(conversation_id, request_id, run).await
    })
    .await
    .map_err(ApiError::from)?;
    Ok(Json(Answer {
        conversation_id,
        outcome,
    }))
}

pub(crate) async fn continue_request(
    State(server): State<Server>,
    Extension(tenant): Extension<Tenant>,
    path: Result<Path<(String, String)>, PathRejection>,
    body: Result<Json<AtRevision>, JsonRejection>,
) -> Result<Json<Answer>, ApiError> {
    let (conversation_id, request_id) = input::conversation_and_request(path)?;
    let body = input::body(body, r#"{"revision": N}"#)?;
    let session = server.session(tenant.namespace, conversation_id);
    let live = server.live.clone();
    let outcome = to_the_end(&server, request_id, async move {
        let run = session.continue_stream(request_id, RunContext::default(), body.revision);
        live.drive(conversation_id, request_id, run).await
    })
    .await
    .map_err(|error| match error {
        Refusal::Api(error) => error,
        Refusal::Core(error) => ApiError::of_named_request(error),
    })?;
    Ok(Json(Answer {
        conversation_id,
        outcome,
    }))
}

pub(crate) async fn abandon_request(
    State(server): State<Server>,
    Extension(tenant): Extension<Tenant>,
    path: Result<Path<(String, String)>, PathRejection>,
    body: Result<Json<AtRevision>, JsonRejection>,
) -> Result<Json<Moved>, ApiError> {
    let (conversation_id, request_id) = input::conversation_and_request(path)?;
    let body = input::body(body, r#"{"revision": N}"#)?;
    let session = server.session(tenant.namespace, conversation_id);
    let revision = session
        .abandon(request_id, body.revision)
        .await
        .map_err(ApiError::of_named_request)?;
    server.live.stepped(conversation_id);
    Ok(Json(Moved { revision }))
}

/// Runs `run` as a task of its own and waits for its outcome. A client
/// that goes away does not stop the run between two steps: it goes on to
/// its commit (which the same key then replays) or its stop, and `serve`
/// waits for it before it returns.
async fn to_the_end(
    server: &Server,
    request_id: RequestId,
    run: impl Future<Output = Result<Option<Outcome>, Error>> + Send + 'static,
) -> Result<Outcome, Refusal> {
    let ended = server.runs.spawn(run).await;
    let no_outcome = |why: &dyn std::fmt::Display| {
        tracing::error!(%why, %request_id, "a request's task ended without an outcome");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "failure",
            "the request's task ended without an outcome",
            "send the same request again: 200 replays its answer; 409 means it was admitted and \
             stopped: continue it (POST …/requests/{id}/continue) or abandon it",
        )
    };
    match ended {
        Ok(Ok(Some(outcome))) => Ok(outcome),
        Ok(Ok(None)) => Err(Refusal::Api(no_outcome(&"its event stream ended early"))),
        Ok(Err(error)) => Err(Refusal::Core(error)),
        Err(joined) => Err(Refusal::Api(no_outcome(&joined))),
    }
}

/// Why a run gave no outcome: the engine's refusal, which each route
/// answers in its own terms, or the task's end.
enum Refusal {
    Core(Error),
    Api(ApiError),
}

impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Core(error) => error.into(),
            Refusal::Api(error) => error,
        }
    }
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
