//! Requests by idempotency key and event streams resumed by
//! `Last-Event-ID`, over real HTTP; bad input answered as JSON 4xx that
//! writes nothing.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use turnstile::{ConversationId, RequestId};
use turnstile_testkit::session::*;
use turnstile_testkit::tools::{BlockingTool, CountingTool};

use crate::support::{
    assert_as_stored, counting_script, start, start_server, store_in, Sse, SseReader, ONE_REQUEST,
};

fn kinds(events: &[Sse]) -> Vec<&str> {
    events.iter().map(|e| e.kind.as_str()).collect()
}

#[tokio::test]
async fn a_request_runs_replays_and_refuses_another_input_under_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(&dir).await;
    let model = scripted(counting_script());
    let server = start(
        store.clone(),
        agent(model.clone(), vec![CountingTool::new("count")]),
    )
    .await;
    let conversation = ConversationId::new().to_string();
    let key = RequestId::new().to_string();

    let (status, first) = server.post(&conversation, &key, "count").await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["final_text"], "counted");
    assert_eq!(first["replayed"], false);
    assert_eq!(first["request_id"], key);
    assert_eq!(first["conversation_id"], conversation);

    let (status, again) = server.post(&conversation, &key, "count").await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["replayed"], true);
    assert_eq!(again["run_id"], first["run_id"]);
    assert_eq!(model.calls(), 2, "the replay called no model");

    let (status, other) = server.post(&conversation, &key, "something else").await;
    assert_eq!(status, 422, "{other}");
    assert_eq!(other["error"]["kind"], "request_mismatch");
    assert!(other["error"]["next"].as_str().unwrap().contains("new key"));
    let id: ConversationId = conversation.parse().unwrap();
    assert_eq!(store.conversation(&ns(), id).await.unwrap().version, 1);
}

#[tokio::test]
async fn a_second_request_while_one_runs_is_busy_naming_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(&dir).await;
    let model = ProbeModel::new(vec![text_reply("done", usage(1, 1))], 1);
    let server = Arc::new(start(store, agent(model.clone(), vec![])).await);
    let conversation = ConversationId::new().to_string();
    let holder = RequestId::new().to_string();
    let running = {
        let (server, conversation, holder) = (server.clone(), conversation.clone(), holder.clone());
        tokio::spawn(async move { server.post(&conversation, &holder, "slow").await })
    };
    model.entered().await;
    let (status, busy) = server
        .post(&conversation, &RequestId::new().to_string(), "fast")
        .await;
    assert_eq!(status, 409, "{busy}");
    assert_eq!(busy["error"]["kind"], "busy");
    assert!(busy["error"]["message"].as_str().unwrap().contains(&holder));
    assert_eq!(busy["error"]["ids"]["request_id"], holder.as_str());
    assert!(busy["error"]["ids"]["revision"].is_u64());
    model.release();
    let (status, done) = running.await.unwrap();
    assert_eq!(
        (status, done["final_text"].clone()),
        (200, Value::from("done"))
    );
}

#[tokio::test]
async fn events_stream_each_step_once_and_a_reconnect_with_last_event_id_resumes_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(&dir).await;
    let server = Arc::new(
        start(
            store.clone(),
            agent(
                scripted(counting_script()),
                vec![CountingTool::new("count")],
            ),
        )
        .await,
    );
    let conversation = ConversationId::new().to_string();
    let (status, first) = server
        .post(&conversation, &RequestId::new().to_string(), "count")
        .await;
    assert_eq!(status, 200, "{first}");

    let mut stream = server.follow(&conversation, 0).await;
    let mut seen = Vec::new();
    for _ in 0..2 {
        seen.push(stream.next().await);
    }
    drop(stream); // the connection drops after event 2

    // Reconnect from the last event seen; the next request runs meanwhile.
    let mut stream = server.follow(&conversation, 2).await;
    let second_key = RequestId::new().to_string();
    let posting = {
        let (server, conversation, key) =
            (server.clone(), conversation.clone(), second_key.clone());
        tokio::spawn(async move { server.post(&conversation, &key, "count again").await })
    };
    let per_request = ONE_REQUEST.len();
    while seen.len() < 2 * per_request {
        seen.push(stream.next().await);
    }
    assert_eq!(posting.await.unwrap().0, 200);

    let ids: Vec<_> = seen.iter().map(|e| e.id).collect();
    assert_eq!(
        ids,
        (1..=2 * per_request as u64).collect::<Vec<_>>(),
        "each event once, in order"
    );
    assert_eq!(kinds(&seen[..per_request]), ONE_REQUEST);
    assert_eq!(kinds(&seen[per_request..]), ONE_REQUEST);
    assert!(seen[per_request..]
        .iter()
        .all(|e| e.data["request_id"] == second_key));
    // The second request's tool call was told live as it started, with no
    // number: the call its `tool_finished` names.
    let finished = &seen[per_request + 2];
    let started = stream.live_of("tool_started");
    assert_eq!(started.len(), 1, "{:?}", stream.live);
    assert_eq!(
        (
            &started[0]["request_id"],
            &started[0]["call_id"],
            &started[0]["turn"]
        ),
        (
            &finished.data["request_id"],
            &finished.data["call_id"],
            &finished.data["turn"]
        )
    );
    assert_eq!(started[0]["name"], "count");
    // The data is the stored event.
    assert_as_stored(store.as_ref(), conversation.parse().unwrap(), &seen).await;

    // `?after=` does what the header does.
    let mut after = SseReader::new(
        server
            .client
            .get(format!("{}?after=8", server.events(&conversation)))
            .send()
            .await
            .unwrap(),
    );
    assert_eq!(after.next().await.id, 9);
    assert_eq!(after.next().await.id, 10);
}

#[tokio::test]
async fn bad_input_is_a_json_4xx_that_writes_nothing_and_the_server_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(&dir).await;
    let server = start(
        store.clone(),
        agent(scripted(vec![text_reply("fine", usage(1, 1))]), vec![]),
    )
    .await;
    let conversation = ConversationId::new().to_string();
    let key = RequestId::new().to_string();
    let client = &server.client;
    let url = server.requests(&conversation);
    let raw = |body: &'static str, content_type: &'static str| {
        client
            .post(&url)
            .header("idempotency-key", &key)
            .header("content-type", content_type)
            .body(body)
    };
    let over_the_input_limit = format!("{{\"input\": \"{}\"}}", "x".repeat(2 << 20));
    let huge = format!("{{\"input\": \"{}\"}}", "x".repeat(34 << 20));
    let cases = vec![
        (
            "malformed JSON",
            raw("{\"input\": ", "application/json"),
            400,
            "malformed_json",
        ),
        (
            "an unknown field",
            raw("{\"input\": \"hi\", \"extra\": 1}", "application/json"),
            422,
            "invalid_body",
        ),
        (
            "no input",
            raw("{}", "application/json"),
            422,
            "invalid_body",
        ),
        (
            "another content type",
            raw("{\"input\": \"hi\"}", "text/plain"),
            415,
            "unsupported_media_type",
        ),
        (
            "no key",
            client.post(&url).json(&serde_json::json!({"input": "hi"})),
            400,
            "invalid_key",
        ),
        (
            "a key that is no UUID",
            client
                .post(&url)
                .header("idempotency-key", "not-a-uuid")
                .json(&serde_json::json!({"input": "hi"})),
            400,
            "invalid_key",
        ),
        (
            "a conversation id that is no UUID",
            client
                .post(server.requests("nope"))
                .header("idempotency-key", &key)
                .json(&serde_json::json!({"input": "hi"})),
            400,
            "invalid_id",
        ),
        (
            "a body over the limit",
            client
                .post(&url)
                .header("idempotency-key", &key)
                .header("content-type", "application/json")
                .body(huge),
            413,
            "too_large",
        ),
        (
            "an input over its limit",
            client
                .post(&url)
                .header("idempotency-key", &key)
                .header("content-type", "application/json")
                .body(over_the_input_limit),
            400,
            "invalid_input",
        ),
        (
            "a method the route does not take",
            client.get(&url),
            405,
            "wrong_method",
        ),
        (
            "a name that is not loopback's (a web page's, resolving to 127.0.0.1)",
            client
                .post(&url)
                .header("host", "attacker.example")
                .header("idempotency-key", &key)
                .json(&serde_json::json!({"input": "hi"})),
            403,
            "forbidden_host",
        ),
        (
            "an empty input",
            client
                .post(&url)
                .header("idempotency-key", &key)
                .json(&serde_json::json!({"input": ""})),
            400,
            "invalid_input",
        ),
        (
            "no such route",
            client.get(format!("{}/v1/nothing", server.base)),
            404,
            "no_route",
        ),
        (
            "the events of no conversation",
            client.get(server.events(&conversation)),
            404,
            "not_found",
        ),
        (
            "a Last-Event-ID that is no number",
            client
                .get(server.events(&conversation))
                .header("last-event-id", "x"),
            400,
            "invalid_last_event_id",
        ),
        (
            "an unknown query parameter",
            client.get(format!("{}?from=3", server.events(&conversation))),
            400,
            "invalid_query",
        ),
    ];
    for (what, request, status, kind) in cases {
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), status, "{what}");
        let body: Value = response
            .json()
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(body["error"]["kind"], kind, "{what}: {body}");
        assert!(
            !body["error"]["next"].as_str().unwrap().is_empty(),
            "{what}"
        );
    }
    // Nothing was written, and the server still serves.
    let id: ConversationId = conversation.parse().unwrap();
    assert!(store.conversation(&ns(), id).await.is_err());
    let (status, fine) = server.post(&conversation, &key, "hi").await;
    assert_eq!(
        (status, fine["final_text"].clone()),
        (200, Value::from("fine"))
    );
}

#[tokio::test]
async fn a_run_whose_client_went_away_commits_before_the_server_stops() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(&dir).await;
    let model = ProbeModel::new(vec![text_reply("done anyway", usage(1, 1))], 1);
    let server = start(store.clone(), agent(model.clone(), vec![])).await;
    let conversation = ConversationId::new().to_string();
    let key = RequestId::new();
    let impatient = server
        .client
        .post(server.requests(&conversation))
        .header("idempotency-key", key.to_string())
        .json(&serde_json::json!({"input": "slow"}))
        .timeout(std::time::Duration::from_millis(300))
        .send();
    let (gave_up, ()) = tokio::join!(impatient, model.entered());
    assert!(gave_up.is_err(), "the client gave up: {gave_up:?}");

    // Shut down with the run in flight: `serve` returns only after it.
    let stopping = tokio::spawn(server.shut_down());
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(!stopping.is_finished(), "serve waits for the run");
    model.release();
    stopping.await.unwrap();
    let request = store.request(key).await.unwrap().expect("the request");
    assert_eq!(
        request.outcome.map(|o| o.run_id),
        Some(turnstile::RunId::first_of(key)),
        "committed by its one run"
    );
}

#[tokio::test]
async fn live_text_streams_to_the_connected_and_is_never_sent_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(&dir).await;
    let replies = vec![text_reply("the answer streams word by word", usage(1, 1))];
    let server = start(store, agent(scripted(replies), vec![])).await;
    let conversation = ConversationId::new().to_string();
    let (status, _) = server
        .post(&conversation, &RequestId::new().to_string(), "first")
        .await;
    assert_eq!(status, 200);

    let mut connected = server.follow(&conversation, 2).await;
    let key = RequestId::new().to_string();
    let (status, answer) = server.post(&conversation, &key, "second").await;
    assert_eq!(status, 200, "{answer}");
    let mut seen = Vec::new();
    while seen.len() < 2 {
        seen.push(connected.next().await);
    }
    assert_eq!(kinds(&seen), ["admitted", "committed"]);
    // Each piece in order before the commit, with no number: they add up
    // to the answer, and only the request run while connected sent any.
    let deltas = connected.deltas();
    let pieces: Vec<&str> = deltas.iter().map(|d| d["text"].as_str().unwrap()).collect();
    assert_eq!(pieces.len(), 6, "{deltas:?}");
    assert_eq!(pieces.concat(), answer["final_text"].as_str().unwrap());
    assert!(deltas.iter().all(|d| d["request_id"] == key));

    // A reconnect gets the durable events again, and the live text of the
    // request that streams now only.
    let mut again = server.follow(&conversation, 0).await;
    let third = RequestId::new().to_string();
    let (status, _) = server.post(&conversation, &third, "third").await;
    assert_eq!(status, 200);
    for _ in 0..6 {
        again.next().await;
    }
    let deltas = again.deltas();
    assert_eq!(deltas.len(), 6, "{deltas:?}");
    assert!(deltas.iter().all(|d| d["request_id"] == third));
}

#[tokio::test]
async fn a_follower_reads_this_servers_steps_at_once_not_at_its_next_poll() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(&dir).await;
    // The first request's call waits until released: the steps before it
    // must reach the follower while the request is in flight.
    let tool = BlockingTool::new("count", 1);
    let agent = agent(scripted(counting_script()), vec![tool.clone()]);
    // A poll far longer than the reader waits for an event (10 s): only a
    // wake from the server's own steps delivers them in time.
    let server = Arc::new(
        start_server(
            turnstile_server::Server::new(store.clone(), agent, ns())
                .with_poll(Duration::from_secs(3600)),
        )
        .await,
    );
    let conversation = ConversationId::new().to_string();
    server.create(&conversation).await;
    let mut stream = server.follow(&conversation, 0).await;

    let key = RequestId::new().to_string();
    let posting = {
        let (server, conversation, key) = (server.clone(), conversation.clone(), key.clone());
        tokio::spawn(async move { server.post(&conversation, &key, "count").await })
    };
    tool.entered().await;
    let before_the_tool = [stream.next().await, stream.next().await];
    assert_eq!(kinds(&before_the_tool), ONE_REQUEST[..2]);
    assert_eq!(stream.live_of("tool_started").len(), 1);
    tool.release();
    let mut after_the_tool = Vec::new();
    while after_the_tool.len() < ONE_REQUEST.len() - 2 {
        after_the_tool.push(stream.next().await);
    }
    assert_eq!(kinds(&after_the_tool), ONE_REQUEST[2..]);
    let (status, body) = posting.await.unwrap();
    assert_eq!(status, 200, "{body}");

    // The wake-ups go on after the first request.
    let key = RequestId::new().to_string();
    let (status, body) = server.post(&conversation, &key, "count again").await;
    assert_eq!(status, 200, "{body}");
    let mut seen = Vec::new();
    while seen.len() < ONE_REQUEST.len() {
        seen.push(stream.next().await);
    }
    assert_eq!(kinds(&seen), ONE_REQUEST);
    assert!(seen.iter().all(|e| e.data["request_id"] == key));
}
