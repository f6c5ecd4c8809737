//! `GET /v1/conversations/{id}/events`: the conversation's durable event
//! log as server-sent events, from after the last one the client saw.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::Extension;
use futures_util::stream::PollNext;
use futures_util::{Stream, StreamExt};
use serde::Deserialize;
use turnstile_core::store::LoggedEvent;

use crate::errors::ApiError;
use crate::input;
use crate::tenant::Tenant;
use crate::Server;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct After {
    after: Option<u64>,
}

pub(crate) async fn get_events(
    State(server): State<Server>,
    Extension(tenant): Extension<Tenant>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<After>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let conversation_id = input::conversation(path)?;
    let query = input::query(query, "after=N, the number of the last event seen")?;
    let after = match last_event_id(&headers)? {
        Some(seen) => seen,
        None => query.after.unwrap_or(0),
    };
    // Refused before the stream starts, with a status: a conversation
    // this tenant cannot see.
    server
        .store
        .conversation(&tenant.namespace, conversation_id)
        .await?;
    let session = server.session(tenant.namespace, conversation_id);
    let ended = ended(&server, tenant.token);
    let (live, stepped) = server.live.follow(conversation_id);
    let durable = session
        .follow_events_woken(after, server.poll, stepped)
        .map(|event| {
            match event {
                Ok(event) => sse_event(&event),
                // The stream ends after it: the client reconnects from the
                // last number it saw, and hears why.
                Err(error) => {
                    let error = ApiError::from(error);
                    Event::default().event("error").data(error.document())
                }
            }
        });
    // The live events go along while the log lasts: the stream ends with
    // the log (its conversation deleted), the server or the token.
    let durable = durable
        .map(Some)
        .chain(futures_util::stream::once(async { None }));
    // Live text first when both are ready: a piece is sent before the
    // step it belongs to commits, so it goes out before that step's event.
    let live_first = |_: &mut ()| PollNext::Left;
    let events = futures_util::stream::select_with_strategy(live.map(Some), durable, live_first)
        .take_while(|event| std::future::ready(event.is_some()))
        .filter_map(std::future::ready)
        .take_until(ended)
        .map(Ok);
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}

/// Resolves when the stream must end: the server shuts down, or the token
/// it was opened with is revoked (or can no longer be checked).
fn ended(server: &Server, token: Option<[u8; 32]>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    let closing = server.closing.clone();
    let shut_down = async move {
        match closing {
            Some(mut closing) => {
                let _ = closing.wait_for(|closed| *closed).await;
            }
            None => std::future::pending().await,
        }
    };
    let (store, every) = (server.store.clone(), server.token_recheck);
    let revoked = async move {
        let Some(token) = token else {
            return std::future::pending().await;
        };
        loop {
            tokio::time::sleep(every).await;
            if !matches!(store.token_namespace(&token).await, Ok(Some(_))) {
                return;
            }
        }
    };
    Box::pin(async move {
        tokio::select! {
            () = shut_down => {}
            () = revoked => {}
        }
    })
}

fn sse_event(event: &LoggedEvent) -> Event {
    let data = serde_json::to_string(event).unwrap_or_else(|e| {
        tracing::error!(error = %e, "an event could not be encoded");
        String::from("{}")
    });
    Event::default()
        .id(event.seq.to_string())
        .event(event.step.kind())
        .data(data)
}

/// The `Last-Event-ID` a reconnecting client sends: the number of the
/// last event it saw.
fn last_event_id(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .map(Some)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_last_event_id",
                "Last-Event-ID is not an event number",
                "send the `id` of the last event received, or none to start from the first",
            )
        })
}
