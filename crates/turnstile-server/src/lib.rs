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
//! | `GET /` | a page: conversations, messages, events and live text, approvals |
//! | `GET /v1/conversations` | the tenant's conversations, newest first (`?limit=N&after=CURSOR&owner=NAME`; `next` is the next page's cursor) |
//! | `GET /v1/conversations/{id}` | one conversation: version, revision, the request holding it, metadata |
//! | `DELETE /v1/conversations/{id}?version=N` | deletes it (`&revision=R` while a request holds it) |
//! | `POST /v1/conversations/{id}/fork` | `{"through": N}`: a new conversation of its first N entries |
//! | `POST /v1/conversations/{id}/requests` | runs `{"input": "…", "attachments": [{"media_type", "name", "data"}]}` (files optional, base64) as the request named by the `Idempotency-Key` header (a UUID); answers the outcome |
//! | `POST /v1/conversations/{id}/requests/{request}/continue` | `{"revision": R}`: continues a stopped request from its checkpoint |
//! | `POST /v1/conversations/{id}/requests/{request}/abandon` | `{"revision": R}`: releases it without a commit |
//! | `GET /v1/conversations/{id}/events` | the event log after `Last-Event-ID` (or `?after=N`), then each new event as its step commits |
//! | `GET /v1/conversations/{id}/transcript` | committed messages, oldest first (`?from=SEQ&limit=N`) |
//! | `GET`, `PUT /v1/conversations/{id}/metadata` | title, owner, keys; `PUT` is a compare-and-swap on `meta_version` |
//! | `GET`, `POST /v1/conversations/{id}/approvals` | the calls waiting for a decision; decide one (`{"request_id", "call_id", "revision", "decision": "approve"/"reject", "reason"}`) |
//!
//! With [`Server::with_tokens`] each request names its tenant by an access
//! token (`Authorization: Bearer …`), and sees that namespace only. Every
//! error is one JSON object, `{"error": {"kind", "message", "next", "ids"}}` (see
//! [`ApiError`]), never a stack trace.

mod accept;
mod approvals;
mod conversations;
mod errors;
mod events;
mod input;
mod live;
mod metadata;
mod page;
mod read_body;
mod requests;
mod takeover;
mod tenant;
mod transcript;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{get, post};
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

pub use errors::ApiError;
use turnstile_core::admin::StoreAdmin;
use turnstile_core::agent::Agent;
use turnstile_core::ids::{ConversationId, Namespace};
use turnstile_core::session::{AgentSession, ContextPolicy, LeasePolicy, MAX_INPUT_BYTES};
use turnstile_core::store::PartLimits;
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
    lease: Option<LeasePolicy>,
    poll: Duration,
    token_recheck: Duration,
    head_within: Duration,
    body_within: Duration,
    attachments_within: usize,
    /// What the event streams are sent beside the log (answers' text,
    /// tools' starts) and what wakes their followers.
    live: live::LiveEvents,
    /// The runs started, waited for by [`serve`] once it stops taking
    /// connections.
    runs: TaskTracker,
    /// Set by [`serve`]: turns true when it shuts down, which ends the
    /// event streams (a graceful shutdown waits for every open response).
    closing: Option<watch::Receiver<bool>>,
}

impl Server {
    /// A server running `agent` on `store` in `namespace`, with the default
    /// context policy, answering loopback names only (`localhost`,
    /// `127.0.0.1`, `[::1]`: a web page cannot reach it under a name of its
    /// own). A followed event log is read again every 100 ms while nothing
    /// new is there.
    pub fn new(store: Arc<dyn StoreAdmin>, agent: Agent, namespace: Namespace) -> Self {
        Self {
            store,
            agent,
            namespace,
            tokens: false,
            policy: ContextPolicy::default(),
            lease: None,
            poll: Duration::from_millis(100),
            token_recheck: Duration::from_secs(5),
            head_within: Duration::from_secs(30),
            body_within: Duration::from_secs(60),
            attachments_within: PartLimits::DEFAULT_MAX_PART_BYTES as usize,
            live: live::LiveEvents::default(),
            runs: TaskTracker::new(),
            closing: None,
        }
    }

    /// Tenants: every request names its namespace by an access token
    /// ([`StoreAdmin::create_token`]) sent as `Authorization: Bearer …`;
    /// one with none, or an unknown or revoked one, is `401`, and an event
    /// stream ends once its token is revoked. A tenant acts in its
    /// namespace only: another tenant's conversation is `404`, its events
    /// unreadable and its requests untouchable (ids are UUIDs nobody can
    /// guess; a new one is the tenant's own).
    pub fn with_tokens(mut self) -> Self {
        self.tokens = true;
        self
    }

    /// Several servers on one database: each run holds a lease on its
    /// admission, renewed every `policy.renew_every()`
    /// ([`AgentSession::with_lease`]), and [`serve`] looks as often for
    /// leases that expired (a server that died or froze) and takes each
    /// request over from its last checkpoint. A turn whose model call was
    /// in flight is asked again; a tool call in doubt runs again only when
    /// its tool settles it ([`Tool::reconcile`](turnstile_core::Tool::reconcile),
    /// or an idempotent tool), else the request waits for an operator.
    pub fn with_lease(mut self, policy: LeasePolicy) -> Self {
        self.lease = Some(policy);
        self
    }

    /// How often a followed event log is read again while nothing new is
    /// there (default 100 ms): a step committed by another process is seen
    /// that late at most. A step of this server's own runs, decisions,
    /// abandons and deletes wakes the followers of its conversation at
    /// once.
    pub fn with_poll(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// How often an open event stream checks that its token is not
    /// revoked (default 5 s).
    pub fn with_token_recheck(mut self, every: Duration) -> Self {
        self.token_recheck = every;
        self
    }

    /// How long a client may take to send a request's head (by [`serve`],
    /// which then closes the connection; default 30 s) and its body
    /// (`408`, nothing written; default 60 s). A slow client holds a
    /// connection that long at most.
    pub fn with_read_deadlines(mut self, head: Duration, body: Duration) -> Self {
        self.head_within = head;
        self.body_within = body;
        self
    }

    /// How many bytes of files one request may attach in all (default
    /// 20 MiB, what the large providers take as one image or document);
    /// more is `413`. The store's part limits hold besides.
    pub fn with_attachment_limit(mut self, bytes: usize) -> Self {
        self.attachments_within = bytes;
        self
    }

    /// A body's size limit: an input up to its limit, every character
    /// escaped (`\uXXXX`, six bytes for each of its up to three), the
    /// attachments in base64 (four bytes for three), with room for the JSON
    /// around them.
    fn body_limit(&self) -> usize {
        let attachments = self.attachments_within.div_ceil(3).saturating_mul(4);
        (MAX_INPUT_BYTES * 6 + 64 * 1024).saturating_add(attachments)
    }

    /// The routes, to serve or to nest in an application's router. Served
    /// other than by [`serve`], an event stream ends only when its client
    /// goes away (or its token is revoked), and a run whose client went
    /// away is not waited for.
    pub fn router(self) -> Router {
        let conversation = "/v1/conversations/{conversation}";
        let request = "/v1/conversations/{conversation}/requests/{request}";
        Router::new()
            .route("/v1/conversations", get(conversations::list))
            .route(
                conversation,
                get(conversations::show).delete(conversations::delete),
            )
            .route(&format!("{conversation}/fork"), post(conversations::fork))
            .route(
                &format!("{conversation}/requests"),
                post(requests::post_request),
            )
            .route(
                &format!("{request}/continue"),
                post(requests::continue_request),
            )
            .route(
                &format!("{request}/abandon"),
                post(requests::abandon_request),
            )
            .route(&format!("{conversation}/events"), get(events::get_events))
            .route(
                &format!("{conversation}/transcript"),
                get(transcript::get_transcript),
            )
            .route(
                &format!("{conversation}/metadata"),
                get(metadata::get_metadata).put(metadata::put_metadata),
            )
            .route(
                &format!("{conversation}/approvals"),
                get(approvals::list).post(approvals::decide),
            )
            // The tenant is checked first, then the body is read.
            .route_layer(middleware::from_fn_with_state(
                self.clone(),
                read_body::read_whole,
            ))
            .route_layer(middleware::from_fn_with_state(self.clone(), tenant::admit))
            // The page is the same for everyone: its API calls are checked.
            .route("/", get(page::index))
            .route("/page.js", get(page::script))
            .method_not_allowed_fallback(errors::wrong_method)
            .fallback(errors::no_route)
            .layer(DefaultBodyLimit::max(self.body_limit()))
            .with_state(self)
    }

    /// The session of a request of `namespace` on `conversation`.
    fn session(&self, namespace: Namespace, conversation: ConversationId) -> AgentSession {
        let store: Arc<dyn Store> = self.store.clone();
        let session = AgentSession::new(
            self.agent.clone(),
            store,
            conversation,
            namespace,
            self.policy,
        );
        match self.lease {
            Some(policy) => session.with_lease(policy),
            None => session,
        }
    }
}

/// Serves `server` on `listener` until `shutdown` resolves, then stops
/// taking connections, ends the event streams and waits for the requests
/// in flight to reach their commit (or their stop) and answer; a
/// connection still open 10 s after that (a client that stopped reading)
/// is cut off. With a lease ([`Server::with_lease`]) it takes over,
/// meanwhile, the requests whose lease expired.
pub async fn serve(
    listener: TcpListener,
    server: Server,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (close, closing) = watch::channel(false);
    let server = Server {
        closing: Some(closing.clone()),
        ..server
    };
    let takeovers = tokio::spawn(takeover::take_over_expired(server.clone(), closing));
    let shutdown = async move {
        shutdown.await;
        // Every receiver is the server's: none is gone while it serves.
        let _ = close.send(true);
    };
    let (runs, head_within) = (server.runs.clone(), server.head_within);
    let draining = accept::accept(listener, server.router(), head_within, shutdown).await;
    // Stops looking for expired leases; the takeovers under way are runs.
    let _ = takeovers.await;
    // A run whose client went away still reaches its commit or its stop;
    // a client waiting for its answer gets it before the connections are
    // given their last moments.
    runs.close();
    runs.wait().await;
    draining.finish().await;
}
