//! `--model anthropic:NAME`: a run against a server speaking the Messages
//! API on loopback, with `--thinking-budget`; the flags that belong to
//! other models refused; the printed resume command repeating the model's
//! flags.

use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::cli_support::{turnstile, uuid};

/// Answers every request with thinking and "4", recording the bodies.
async fn start_server() -> (String, Arc<Mutex<Vec<Value>>>) {
    let bodies = Arc::new(Mutex::new(Vec::new()));
    async fn answer(
        State(bodies): State<Arc<Mutex<Vec<Value>>>>,
        Json(body): Json<Value>,
    ) -> Json<Value> {
        bodies.lock().unwrap().push(body);
        Json(json!({
            "type": "message", "role": "assistant",
            "content": [
                { "type": "thinking", "thinking": "2 + 2", "signature": "sig" },
                { "type": "text", "text": "4" },
            ],
            "stop_reason": "end_turn",
            "usage": { "input_tokens": 7, "cache_read_input_tokens": 3, "output_tokens": 2 },
        }))
    }
    let app = Router::new()
        .route("/v1/messages", post(answer))
        .with_state(bodies.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, bodies)
}

fn run_args<'a>(db: &'a str, conversation: &'a str, model: &'a str, url: &'a str) -> Vec<&'a str> {
    vec![
        "run",
        "--db",
        db,
        "--conversation",
        conversation,
        "--model",
        model,
        "--base-url",
        url,
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_models_run_with_a_thinking_budget() {
    let (url, bodies) = start_server().await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("anthropic.db");
    let db = db.to_str().unwrap().to_owned();
    let conversation = uuid();
    let mut args: Vec<String> = run_args(&db, &conversation, "anthropic:claude-test", &url)
        .into_iter()
        .map(str::to_owned)
        .collect();
    args.extend(["--thinking-budget", "2048", "--json", "what is 2 + 2?"].map(str::to_owned));
    let run = tokio::task::spawn_blocking(move || {
        turnstile(&args.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .unwrap();
    run.assert_success();
    let outcome = run.json();
    assert_eq!(outcome["final_text"], "4", "{outcome}");
    assert_eq!(outcome["usage"]["cache_read_tokens"], 3, "{outcome}");
    assert_eq!(outcome["usage"]["input_tokens"], 10, "{outcome}");
    let body = bodies.lock().unwrap()[0].clone();
    assert_eq!(body["model"], "claude-test");
    assert_eq!(
        body["thinking"],
        json!({ "type": "enabled", "budget_tokens": 2048 })
    );
    assert_eq!(body["max_tokens"], 2048 + 8192);

    // The reasoning is stored with the answer.
    let show = turnstile(&["show", &conversation, "--db", &db, "--reasoning"]);
    show.assert_success();
    assert!(show.stdout.contains("2 + 2"), "{show:#?}");
}

#[test]
fn the_flags_of_other_models_are_refused_and_the_hint_repeats_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("flags.db");
    let db = db.to_str().unwrap();
    let url = "http://127.0.0.1:9";
    let mut budget_on_openai = run_args(db, "", "openai:m", url);
    budget_on_openai.remove(3);
    budget_on_openai.remove(3);
    budget_on_openai.extend(["--thinking-budget", "2048", "hi"]);
    turnstile(&budget_on_openai)
        .assert_error(2, "--thinking-budget applies to anthropic models only");

    let conversation = uuid();
    let mut replay = run_args(db, &conversation, "anthropic:m", url);
    replay.extend(["--reasoning-replay", "always", "hi"]);
    turnstile(&replay).assert_error(2, "--reasoning-replay applies to openai models only");
    // Nothing listens on port 9: the run stops and says how to go on.
    let mut unreachable = run_args(db, &conversation, "anthropic:m", url);
    unreachable.extend(["--thinking-budget", "2048", "hi"]);
    let failed = turnstile(&unreachable);
    assert_eq!(failed.code, 1, "{failed:#?}");
    assert!(failed.stderr.contains("cannot connect"), "{failed:#?}");
    assert!(
        failed
            .stderr
            .contains("--model anthropic:m --base-url http://127.0.0.1:9 --thinking-budget 2048"),
        "{failed:#?}"
    );
}
