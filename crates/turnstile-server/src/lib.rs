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
//! With [`Server::with_tokens`] each request names its tenant by an access
//! token (`Authorization: Bearer …`), and sees that namespace only. Every
//! error is one JSON object, `{"error": {"kind", "message", "next"}}` (see
//! [`ApiError`]), never a stack trace.

mod errors;
mod events;
mod requests;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::http::header::AUTHORIZATION;
use axum::http::HeaderMap;
use axum::routing::{get, post};
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use errors::ApiError;
use turnstile_core::admin::{token_sha256, StoreAdmin};
use turnstile_core::agent::Agent;
use turnstile_core::ids::{ConversationId, Namespace};
use turnstile_core::session::{AgentSession, ContextPolicy, MAX_INPUT_BYTES};
use turnstile_core::Store;

/// What a server runs requests with: one agent on one store, in one
/// namespace, or with [`Server::with_tokens`] in the namespace of each
/// request's token.
#[derive(Clone)]
pub struct Server {
    store: Arc<dyn StoreAdmin>,
    agent: Agent,
    namespace: Namespace,
    tokens: bool,
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
    pub fn new(store: Arc<dyn StoreAdmin>, agent: Agent, namespace: Namespace) -> Self {
        Self {
            store,
            agent,
            namespace,
            tokens: false,
            policy: ContextPolicy::default(),
            poll: Duration::from_millis(100),
            closing: None,
        }
    }

    /// Tenants: every request names its namespace by an access token
    /// ([`StoreAdmin::create_token`]) sent as `Authorization: Bearer …`;
    /// one with none, or an unknown or revoked one, is `401`. A tenant's
    /// requests and event logs are its namespace's only: another tenant's
    /// conversation answers as one that does not exist.
    pub fn with_tokens(mut self) -> Self {
        self.tokens = true;
        self
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

    /// The session of a request on `conversation`, in the namespace of its
    /// token when the server takes tokens.
    async fn session(
        &self,
        headers: &HeaderMap,
        conversation: ConversationId,
    ) -> Result<AgentSession, ApiError> {
        let namespace = match self.tokens {
            true => self.tenant(headers).await?,
            false => self.namespace.clone(),
        };
        let store: Arc<dyn Store> = self.store.clone();
        Ok(AgentSession::new(
            self.agent.clone(),
            store,
            conversation,
            namespace,
            self.policy,
        ))
    }

    async fn tenant(&self, headers: &HeaderMap) -> Result<Namespace, ApiError> {
        let token = headers
            .get(AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
            .ok_or_else(|| ApiError::unauthorized("no bearer token"))?;
        self.store
            .token_namespace(&token_sha256(token))
            .await?
            .ok_or_else(|| ApiError::unauthorized("the token is unknown or revoked"))
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
