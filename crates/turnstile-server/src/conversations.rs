//! A tenant's conversations: listed a page at a time, one shown, deleted,
//! forked.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use turnstile_core::admin::{ConversationPage, ConversationSummary, ListFilter};
use turnstile_core::ids::{ConversationId, Revision};
use turnstile_core::store::{ConversationCursor, DeleteReport, ForkOutcome};
use turnstile_core::Error;

use crate::errors::ApiError;
use crate::input;
use crate::tenant::Tenant;
use crate::Server;

/// Conversations listed per page at most.
const MAX_PAGE: u64 = 500;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    limit: Option<u64>,
    after: Option<String>,
    owner: Option<String>,
}

pub(crate) async fn list(
    State(server): State<Server>,
    Extension(tenant): Extension<Tenant>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<ConversationPage>, ApiError> {
    let query = input::query(query, "limit=N (1 to 500), after=CURSOR, owner=NAME")?;
    let limit = input::page_limit(query.limit, 50, MAX_PAGE)?;
    let after = query
        .after
        .map(|cursor| cursor.parse::<ConversationCursor>())
        .transpose()?;
    let filter = ListFilter {
        namespace: Some(tenant.namespace),
        // At most `MAX_PAGE`.
        limit: u32::try_from(limit).unwrap_or(u32::MAX),
        after,
        owner: query.owner,
        ..ListFilter::default()
    };
    Ok(Json(server.store.list_conversations(&filter).await?))
}

pub(crate) async fn show(
    State(server): State<Server>,
    Extension(tenant): Extension<Tenant>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<ConversationSummary>, ApiError> {
    let conversation_id = input::conversation(path)?;
    let stale_after = ListFilter::default().stale_after;
    match server
        .store
        .conversation_summary(conversation_id, stale_after)
        .await?
    {
        Some(summary) if summary.namespace == tenant.namespace => Ok(Json(summary)),
        // Another tenant's is answered as one that does not exist.
        _ => Err(Error::NotFound {
            what: "conversation",
            id: conversation_id.to_string(),
        }
        .into()),
    }
}

/// `DELETE`'s compare-and-swap: the conversation's version, and the
/// revision of the request holding it, to delete it while held.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeleteQuery {
    version: u64,
    revision: Option<Revision>,
}

pub(crate) async fn delete(
    State(server): State<Server>,
    Extension(tenant): Extension<Tenant>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<DeleteQuery>, QueryRejection>,
) -> Result<Json<DeleteReport>, ApiError> {
    let conversation_id = input::conversation(path)?;
    let query = input::query(
        query,
        "version=N (the conversation's version) and, while a request holds it, revision=R",
    )?;
    let report = server
        .store
        .delete_conversation(
            &tenant.namespace,
            conversation_id,
            query.version,
            query.revision,
        )
        .await?;
    // Its followers hear that it is gone.
    server.live.stepped(conversation_id);
    Ok(Json(report))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ForkBody {
    /// Committed entries copied: the fork's transcript is entries
    /// `0..through`.
    through: u64,
    /// The fork's id; a new one when none is given.
    conversation_id: Option<ConversationId>,
}

pub(crate) async fn fork(
    State(server): State<Server>,
    Extension(tenant): Extension<Tenant>,
    path: Result<Path<String>, PathRejection>,
    body: Result<Json<ForkBody>, JsonRejection>,
) -> Result<(StatusCode, Json<ForkOutcome>), ApiError> {
    let from = input::conversation(path)?;
    let body = input::body(body, r#"{"through": N, "conversation_id": "…" (optional)}"#)?;
    let new_id = body.conversation_id.unwrap_or_else(ConversationId::new);
    let outcome = server
        .store
        .fork_conversation(&tenant.namespace, from, body.through, new_id)
        .await?;
    Ok((StatusCode::CREATED, Json(outcome)))
}
