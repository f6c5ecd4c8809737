//! `GET` and `PUT …/metadata`: a conversation's title, owner and
//! application keys, changed by a compare-and-swap on their version.

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use axum::{Extension, Json};
use serde::{Deserialize, Deserializer};
use turnstile_core::store::{ConversationMeta, MetaUpdate, Metadata};

use crate::errors::ApiError;
use crate::input;
use crate::tenant::Tenant;
use crate::Server;

pub(crate) async fn get_metadata(
    State(server): State<Server>,
    Extension(tenant): Extension<Tenant>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<ConversationMeta>, ApiError> {
    let conversation_id = input::conversation(path)?;
    let meta = server
        .store
        .conversation_meta(&tenant.namespace, conversation_id)
        .await?;
    Ok(Json(meta))
}

/// A change: `null` clears the title or owner, an absent field keeps it;
/// `set` keys are written, then `unset` keys removed.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MetaChange {
    meta_version: u64,
    #[serde(default, deserialize_with = "present")]
    title: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    owner: Option<Option<String>>,
    #[serde(default)]
    set: Metadata,
    #[serde(default)]
    unset: Vec<String>,
}

/// A field that is present, `null` or not: absent fields take the default
/// (`None`, kept) through `#[serde(default)]`.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

pub(crate) async fn put_metadata(
    State(server): State<Server>,
    Extension(tenant): Extension<Tenant>,
    path: Result<Path<String>, PathRejection>,
    body: Result<Json<MetaChange>, JsonRejection>,
) -> Result<Json<ConversationMeta>, ApiError> {
    let conversation_id = input::conversation(path)?;
    let change = input::body(
        body,
        r#"{"meta_version": N, "title", "owner", "set": {…}, "unset": […]}"#,
    )?;
    let update = MetaUpdate {
        title: change.title,
        owner: change.owner,
        set: change.set,
        unset: change.unset,
    };
    let meta = server
        .store
        .set_conversation_meta(
            &tenant.namespace,
            conversation_id,
            change.meta_version,
            &update,
        )
        .await?;
    Ok(Json(meta))
}
