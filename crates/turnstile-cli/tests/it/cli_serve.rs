//! `serve`: the HTTP server on a database file, a client of it, and a
//! SIGTERM that ends it, open event stream and all.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cli_support::{add_script, scripted, start_serve, turnstile, uuid};

#[tokio::test]
async fn serve_runs_requests_streams_events_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("served.db");
    let model = scripted(&add_script(dir.path()));
    let (mut server, base) = start_serve(db.to_str().unwrap(), &model, &[]);

    let client = reqwest::Client::new();
    let conversation = uuid();
    let key = uuid();
    let response = client
        .post(format!("{base}/v1/conversations/{conversation}/requests"))
        .header("idempotency-key", &key)
        .json(&json!({"input": "what is 2 + 3?"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let outcome: Value = response.json().await.unwrap();
    assert_eq!(outcome["final_text"], "2 + 3 = 5");

    let mut events = client
        .get(format!("{base}/v1/conversations/{conversation}/events"))
        .send()
        .await
        .unwrap();
    assert_eq!(events.status().as_u16(), 200);
    let mut text = String::new();
    while !text.contains("event: committed") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), events.chunk())
            .await
            .expect("events within 10 s")
            .unwrap()
            .expect("the stream goes on");
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    let sent: Vec<(String, String)> = text
        .split("\n\n")
        .filter_map(|block| {
            let field = |name: &str| {
                block
                    .lines()
                    .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()))
            };
            Some((field("id:")?, field("event:")?))
        })
        .collect();
    let expected: Vec<(String, String)> = [
        "admitted",
        "answered",
        "tool_finished",
        "checkpoint_saved",
        "committed",
    ]
    .iter()
    .enumerate()
    .map(|(i, kind)| ((i + 1).to_string(), kind.to_string()))
    .collect();
    assert_eq!(sent, expected, "{text}");

    // SIGTERM with the stream open: the server ends it and exits.
    let sent = Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let started = Instant::now();
    let status = loop {
        if let Some(status) = server.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the server did not stop"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(status.code(), Some(0));
    let rest = tokio::time::timeout(Duration::from_secs(10), events.chunk())
        .await
        .expect("the stream ends")
        .unwrap_or(None);
    assert!(rest.is_none(), "the stream ended");

    // The commit is in the file: the same key replays from the command line.
    let replay = turnstile(&[
        "run",
        "--db",
        db.to_str().unwrap(),
        "--conversation",
        &conversation,
        "--request",
        &key,
        "--model",
        &model,
        "--json",
        "what is 2 + 3?",
    ]);
    replay.assert_success();
    assert_eq!(replay.json()["replayed"], true);
}
