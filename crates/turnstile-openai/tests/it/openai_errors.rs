//! How the OpenAI-compatible model classifies failures, against the scripted
//! server: rate limits, server errors and timeouts are retryable; client
//! errors, truncated or malformed answers are not; error events in a stream
//! are reported; no error carries the API key. And which failures it sends
//! again, how long it waits, and where it stops.

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde_json::json;
use turnstile::agent::ModelRequest;
use turnstile::Model;
use turnstile_openai::{OpenAiConfig, OpenAiModel, RetryPolicy};

use crate::support::*;

#[tokio::test]
async fn rate_limits_and_server_errors_are_retryable() {
    // The server echoes the key back, as some do.
    let rate_limited = Reply::Raw {
        status: StatusCode::TOO_MANY_REQUESTS,
        content_type: "application/json",
        headers: vec![("retry-after", "7")],
        chunks: vec![json!({ "error": {
            "message": format!("Rate limit reached for key {KEY}, slow down"),
            "type": "requests",
        } })
        .to_string()
        .into_bytes()],
        delay: Duration::ZERO,
        gap: Duration::ZERO,
    };
    let server = Server::start(vec![
        rate_limited,
        Reply::raw(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            vec![b"upstream exploded".to_vec()],
        ),
        error_body(StatusCode::SERVICE_UNAVAILABLE, "overloaded"),
    ])
    .await;
    let model = server.model();

    let error = expect_error(ask(&model, &hello()).await, true, "429");
    assert!(error.message.contains("retry after 7"), "{}", error.message);
    assert!(
        error.message.contains("Rate limit reached"),
        "{}",
        error.message
    );
    assert!(error.message.contains("[redacted]"), "{}", error.message);

    expect_error(ask(&model, &hello()).await, true, "500");
    let error = expect_error(ask(&model, &hello()).await, true, "503");
    assert!(error.message.contains("overloaded"), "{}", error.message);

    // A streamed call is classified the same way.
    server
        .script
        .replies
        .lock()
        .unwrap()
        .push_back(error_body(StatusCode::TOO_MANY_REQUESTS, "again"));
    let (result, deltas) = ask_streaming(&model, &hello()).await;
    expect_error(result, true, "429");
    assert!(deltas.is_empty());
}

#[tokio::test]
async fn client_errors_are_fatal() {
    let server = Server::start(vec![
        error_body(StatusCode::BAD_REQUEST, "Invalid value for 'messages'"),
        error_body(
            StatusCode::UNAUTHORIZED,
            &format!("Incorrect API key provided: {KEY}"),
        ),
        Reply::raw(
            StatusCode::NOT_FOUND,
            "text/html",
            vec![b"<h1>no</h1>".to_vec()],
        ),
    ])
    .await;
    let model = server.model();

    let error = expect_error(ask(&model, &hello()).await, false, "400");
    assert!(
        error.message.contains("Invalid value for 'messages'"),
        "{}",
        error.message
    );
    let error = expect_error(ask(&model, &hello()).await, false, "401");
    assert!(error.message.contains("[redacted]"), "{}", error.message);
    expect_error(ask(&model, &hello()).await, false, "404");
}

#[tokio::test]
async fn a_truncated_json_body_is_a_fatal_error() {
    let full = json!({
        "choices": [{ "index": 0, "message": { "role": "assistant", "content": "the whole answer" } }],
        "usage": { "prompt_tokens": 1, "completion_tokens": 1 },
    })
    .to_string();
    let cut = full[..full.len() / 2].to_owned();
    let server = Server::start(vec![Reply::raw(
        StatusCode::OK,
        "application/json",
        split(&cut, 8),
    )])
    .await;

    expect_error(ask(&server.model(), &hello()).await, false, "truncated");
}

#[tokio::test]
async fn a_stream_without_done_is_a_fatal_error() {
    let body = sse(&[
        delta_chunk(json!({ "content": "partial " })),
        delta_chunk(json!({ "content": "answer" })),
    ]);
    let body = body.trim_end_matches("data: [DONE]\n\n");
    // And a stream cut in the middle of an event.
    let cut = format!("{body}data: {{\"choices\":[{{\"delta\":{{\"cont");
    let server = Server::start(vec![Reply::sse(body, 9), Reply::sse(&cut, 9)]).await;
    let model = server.model();

    let (result, deltas) = ask_streaming(&model, &hello()).await;
    expect_error(result, false, "[DONE]");
    assert_eq!(deltas, ["partial ", "answer"]);

    let (result, _) = ask_streaming(&model, &hello()).await;
    expect_error(result, false, "truncated");
}

#[tokio::test]
async fn a_stream_over_32_mib_is_refused() {
    // Keep-alive comments a MiB at a time: each line within the parser's
    // bound, the stream as a whole past the answer's.
    let line = format!(": {}\n\n", "k".repeat(1 << 20));
    let chunks = vec![line.into_bytes(); 33];
    let server = Server::start(vec![Reply::raw(
        StatusCode::OK,
        "text/event-stream",
        chunks,
    )])
    .await;
    let (result, _) = ask_streaming(&server.model(), &hello()).await;
    expect_error(result, false, "the chat completion stream exceeds 32 MiB");
}

#[tokio::test]
async fn malformed_responses_are_fatal_errors() {
    let ok = StatusCode::OK;
    let server = Server::start(vec![
        Reply::Json(ok, json!({})),
        Reply::Json(ok, json!({ "choices": [] })),
        Reply::Json(ok, json!({ "choices": [{ "index": 0 }] })),
        Reply::Json(ok, json!({ "choices": "many" })),
        Reply::Json(
            ok,
            json!({ "choices": [{ "message": { "content": 42 } }] }),
        ),
        Reply::Json(
            ok,
            json!({ "choices": [{ "message": { "tool_calls": [{ "id": "c", "function": { "arguments": "{}" } }] } }] }),
        ),
        Reply::Json(
            ok,
            json!({ "choices": [{ "message": { "content": "x" } }], "usage": { "prompt_tokens": -1 } }),
        ),
        Reply::raw(ok, "text/html", vec![b"<html>a login page</html>".to_vec()]),
        Reply::raw(ok, "application/json", vec![]),
    ])
    .await;
    let model = server.model();

    expect_error(ask(&model, &hello()).await, false, "no choices");
    expect_error(ask(&model, &hello()).await, false, "no choices");
    expect_error(ask(&model, &hello()).await, false, "no message");
    expect_error(ask(&model, &hello()).await, false, "malformed");
    expect_error(ask(&model, &hello()).await, false, "content is a number");
    expect_error(ask(&model, &hello()).await, false, "no function name");
    expect_error(ask(&model, &hello()).await, false, "malformed");
    expect_error(ask(&model, &hello()).await, false, "content-type text/html");
    expect_error(ask(&model, &hello()).await, false, "truncated");

    // Streams: an event that is not JSON, a tool call without a name.
    server.script.replies.lock().unwrap().extend([
        Reply::sse("data: {not json}\n\ndata: [DONE]\n\n", 64),
        Reply::sse(
            &sse(&[delta_chunk(
                json!({ "tool_calls": [{ "index": 0, "id": "c", "function": { "arguments": "{}" } }] }),
            )]),
            64,
        ),
    ]);
    let (result, _) = ask_streaming(&model, &hello()).await;
    expect_error(result, false, "malformed");
    let (result, _) = ask_streaming(&model, &hello()).await;
    expect_error(result, false, "no function name");
}

#[tokio::test]
async fn an_error_event_in_a_stream_is_reported() {
    let server = Server::start(vec![
        Reply::sse(
            &format!(
                "{}data: {}\n\n",
                sse(&[delta_chunk(json!({ "content": "Hi" }))]).trim_end_matches("data: [DONE]\n\n"),
                json!({ "error": { "message": format!("server overloaded ({KEY})"), "type": "server_error" } })
            ),
            16,
        ),
        Reply::sse(
            &format!(
                "data: {}\n\n",
                json!({ "error": { "message": "context too long", "type": "invalid_request_error", "code": 400 } })
            ),
            16,
        ),
    ])
    .await;
    let model = server.model();

    let (result, deltas) = ask_streaming(&model, &hello()).await;
    let error = expect_error(result, true, "server overloaded");
    assert!(error.message.contains("[redacted]"), "{}", error.message);
    assert_eq!(deltas, ["Hi"]);

    let (result, _) = ask_streaming(&model, &hello()).await;
    expect_error(result, false, "context too long");
}

#[tokio::test]
async fn a_slow_server_times_out_as_a_retryable_error() {
    let slow = |chunks: Vec<Vec<u8>>, delay: Duration, gap: Duration| Reply::Raw {
        status: StatusCode::OK,
        content_type: "text/event-stream",
        headers: Vec::new(),
        chunks,
        delay,
        gap,
    };
    let server = Server::start(vec![
        // No answer at all for 3 s.
        slow(vec![b"{}".to_vec()], Duration::from_secs(3), Duration::ZERO),
        // A stream that stalls after its first event.
        slow(
            vec![
                format!("data: {}\n\n", delta_chunk(json!({ "content": "slow" }))).into_bytes(),
                b"data: [DONE]\n\n".to_vec(),
            ],
            Duration::ZERO,
            Duration::from_secs(3),
        ),
    ])
    .await;
    let model = OpenAiModel::new(server.config().with_timeout(Duration::from_millis(200))).unwrap();

    let started = Instant::now();
    let error = expect_error(ask(&model, &hello()).await, true, "timed out");
    assert!(started.elapsed() < Duration::from_secs(2), "{error:?}");

    let started = Instant::now();
    let (result, deltas) = ask_streaming(&model, &hello()).await;
    expect_error(result, true, "timed out");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(deltas, ["slow"]);
}

#[tokio::test]
async fn a_refused_connection_is_retryable() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let config = OpenAiConfig::new(format!("http://{addr}/v1"), "test-model")
        .with_api_key(KEY)
        .with_timeout(Duration::from_secs(2));
    let model = OpenAiModel::new(config).unwrap();

    expect_error(ask(&model, &hello()).await, true, "connect");
}

/// A 429 naming its wait, in seconds.
fn rate_limited(retry_after: &'static str) -> Reply {
    Reply::Raw {
        status: StatusCode::TOO_MANY_REQUESTS,
        content_type: "application/json",
        headers: vec![("retry-after", retry_after)],
        chunks: vec![
            json!({ "error": { "message": "Rate limit reached", "type": "requests" } })
                .to_string()
                .into_bytes(),
        ],
        delay: Duration::ZERO,
        gap: Duration::ZERO,
    }
}

fn retrying(server: &Server) -> OpenAiModel {
    OpenAiModel::new(server.config().with_retry(fast_retries())).unwrap()
}

#[tokio::test]
async fn rate_limits_and_server_errors_are_retried_until_an_answer() {
    let server = Server::start(vec![
        rate_limited("0.3"),
        error_body(StatusCode::SERVICE_UNAVAILABLE, "loading model"),
        error_body(StatusCode::INTERNAL_SERVER_ERROR, "upstream exploded"),
        text_completion("at last", 5, 2),
    ])
    .await;
    let started = Instant::now();
    let answer = ask(&retrying(&server), &hello()).await.unwrap();
    assert_eq!(answer.content.text(), "at last");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "retry-after was not waited for"
    );
    assert_eq!(server.requests(), 4);
    let bodies = server.raw_bodies();
    assert!(
        bodies.iter().all(|b| *b == bodies[0]),
        "the same request each time"
    );

    // A stream that reports an error the server may get past before any
    // text was shown: sent again, its text shown once. (One that ends
    // without `[DONE]` is truncated, a fatal error, and is not.)
    let overloaded = json!({ "error": { "message": "overloaded", "type": "server_error" } });
    let answered = sse(&[
        delta_chunk(json!({ "content": "at last" })),
        finish_chunk("stop"),
    ]);
    let server = Server::start(vec![
        Reply::sse(&format!("data: {overloaded}\n\n"), 16),
        Reply::sse(&answered, 16),
    ])
    .await;
    let (result, deltas) = ask_streaming(&retrying(&server), &hello()).await;
    assert_eq!(result.unwrap().content.text(), "at last");
    assert_eq!(
        deltas.concat(),
        "at last",
        "nothing of the failed stream was shown"
    );
    assert_eq!(server.requests(), 2);
}

#[tokio::test]
async fn retries_stop_at_the_policy_and_the_deadline() {
    let server = Server::start(vec![rate_limited("30"), rate_limited("3600")]).await;
    let model = OpenAiModel::new(server.config().with_retry(RetryPolicy::default())).unwrap();
    // A wait past the deadline fails at once.
    let started = Instant::now();
    let error = model
        .respond(ModelRequest {
            messages: &hello(),
            tools: &[],
            deltas: None,
            deadline: Some(tokio::time::Instant::now() + Duration::from_secs(2)),
        })
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(20), "it waited");
    assert!(error.retryable);
    assert_eq!(error.status, Some(429));
    assert!(
        error.message.contains("would pass the run's deadline"),
        "{error}"
    );
    assert!(error.message.contains("resume the run later"), "{error}");
    assert_keyless(&error);

    // A wait over the policy's longest is not waited for.
    let error = ask(&model, &hello()).await.unwrap_err();
    assert!(error.message.contains("more than the 60 s"), "{error}");
    assert_eq!(server.requests(), 2);

    // Retries are bounded.
    let server = Server::start(vec![error_body(StatusCode::SERVICE_UNAVAILABLE, "busy"); 3]).await;
    let model = OpenAiModel::new(server.config().with_retry(RetryPolicy {
        max_retries: 2,
        ..fast_retries()
    }))
    .unwrap();
    let error = ask(&model, &hello()).await.unwrap_err();
    assert!(
        error.message.contains("gave up after 3 attempts"),
        "{error}"
    );
    assert_eq!(error.status, Some(503));
    assert_eq!(server.requests(), 3);
}

#[tokio::test]
async fn client_errors_and_shown_text_are_not_sent_again() {
    // A refused request would be refused again.
    let server = Server::start(vec![
        error_body(StatusCode::BAD_REQUEST, "context too long"),
        error_body(StatusCode::UNAUTHORIZED, "bad key"),
    ])
    .await;
    let model = retrying(&server);
    expect_error(ask(&model, &hello()).await, false, "400");
    expect_error(ask(&model, &hello()).await, false, "401");
    assert_eq!(server.requests(), 2);

    // A stream that fails after showing text: its text would show twice.
    let server = Server::start(vec![Reply::sse(
        &format!(
            "{}data: {}\n\n",
            sse(&[delta_chunk(json!({ "content": "Hi" }))]).trim_end_matches("data: [DONE]\n\n"),
            json!({ "error": { "message": "server overloaded", "type": "server_error" } })
        ),
        16,
    )])
    .await;
    let (result, deltas) = ask_streaming(&retrying(&server), &hello()).await;
    expect_error(result, true, "server overloaded");
    assert_eq!(deltas, ["Hi"]);
    assert_eq!(server.requests(), 1);
}
