//! Failures: rate limits and overloads retried after `retry-after` or a
//! backoff, never past the run's deadline; other 4xx answers at once and
//! typed; cut streams and error events; no key in any message.

use std::time::Duration;

use turnstile::agent::ModelRequest;
use turnstile::{Message, Model, RetryPolicy};

use crate::support::*;

fn hello() -> Vec<Message> {
    vec![Message::user("hello")]
}

#[tokio::test]
async fn rate_limits_and_overloads_are_retried_until_an_answer() {
    // The test backoff is 20 ms: the wait below is the server's.
    let server = Server::start(vec![
        Reply::retry_after(429, "rate_limit_error", "0.3"),
        Reply::status(529, "overloaded_error"),
        Reply::status(500, "api_error"),
        Reply::answer(vec![text("at last")], "end_turn"),
    ])
    .await;
    let started = std::time::Instant::now();
    let (answer, _) = respond(&server.model(), &hello(), &[], false).await;
    assert_eq!(answer.unwrap().content.text(), "at last");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "retry-after was not waited for"
    );
    assert_eq!(server.requests().len(), 4);

    // An overload reported in the stream, or a stream cut (between events
    // or in one), before any text was shown: sent again.
    for reply in [
        Reply::StreamError {
            error_type: "overloaded_error",
        },
        Reply::CutStream {
            blocks: vec![text("never shown")],
            events: 2,
            mid_event: false,
        },
        Reply::CutStream {
            blocks: vec![text("never shown")],
            events: 2,
            mid_event: true,
        },
    ] {
        let server = Server::start(vec![
            reply,
            Reply::answer(vec![text("at last")], "end_turn"),
        ])
        .await;
        let (answer, deltas) = respond(&server.model(), &hello(), &[], true).await;
        assert_eq!(answer.unwrap().content.text(), "at last");
        assert_eq!(deltas, "at last", "nothing of the failed stream was shown");
        assert_eq!(server.requests().len(), 2);
    }
}

#[tokio::test]
async fn retries_stop_at_the_policy_and_the_deadline() {
    let server = Server::start(vec![
        Reply::retry_after(429, "rate_limit_error", "30"),
        Reply::retry_after(429, "rate_limit_error", "3600"),
    ])
    .await;
    // A wait past the deadline fails at once.
    let started = std::time::Instant::now();
    let error = server
        .model()
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
    assert!(error.message.contains("rate_limit_error"), "{error}");
    assert!(
        error.message.contains("would pass the run's deadline"),
        "{error}"
    );
    assert!(error.message.contains("resume the run later"), "{error}");
    assert_keyless(&error);

    // A wait over the policy's longest is not waited for.
    let error = respond(&server.model(), &hello(), &[], false)
        .await
        .0
        .unwrap_err();
    assert!(error.message.contains("more than the 60 s"), "{error}");

    // Retries are bounded.
    let server = Server::start(vec![Reply::status(503, "api_error"); 3]).await;
    let model = turnstile::AnthropicModel::new(server.config().with_retry(RetryPolicy {
        max_retries: 2,
        backoff: Duration::from_millis(10),
        max_wait: Duration::from_secs(1),
    }))
    .unwrap();
    let error = respond(&model, &hello(), &[], false).await.0.unwrap_err();
    assert!(
        error.message.contains("gave up after 3 attempts"),
        "{error}"
    );
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test]
async fn client_errors_are_typed_and_not_retried() {
    for (status, kind, hint) in [
        (400, "invalid_request_error", ""),
        (401, "authentication_error", "check the api key"),
        (403, "permission_error", "may not use this model"),
        (404, "not_found_error", "check the model name"),
    ] {
        let server = Server::start(vec![Reply::status(status, kind)]).await;
        let error = respond(&server.model(), &hello(), &[], false)
            .await
            .0
            .unwrap_err();
        assert_eq!(error.status, Some(status));
        assert!(!error.retryable, "{error}");
        assert!(error.message.contains(kind), "{error}");
        assert!(error.message.contains(hint), "{error}");
        assert_keyless(&error);
        assert_eq!(server.requests().len(), 1, "{status} is not retried");
    }
}

#[tokio::test]
async fn a_stream_that_fails_after_showing_text_is_not_sent_again() {
    let server = Server::start(vec![
        Reply::CutStream {
            blocks: vec![text("half an answer")],
            events: 3,
            mid_event: false,
        },
        Reply::StreamError {
            error_type: "invalid_request_error",
        },
        Reply::RawSse("event: message_start\ndata: {\"type\": \"message_start\", MALFORMED\n\n"),
    ])
    .await;
    let model = server.model();
    let (cut, deltas) = respond(&model, &hello(), &[], true).await;
    let cut = cut.unwrap_err();
    assert!(cut.retryable, "the run may be resumed");
    assert!(cut.message.contains("without message_stop"), "{cut}");
    assert_eq!(
        deltas, "half an",
        "the deltas before the cut were shown once"
    );
    assert_eq!(server.requests().len(), 1);

    let refused = respond(&model, &hello(), &[], true).await.0.unwrap_err();
    assert!(!refused.retryable);
    assert!(
        refused.message.contains("invalid_request_error"),
        "{refused}"
    );
    let malformed = respond(&model, &hello(), &[], true).await.0.unwrap_err();
    assert!(!malformed.retryable);
    assert!(
        malformed
            .message
            .contains("malformed anthropic messages stream"),
        "{malformed}"
    );
    assert!(!malformed.message.contains("MALFORMED"), "{malformed}");
    assert_eq!(server.requests().len(), 3, "none was sent again");
}

#[tokio::test]
async fn a_stream_over_32_mib_is_refused() {
    // Keep-alive comments a MiB at a time: each line within the parser's
    // bound, the stream as a whole past the answer's.
    let stream = format!(": {}\n\n", "k".repeat(1 << 20)).repeat(33);
    let server = Server::start(vec![Reply::RawSse(Box::leak(stream.into_boxed_str()))]).await;
    let error = respond(&server.model(), &hello(), &[], true)
        .await
        .0
        .unwrap_err();
    assert!(!error.retryable);
    assert!(
        error
            .message
            .contains("the anthropic messages stream exceeds 32 MiB"),
        "{error}"
    );
}

#[tokio::test]
async fn bad_configurations_are_refused_before_any_call() {
    use turnstile::{AnthropicConfig, AnthropicModel};
    let base = AnthropicConfig::new("m").with_base_url("http://127.0.0.1:9");
    for (config, needle) in [
        (base.clone().with_thinking_budget(9000), "below max_tokens"),
        (AnthropicConfig::new(" "), "model name is empty"),
        (base.clone().with_base_url("ftp://x"), "not http or https"),
        (
            base.clone().with_extra_body(
                serde_json::json!({ "thinking": {} })
                    .as_object()
                    .unwrap()
                    .clone(),
            ),
            "set by the anthropic model itself",
        ),
    ] {
        let error = AnthropicModel::new(config).unwrap_err();
        assert!(error.message.contains(needle), "{error}");
    }
    let debug = format!("{:?}", base.with_api_key(KEY));
    assert!(!debug.contains(KEY), "{debug}");
}
