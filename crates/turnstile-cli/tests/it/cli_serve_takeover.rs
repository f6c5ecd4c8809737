//! Two `turnstile serve` processes on one database, a SQLite file or a
//! PostgreSQL database: the one running a request is killed with SIGKILL
//! in the middle of its model call; the other takes the request over once
//! the lease expired, and a client that followed the event log on the
//! first and reconnects to the second with `Last-Event-ID` sees every step
//! once, the takeover among them. The request's key then replays the
//! answer on the survivor.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use turnstile_test_postgres::Server as Postgres;
use turnstile_testkit::sse::{Sse, SseReader};

use crate::cli_support::{script, scripted, start_serve, uuid};

/// `add` 2 + 3, then an answer that takes two seconds: long enough to kill
/// its server in the middle of it, and for the lease (1.5 s) to expire
/// only once it is dead.
fn slow_answer(dir: &Path) -> String {
    scripted(&script(
        dir,
        "slow_answer.json",
        json!([
            {"tool_calls": [{"id": "c1", "name": "add", "arguments": {"a": 2, "b": 3}}],
             "usage": {"input_tokens": 10, "output_tokens": 5}},
            {"text": "2 + 3 = 5", "usage": {"input_tokens": 20, "output_tokens": 4},
             "delay_ms": 2000}
        ]),
    ))
}

async fn events(client: &reqwest::Client, base: &str, conversation: &str, after: u64) -> SseReader {
    let response = client
        .get(format!("{base}/v1/conversations/{conversation}/events"))
        .header("last-event-id", after.to_string())
        .send()
        .await
        .expect("open the event stream");
    SseReader::new(response)
}

async fn takeover_on(db: &str, dir: &Path) {
    let model = slow_answer(dir);
    let lease = ["--lease-renew", "200ms", "--lease-expire", "1500ms"];
    let (mut first, first_base) = start_serve(db, &model, &lease);
    let (mut second, second_base) = start_serve(db, &model, &lease);
    let client = reqwest::Client::new();
    let (conversation, key) = (uuid(), uuid());
    let post = |base: &str| {
        client
            .post(format!("{base}/v1/conversations/{conversation}/requests"))
            .header("idempotency-key", &key)
            .json(&json!({"input": "what is 2 + 3?"}))
            .send()
    };

    // The first server admits the request; its admission is the first
    // event, so the stream opened after the POST finds the conversation.
    let posted = tokio::spawn(post(&first_base));
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut reader = loop {
        let response = client
            .get(format!(
                "{first_base}/v1/conversations/{conversation}/events"
            ))
            .send()
            .await
            .unwrap();
        if response.status() == 200 {
            break SseReader::new(response);
        }
        assert!(Instant::now() < deadline, "the request is admitted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut seen: Vec<Sse> = Vec::new();
    while seen.last().is_none_or(|e| e.kind != "checkpoint_saved") {
        seen.push(reader.next().await);
    }
    // The answer takes two seconds: the server dies in the middle of it.
    first.kill().unwrap();
    first.wait().unwrap();
    let lost = posted.await.unwrap();
    assert!(lost.is_err(), "the killed server answers nothing: {lost:?}");

    // The client reconnects to the second server from the last event seen.
    let mut reader = events(
        &client,
        &second_base,
        &conversation,
        seen.last().unwrap().id,
    )
    .await;
    while seen.last().unwrap().kind != "committed" {
        seen.push(reader.next().await);
    }
    let ids: Vec<u64> = seen.iter().map(|e| e.id).collect();
    assert_eq!(
        ids,
        (1..=seen.len() as u64).collect::<Vec<_>>(),
        "each once, in order"
    );
    let kinds: Vec<&str> = seen.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "admitted",
            "answered",
            "tool_finished",
            "checkpoint_saved",
            "run_started",
            "committed"
        ]
    );
    let first_run = &seen[0].data["run_id"];
    assert_eq!(&seen[3].data["run_id"], first_run);
    let taken_over_by = &seen[4].data["run_id"];
    assert_ne!(taken_over_by, first_run);
    assert_eq!(&seen[5].data["run_id"], taken_over_by);

    // The same key replays the answer on the survivor.
    let replayed = post(&second_base).await.unwrap();
    assert_eq!(replayed.status().as_u16(), 200);
    let replayed: Value = replayed.json().await.unwrap();
    assert_eq!(
        (&replayed["final_text"], &replayed["replayed"]),
        (&json!("2 + 3 = 5"), &json!(true))
    );
    assert_eq!(&replayed["run_id"], taken_over_by);
    second.kill().unwrap();
    second.wait().unwrap();
}

#[tokio::test]
async fn a_killed_servers_request_is_taken_over_by_another_on_a_sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("served.db");
    takeover_on(db.to_str().unwrap(), dir.path()).await;
}

#[tokio::test]
async fn a_killed_servers_request_is_taken_over_by_another_on_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let (_, url) = Postgres::shared().fresh_database_named();
    takeover_on(&url, dir.path()).await;
}
