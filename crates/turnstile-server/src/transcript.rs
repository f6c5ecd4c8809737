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
    server
        .store
        .conversation(&tenant.namespace, conversation_id)
        .await?;
    // One entry past the page tells whether another follows.
    let from = query.from.unwrap_or(0);
    let mut entries = server
        .store
        .transcript_range(conversation_id, from, from.saturating_add(limit + 1))
        .await?;
    let to = from.saturating_add(limit);
    let next = (entries.len() as u64 > limit).then_some(to);
    entries.truncate(limit as usize);
    Ok(Json(Page { entries, next }))
}
