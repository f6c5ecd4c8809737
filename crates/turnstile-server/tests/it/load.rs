//! Load on loopback: 200 clients, each sending 20 requests one after
//! another to a conversation of its own while a follower of that
//! conversation reads its event stream. Nothing is lost or repeated: every
//! request commits once, every call runs once, every follower sees its
//! conversation's events once each, in order, as stored. It prints the
//! request latency (p50, p99), the events delivered per second and how
//! long after its answer a request's `committed` reached its follower, and,
//! as the baseline of the same run, the same requests sent by 200 tasks
//! straight to `AgentSession::run` on a database of their own; the figures
//! in `docs/performance.md` are of a release build.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use turnstile::{Agent, ConversationId, RequestId, RunContext, Store};
use turnstile_server::Server;
use turnstile_testkit::session::*;
use turnstile_testkit::tools::CountingTool;

use crate::support::{
    assert_as_stored, counting_script, start_server, store_in, Running, Sse, ONE_REQUEST,
};

const CLIENTS: usize = 200;
const REQUESTS: usize = 20;

/// What one client saw.
struct Seen {
    conversation: ConversationId,
    /// Each request's latency.
    latencies: Vec<Duration>,
    /// The events its follower read.
    events: Vec<Sse>,
    /// How long after each request's answer its follower read its
    /// `committed`, in milliseconds (below zero: before it).
    commit_delays: Vec<f64>,
}

/// One client: creates its conversation, follows it, and sends its
/// requests.
async fn client(server: Arc<Running>) -> Seen {
    let conversation = ConversationId::new();
    server.create(&conversation.to_string()).await;
    let mut reader = server.follow(&conversation.to_string(), 0).await;
    let follower = tokio::spawn(async move {
        let mut seen = Vec::with_capacity(REQUESTS * ONE_REQUEST.len());
        let mut committed_at = Vec::with_capacity(REQUESTS);
        while seen.len() < REQUESTS * ONE_REQUEST.len() {
            let event = reader.next().await;
            if event.kind == "committed" {
                committed_at.push(Instant::now());
            }
            seen.push(event);
        }
        (seen, committed_at)
    });
    let mut latencies = Vec::with_capacity(REQUESTS);
    let mut answered_at = Vec::with_capacity(REQUESTS);
    for i in 0..REQUESTS {
        let started = Instant::now();
        let key = RequestId::new().to_string();
        let (status, body) = server
            .post(&conversation.to_string(), &key, &format!("count {i}"))
            .await;
        assert_eq!(status, 200, "{body}");
        answered_at.push(Instant::now());
        latencies.push(started.elapsed());
    }
    let (events, committed_at) = follower.await.unwrap();
    let commit_delays = answered_at
        .iter()
        .zip(&committed_at)
        .map(
            |(answered, committed)| match committed.checked_duration_since(*answered) {
                Some(after) => after.as_secs_f64() * 1e3,
                None => -(answered.duration_since(*committed).as_secs_f64() * 1e3),
            },
        )
        .collect();
    Seen {
        conversation,
        latencies,
        events,
        commit_delays,
    }
}

/// The baseline: the same requests, sent by as many tasks straight to the
/// session: their wall time.
async fn in_process(agent: Agent) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = store_in(&dir).await;
    let started = Instant::now();
    let mut clients = JoinSet::new();
    for _ in 0..CLIENTS {
        let session = session(agent.clone(), &store, ConversationId::new());
        clients.spawn(async move {
            for i in 0..REQUESTS {
                session
                    .run(
                        RequestId::new(),
                        format!("count {i}"),
                        RunContext::default(),
                    )
                    .await
                    .unwrap();
            }
        });
    }
    while let Some(done) = clients.join_next().await {
        done.unwrap();
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_clients_of_twenty_requests_lose_and_repeat_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(&dir).await;
    let count = CountingTool::new("count");
    let agent = agent(scripted(counting_script()), vec![count.clone()]);
    let server = Arc::new(start_server(Server::new(store.clone(), agent.clone(), ns())).await);

    let started = Instant::now();
    let mut clients = JoinSet::new();
    for _ in 0..CLIENTS {
        clients.spawn(client(server.clone()));
    }
    let mut latencies = Vec::with_capacity(CLIENTS * REQUESTS);
    let mut commit_delays = Vec::with_capacity(CLIENTS * REQUESTS);
    let mut delivered = 0;
    while let Some(done) = clients.join_next().await {
        let Seen {
            conversation,
            latencies: took,
            events: seen,
            commit_delays: delays,
        } = done.unwrap();
        latencies.extend(took);
        commit_delays.extend(delays);
        delivered += seen.len();
        let ids: Vec<u64> = seen.iter().map(|e| e.id).collect();
        let expected = (1..=(REQUESTS * ONE_REQUEST.len()) as u64).collect::<Vec<_>>();
        assert_eq!(ids, expected, "{conversation}: each once, in order");
        assert_as_stored(store.as_ref(), conversation, &seen).await;
        assert_eq!(
            store
                .conversation(&ns(), conversation)
                .await
                .unwrap()
                .version,
            REQUESTS as u64
        );
    }
    let elapsed = started.elapsed();
    assert_eq!(count.calls(), CLIENTS * REQUESTS, "each call ran once");
    let baseline = in_process(agent).await;

    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
    assert_eq!(commit_delays.len(), CLIENTS * REQUESTS);
    commit_delays.sort_by(f64::total_cmp);
    let delay_at = |q: f64| commit_delays[((commit_delays.len() - 1) as f64 * q).round() as usize];
    eprintln!(
        "load: {} requests by {CLIENTS} clients in {:.2} s: request p50 {:.1} ms, p99 {:.1} ms; \
         {delivered} events delivered, {:.0} events/s; committed read {:.1} ms (p50), {:.1} ms \
         (p99) after the answer; in process {:.2} s, HTTP ÷ in process {:.2}",
        latencies.len(),
        elapsed.as_secs_f64(),
        at(0.5).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        delivered as f64 / elapsed.as_secs_f64(),
        delay_at(0.5),
        delay_at(0.99),
        baseline.as_secs_f64(),
        elapsed.as_secs_f64() / baseline.as_secs_f64(),
    );
}
