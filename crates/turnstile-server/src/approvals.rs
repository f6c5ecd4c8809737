//! `GET …/approvals` lists the tool calls that wait for a decision;
//! `POST …/approvals` decides one (a compare-and-swap on the admission's
//! revision). Once the last waiting call of a request is decided, the
//! server continues the request from its checkpoint: its answer arrives on
//! the event log, and a retry of the request's key replays it.

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use turnstile_core::agent::RunContext;
use turnstile_core::ids::{RequestId, Revision};
use turnstile_core::store::PendingApproval;
use turnstile_core::Error;

use crate::errors::ApiError;
use crate::input;
use crate::tenant::Tenant;
use crate::Server;

#[derive(Serialize)]
pub(crate) struct Pending {
    approvals: Vec<PendingApproval>,
}

pub(crate) async fn list(
    State(server): State<Server>,
    Extension(tenant): Extension<Tenant>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Pending>, ApiError> {
    let conversation_id = input::conversation(path)?;
    let session = server.session(tenant.namespace, conversation_id);
    Ok(Json(Pending {
        approvals: session.pending_approvals().await?,
    }))
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum Verdict {
    Approve,
    Reject,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Decision {
    request_id: RequestId,
    call_id: String,
    revision: Revision,
    decision: Verdict,
    /// Told to the model as the rejected call's result.
    reason: Option<String>,
}

/// The revision the decision moved the admission to, and whether it was
/// the request's last waiting call (the request then continues); `null`
/// when what still waits could not be read (the request continues if
/// nothing does: its events tell).
#[derive(Serialize)]
pub(crate) struct Decided {
    revision: Revision,
    continued: Option<bool>,
}

pub(crate) async fn decide(
    State(server): State<Server>,
    Extension(tenant): Extension<Tenant>,
    path: Result<Path<String>, PathRejection>,
    body: Result<Json<Decision>, JsonRejection>,
) -> Result<Json<Decided>, ApiError> {
    let conversation_id = input::conversation(path)?;
    let decision = input::body(
        body,
        r#"{"request_id": "…", "call_id": "…", "revision": N, "decision": "approve" or "reject", "reason": "…"}"#,
    )?;
    let session = server.session(tenant.namespace, conversation_id);
    let (request_id, at) = (decision.request_id, decision.revision);
    let decided = match decision.decision {
        Verdict::Approve => session.approve(request_id, &decision.call_id, at).await,
        Verdict::Reject => {
            let reason = decision.reason.as_deref().unwrap_or("rejected by the user");
            session
                .reject(request_id, &decision.call_id, at, reason)
                .await
        }
    };
    let revision = decided.map_err(ApiError::of_named_request)?;
    server.live.stepped(conversation_id);
    // The decision is written: nothing after it may answer an error. A
    // continuation while calls still wait is refused, writing nothing.
    let waiting = match session.pending_approvals().await {
        Ok(pending) => Some(pending.iter().any(|p| p.request_id == request_id)),
        Err(error) => {
            tracing::warn!(%error, %request_id, "could not read what still waits; continuing");
            None
        }
    };
    if waiting != Some(true) {
        // Continued by the server: a client that decides has no request of
        // its own to wait on. A failure stops the request at its
        // checkpoint, for `…/requests/{id}/continue`.
        let live = server.live.clone();
        server.runs.spawn(async move {
            let run = session.continue_stream(request_id, RunContext::default(), revision);
            match live.drive(conversation_id, request_id, run).await {
                Ok(_) => {}
                Err(Error::AwaitingApproval { .. }) => {
                    tracing::info!(%request_id, "calls still wait: the request continues after them");
                }
                Err(error) => {
                    tracing::warn!(%error, %request_id, "a request did not continue after its approvals");
                }
            }
        });
    }
    Ok(Json(Decided {
        revision,
        continued: waiting.map(|waiting| !waiting),
    }))
}
