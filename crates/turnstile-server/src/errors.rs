//! Every error as one JSON object with the status that fits it.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::{json, Map, Value};
use turnstile_core::Error;

/// An error answered as `{"error": {"kind", "message", "next", "ids"}}`:
/// what went wrong in a word, in a sentence, what to do next, and the ids
/// and numbers it names that the next step takes (`request_id`, `run_id`,
/// `revision`, `version`, `meta_version`; left out when there are none).
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    next: String,
    ids: Map<String, Value>,
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
    #[serde(skip_serializing_if = "Map::is_empty")]
    ids: &'a Map<String, Value>,
}

impl ApiError {
    /// An error answered with `status`.
    pub(crate) fn new(
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
            ids: Map::new(),
        }
    }

    /// A request that names no tenant this server knows.
    pub(crate) fn unauthorized(message: &str) -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            message,
            "send `Authorization: Bearer TOKEN` with a token from `turnstile token create`",
        )
    }

    /// What `what` names does not exist, or is another tenant's: the same
    /// answer either way.
    fn not_found(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no such {what}"),
            format!("check the {what}'s id"),
        )
    }

    /// `error` of a route that names a request of its conversation: a
    /// request of another conversation (or tenant) is not told apart from
    /// one that does not exist.
    pub(crate) fn of_named_request(error: Error) -> Self {
        match error {
            Error::RequestMismatch { .. } => Self::not_found("request"),
            error => error.into(),
        }
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

impl ApiError {
    fn body(&self) -> Document<'_> {
        Document {
            error: Body {
                kind: self.kind,
                message: &self.message,
                next: &self.next,
                ids: &self.ids,
            },
        }
    }

    /// The JSON the error is answered with.
    pub(crate) fn document(&self) -> String {
        serde_json::to_string(&self.body()).unwrap_or_default()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
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
        let mut message = error.to_string();
        let (status, kind, next) = match &error {
            Error::Busy { request_id, .. } => (
                StatusCode::CONFLICT,
                "busy",
                format!(
                    "request {request_id} holds the conversation: send again once it ends (one \
                     that stopped waits for an operator's `turnstile resume` or `abandon`)"
                ),
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
            Error::NamespaceMismatch { .. } => return Self::not_found("conversation"),
            Error::NotFound { what, .. } => return Self::not_found(what),
            Error::Deleted { .. } => (
                StatusCode::GONE,
                "deleted",
                "the conversation was deleted: start another".into(),
            ),
            Error::Conflict { actual, .. } => (
                StatusCode::CONFLICT,
                "revision_conflict",
                format!(
                    "the admission moved on to revision {actual}: read the conversation again \
                     and decide with what it shows now"
                ),
            ),
            Error::VersionConflict { actual, .. } => (
                StatusCode::CONFLICT,
                "version_conflict",
                format!(
                    "the conversation is at version {actual}: read it again, and send that \
                     version if it is still to be done"
                ),
            ),
            Error::MetaVersionConflict { actual, .. } => (
                StatusCode::CONFLICT,
                "meta_version_conflict",
                format!(
                    "the metadata is at meta_version {actual}: read it again and send the \
                     change with that version"
                ),
            ),
            Error::NotActive { .. } => (
                StatusCode::CONFLICT,
                "not_active",
                "the request holds no admission (committed or abandoned): nothing to do".into(),
            ),
            Error::NoPendingApproval { .. } => (
                StatusCode::CONFLICT,
                "no_pending_approval",
                "that call waits for no decision: list the approvals for those that do".into(),
            ),
            Error::InvalidInput(_) => (
                StatusCode::BAD_REQUEST,
                "invalid_input",
                "fix the request and send it again; nothing was written".into(),
            ),
            Error::AwaitingApproval { .. } => (
                StatusCode::CONFLICT,
                "awaiting_approval",
                "decide the waiting tool calls (GET and POST …/approvals); the request continues \
                 once the last is decided"
                    .into(),
            ),
            Error::Model { .. } => (
                StatusCode::BAD_GATEWAY,
                "model_failed",
                "the request keeps its checkpoint: continue it (POST …/requests/{id}/continue \
                 with its revision) once the model answers"
                    .into(),
            ),
            Error::Store(e) if e.is_full() => (
                StatusCode::INSUFFICIENT_STORAGE,
                "storage_full",
                "the database has no room: once an operator frees some, send the same request \
                 again (409 then means it was admitted: continue it with `turnstile resume`)"
                    .into(),
            ),
            Error::Store(e) if e.is_busy() || e.is_unreachable() => (
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the database is busy or unreachable: send the same request again shortly (409 \
                 then means it was admitted: continue it with `turnstile resume`)"
                    .into(),
            ),
            Error::AmbiguousCheckpoint { .. } => (
                StatusCode::CONFLICT,
                "ambiguous_checkpoint",
                "a turn was in flight when the request's run stopped: an operator continues it \
                 (`turnstile resume --retry-interrupted`) or abandons it"
                    .into(),
            ),
            Error::ConfigurationMismatch { .. } => (
                StatusCode::CONFLICT,
                "configuration_mismatch",
                "the request was admitted with another agent: continue it where that agent \
                 serves, or abandon it"
                    .into(),
            ),
            Error::Fenced { .. } => (
                StatusCode::CONFLICT,
                "fenced",
                "another run took the request over: send the same request again for its answer"
                    .into(),
            ),
            Error::BudgetExceeded { .. } => (
                StatusCode::CONFLICT,
                "budget_exceeded",
                "the request spent its budget: an operator continues it with a larger one \
                 (`turnstile resume`) or abandons it"
                    .into(),
            ),
            Error::SummaryPassLimitExceeded { .. } => (
                StatusCode::CONFLICT,
                "summary_passes_exceeded",
                "the request used up its summary passes: abandon it and send a new request".into(),
            ),
            // What the tool said stays in the log: it may name hosts or
            // credentials.
            Error::ToolInDoubt { call, .. } => {
                tracing::warn!(%error, "a request stopped on a tool call in doubt");
                message = format!(
                    "tool call {:?} ({}) may or may not have taken effect",
                    call.call_id, call.tool
                );
                (
                    StatusCode::CONFLICT,
                    "tool_in_doubt",
                    "an operator settles the call (`turnstile resume`) or abandons the request"
                        .into(),
                )
            }
            _ if error.stopped_run().is_some() => (
                StatusCode::CONFLICT,
                "stopped",
                "the request keeps its checkpoint: continue it (POST …/requests/{id}/continue \
                 with its revision) or abandon it"
                    .into(),
            ),
            _ => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "failure",
                "the server's log has the detail; send the same request again (200 replays it, \
                 409 means it was admitted and stopped)"
                    .into(),
            ),
        };
        // A server's failure is told in its log: what a driver or the
        // database said is no client's business.
        if status.is_server_error() {
            tracing::error!(%error, kind, "a request failed");
            message = match kind {
                "model_failed" => "the model failed".into(),
                "storage_full" => "the database is full".into(),
                "unavailable" => "the database is busy or unreachable".into(),
                _ => "the server failed".into(),
            };
        }
        Self {
            status,
            kind,
            message,
            next,
            ids: ids_of(&error),
        }
    }
}

/// The ids and numbers `error` names that a client's next step takes.
fn ids_of(error: &Error) -> Map<String, Value> {
    let mut ids = Map::new();
    let mut name = |key: &str, value: Value| {
        ids.insert(key.to_owned(), value);
    };
    match error {
        Error::Busy {
            request_id,
            revision,
            ..
        } => {
            name("request_id", json!(request_id));
            name("revision", json!(revision));
        }
        Error::RequestMismatch { request_id, .. }
        | Error::RequestAbandoned { request_id }
        | Error::NotActive { request_id }
        | Error::ConfigurationMismatch { request_id }
        | Error::NoPendingApproval { request_id, .. }
        | Error::AwaitingApproval { request_id, .. } => name("request_id", json!(request_id)),
        Error::Conflict { actual, .. } => name("revision", json!(actual)),
        Error::VersionConflict { actual, .. } => name("version", json!(actual)),
        Error::MetaVersionConflict { actual, .. } => name("meta_version", json!(actual)),
        Error::Fenced { run_id, .. } | Error::AmbiguousCheckpoint { run_id, .. } => {
            name("run_id", json!(run_id));
        }
        _ => {}
    }
    if let Some((run_id, revision)) = error.stopped_run() {
        name("run_id", json!(run_id));
        name("revision", json!(revision));
    }
    ids
}

/// Where the routes are told.
const ROUTES: &str = "the routes are under /v1/conversations (turnstile-server's docs list them)";

/// A path no route serves.
pub(crate) async fn no_route() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no_route", "no such route", ROUTES)
}

/// A route called with a method it does not take.
pub(crate) async fn wrong_method() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "wrong_method",
        "this route does not take that method",
        ROUTES,
    )
}
