//! turnstile over HTTP. Each request is admitted by the idempotency key its
//! client sends, exactly as [`AgentSession::run`] admits it (the same key
//! and input replay the stored answer, another input is refused, a
//! conversation held by another request is busy), and runs to its commit
//! even when the client goes away. A conversation's durable event log
//! ([`Store::events_after`]) is served as server-sent events, each with its
//! number as `id`: a client that reconnects with `Last-Event-ID` gets every
//! later event once.
//!
//! | route | what |
//! |---|---|
//! | `POST /v1/conversations/{id}/requests` | runs `{"input": "…"}` as the request named by the `Idempotency-Key` header (a UUID); answers the outcome |
//! | `GET /v1/conversations/{id}/events` | the event log after `Last-Event-ID` (or `?after=N`), then each new event as its step commits |
//!
//! Every error is one JSON object, `{"error": {"kind", "message", "next"}}`
//! (see [`ApiError`]), never a stack trace.

mod errors;
mod events;
mod requests;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use errors::ApiError;
use turnstile_core::agent::Agent;
use turnstile_core::ids::{ConversationId, Namespace};
use turnstile_core::session::{AgentSession, ContextPolicy, MAX_INPUT_BYTES};
use turnstile_core::Store;

/// What a server runs requests with: one agent on one store, in one
/// namespace.
#[derive(Clone)]
pub struct Server {
    store: Arc<dyn Store>,
    agent: Agent,
    namespace: Namespace,
    policy: ContextPolicy,
    poll: Duration,
    /// Set by [`serve`]: turns true when it shuts down, which ends the
    /// event streams (a graceful shutdown waits for every open response).
    closing: Option<watch::Receiver<bool>>,
}

impl Server {
    /// A server running `agent` on `store` in `namespace`, with the default
    /// context policy; a followed event log is read again every 100 ms
    /// while nothing new is there.
    pub fn new(store: Arc<dyn Store>, agent: Agent, namespace: Namespace) -> Self {
        Self {
            store,
            agent,
            namespace,
            policy: ContextPolicy::default(),
            poll: Duration::from_millis(100),
            closing: None,
        }
    }

    /// How often a followed event log is read again while nothing new is
    /// there (a step committed by another process is seen that late at
    /// most).
    pub fn with_poll(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// The routes, to serve or to nest in an application's router. Served
    /// other than by [`serve`], an event stream ends only when its client
    /// goes away.
    pub fn router(self) -> Router {
        // A body past the input limit (with room for its JSON) is refused
        // before it is read whole.
        let limit = MAX_INPUT_BYTES * 2 + 1024;
        Router::new()
            .route(
                "/v1/conversations/{conversation}/requests",
                post(requests::post_request),
            )
            .route(
                "/v1/conversations/{conversation}/events",
                get(events::get_events),
            )
            .fallback(errors::no_route)
            .layer(DefaultBodyLimit::max(limit))
            .with_state(self)
    }

    fn session(&self, conversation: ConversationId) -> AgentSession {
        AgentSession::new(
            self.agent.clone(),
            self.store.clone(),
            conversation,
            self.namespace.clone(),
            self.policy,
        )
    }
}

/// Serves `server` on `listener` until `shutdown` resolves, then stops
/// taking connections, ends the event streams and waits for the requests
/// in flight to reach their commit (or their stop) and answer.
///
/// # Errors
/// The listener's I/O error.
pub async fn serve(
    listener: TcpListener,
    server: Server,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (close, closing) = watch::channel(false);
    let server = Server {
        closing: Some(closing),
        ..server
    };
    let shutdown = async move {
        shutdown.await;
        // Every receiver is the server's: none is gone while it serves.
        let _ = close.send(true);
    };
    axum::serve(listener, server.router())
        .with_graceful_shutdown(shutdown)
        .await
}
