//! A server on a free loopback port, and a reader of its event streams.

use std::sync::Arc;

use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use turnstile::agent::Agent;
use turnstile::{ConversationId, ScriptedReply};
use turnstile::{SqliteStore, StoreAdmin};
use turnstile_server::Server;
use turnstile_testkit::session::{call, ns, text_reply, tools_reply, usage};
pub use turnstile_testkit::sse::{Sse, SseReader};

/// A running server; dropped, it shuts down.
pub struct Running {
    pub base: String,
    pub client: reqwest::Client,
    stop: oneshot::Sender<()>,
    served: tokio::task::JoinHandle<()>,
}

/// The events of one request of [`counting_script`].
pub const ONE_REQUEST: [&str; 5] = [
    "admitted",
    "answered",
    "tool_finished",
    "checkpoint_saved",
    "committed",
];

/// Each request's script (it starts over with every request): `count`
/// called, then the answer `counted`.
pub fn counting_script() -> Vec<ScriptedReply> {
    vec![
        tools_reply(vec![call("c1", "count")], usage(3, 1)),
        text_reply("counted", usage(4, 2)),
    ]
}

/// A store on a new database file in `dir`.
pub async fn store_in(dir: &tempfile::TempDir) -> Arc<dyn StoreAdmin> {
    Arc::new(
        SqliteStore::open(dir.path().join("served.db"))
            .await
            .expect("open the database"),
    )
}

/// A server of one namespace.
pub async fn start(store: Arc<dyn StoreAdmin>, agent: Agent) -> Running {
    start_server(Server::new(store, agent, ns()).with_poll(FAST_POLL)).await
}

/// How often the tests' event streams read the log again.
const FAST_POLL: std::time::Duration = std::time::Duration::from_millis(10);

/// A server of the tenants of `store`'s tokens, which checks a stream's
/// token again every 20 ms.
pub async fn start_with_tokens(store: Arc<dyn StoreAdmin>, agent: Agent) -> Running {
    let server = Server::new(store, agent, ns())
        .with_tokens()
        .with_poll(FAST_POLL)
        .with_token_recheck(std::time::Duration::from_millis(20));
    start_server(server).await
}

/// `server`, as it is configured.
pub async fn start_server(server: Server) -> Running {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    let served = tokio::spawn(async move {
        turnstile_server::serve(listener, server, async {
            let _ = stopped.await;
        })
        .await;
    });
    Running {
        base,
        client: reqwest::Client::new(),
        stop,
        served,
    }
}

impl Running {
    /// Shuts the server down, as SIGTERM does; resolves once `serve` has
    /// returned.
    pub async fn shut_down(self) {
        let _ = self.stop.send(());
        self.served.await.expect("serve ended");
    }

    pub fn requests(&self, conversation: &str) -> String {
        format!("{}/v1/conversations/{conversation}/requests", self.base)
    }

    pub fn events(&self, conversation: &str) -> String {
        format!("{}/v1/conversations/{conversation}/events", self.base)
    }

    /// `conversation`'s event stream from after event `after`, sent as
    /// `Last-Event-ID` (0: from the first).
    pub async fn follow(&self, conversation: &str, after: u64) -> SseReader {
        let response = self
            .client
            .get(self.events(conversation))
            .header("last-event-id", after.to_string())
            .send()
            .await
            .unwrap();
        SseReader::new(response)
    }

    /// `path` on this server.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Creates `conversation` (by setting its metadata), so that its event
    /// stream opens before its first request.
    pub async fn create(&self, conversation: &str) {
        let path = format!("/v1/conversations/{conversation}/metadata");
        let (status, body) = self
            .send("PUT", &path, serde_json::json!({"meta_version": 0}))
            .await;
        assert_eq!(status, 200, "{body}");
    }

    /// `GET path`: the status and the JSON answer.
    pub async fn get(&self, path: &str) -> (u16, Value) {
        answer(self.client.get(self.url(path))).await
    }

    /// `method path` with `body` as JSON: the status and the JSON answer.
    pub async fn send(&self, method: &str, path: &str, body: Value) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method");
        answer(self.client.request(method, self.url(path)).json(&body)).await
    }

    /// Posts `input` under `key`; the status and the JSON answer.
    pub async fn post(&self, conversation: &str, key: &str, input: &str) -> (u16, Value) {
        let response = self
            .client
            .post(self.requests(conversation))
            .header("idempotency-key", key)
            .json(&serde_json::json!({ "input": input }))
            .send()
            .await
            .expect("send");
        let status = response.status().as_u16();
        (status, response.json().await.expect("a JSON answer"))
    }
}

/// Asserts that the events `seen` on a stream are the stored log of
/// `conversation`, event for event, from its first.
pub async fn assert_as_stored(store: &dyn StoreAdmin, conversation: ConversationId, seen: &[Sse]) {
    let limit = u32::try_from(seen.len() + 1).unwrap();
    let stored: Vec<Value> = store
        .events_after(conversation, 0, limit)
        .await
        .unwrap()
        .iter()
        .map(|e| serde_json::to_value(e).unwrap())
        .collect();
    let sent: Vec<&Value> = seen.iter().map(|e| &e.data).collect();
    assert_eq!(
        sent,
        stored.iter().collect::<Vec<_>>(),
        "{conversation}: as stored"
    );
}

/// The status and the JSON answer of `request`.
pub async fn answer(request: reqwest::RequestBuilder) -> (u16, Value) {
    let response = request.send().await.expect("send");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON answer"))
}
