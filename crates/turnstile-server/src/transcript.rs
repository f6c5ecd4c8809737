//! `GET …/transcript`: a conversation's committed messages, a page at a
//! time, oldest first. An image's or file's part names its bytes by their
//! SHA-256 (`turnstile export` writes them out).

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use turnstile_core::store::TranscriptEntry;

use crate::errors::ApiError;
use crate::input;
use crate::tenant::Tenant;
use crate::Server;

/// Entries answered per page at most.
const MAX_PAGE: u64 = 500;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PageQuery {
    from: Option<u64>,
    limit: Option<u64>,
}

/// One page: the entries `from..from + limit`, and where the next page
/// starts while there is one.
#[derive(Serialize)]
pub(crate) struct Page {
    entries: Vec<TranscriptEntry>,
    next: Option<u64>,
}

pub(crate) async fn get_transcript(
    State(server): State<Server>,
    Extension(tenant): Extension<Tenant>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<PageQuery>, QueryRejection>,
) -> Result<Json<Page>, ApiError> {
    let conversation_id = input::conversation(path)?;
    let query = input::query(query, "from=SEQ (default 0), limit=N (1 to 500)")?;
    let limit = input::page_limit(query.limit, 100, MAX_PAGE)?;
    let end = server
        .summary(&tenant, conversation_id)
        .await?
        .transcript_entries;
    let from = query.from.unwrap_or(0).min(end);
    let to = end.min(from.saturating_add(limit));
    let entries = server
        .store
        .transcript_range(conversation_id, from, to)
        .await?;
    Ok(Json(Page {
        entries,
        next: (to < end).then_some(to),
    }))
}
