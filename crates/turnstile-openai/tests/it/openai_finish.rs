//! Answers the server did not let the model finish (`finish_reason`
//! `length` or `content_filter`), non-streamed and streamed: a fatal model
//! error that names the reason and quotes nothing of the answer, and in an
//! agent run a stop with the admission held, no tool call run and the run
//! resumable.

use std::sync::Arc;

use futures_util::StreamExt;
use serde_json::{json, Value};
use turnstile::agent::ModelRequest;
use turnstile::{Event, Model, RequestId, ResumePolicy, RunContext};

use crate::support::*;

/// In every answer below; never in an error.
const MARK: &str = "ANSWER-TEXT-MARK";

/// A complete `add` call and a second one cut in its arguments.
fn cut_calls() -> Value {
    json!({
        "role": "assistant",
        "content": format!("adding {MARK}"),
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": { "name": "add", "arguments": "{\"a\":2,\"b\":3}" },
            },
            {
                "id": "call_2",
                "type": "function",
                "function": { "name": "add", "arguments": "{\"a\":4,\"b" },
            },
        ],
    })
}

/// The same answer as an event stream ending for `finish_reason`.
fn cut_calls_stream(finish_reason: &str) -> String {
    sse(&[
        delta_chunk(json!({ "role": "assistant", "content": format!("adding {MARK}") })),
        call_fragment(0, Some(("call_1", "add")), "{\"a\":2,"),
        call_fragment(0, None, "\"b\":3}"),
        call_fragment(1, Some(("call_2", "add")), "{\"a\":4,"),
        call_fragment(1, None, "\"b"),
        finish_chunk(finish_reason),
        usage_chunk(30, 20),
    ])
}

fn text(content: &str) -> Value {
    json!({ "role": "assistant", "content": content })
}

fn usage() -> Value {
    json!({ "prompt_tokens": 30, "completion_tokens": 20 })
}

#[track_caller]
fn expect_stop(
    result: Result<turnstile::agent::ModelResponse, turnstile::ModelError>,
    reason: &str,
) -> turnstile::ModelError {
    let error = expect_error(result, false, &format!("finish_reason {reason}"));
    assert!(!error.message.contains(MARK), "{}", error.message);
    error
}

/// The tokens `usage()` reports, as the error of a discarded answer
/// carries them.
#[track_caller]
fn assert_spent(error: &turnstile::ModelError) {
    let spent = (error.usage.input_tokens, error.usage.output_tokens);
    assert_eq!(spent, (30, 20), "the discarded answer's usage");
}

#[tokio::test]
async fn a_cut_or_filtered_answer_is_a_fatal_model_error() {
    let server = Server::start(vec![
        completion(
            text(&format!("the answer stops mid {MARK}")),
            usage(),
            "length",
        ),
        completion(cut_calls(), usage(), "length"),
        completion(text(MARK), usage(), "content_filter"),
        // Any other reason, or none, is a finished answer.
        completion(text("done"), usage(), "stop"),
        completion(text("done"), usage(), "eos"),
        completion(text("done"), Value::Null, ""),
    ])
    .await;
    let model = server.model();
    let tools = [add_spec()];
    let ask_with_tools = || {
        model.respond(ModelRequest {
            messages: &[],
            tools: &tools,
            deltas: None,
            deadline: None,
        })
    };

    assert_spent(&expect_stop(ask(&model, &hello()).await, "length"));
    let error = ask_with_tools().await.unwrap_err();
    assert!(error.message.contains("tool calls not run"), "{error}");
    assert!(!error.message.contains("call_1"), "{error}");
    assert_spent(&expect_stop(ask(&model, &hello()).await, "content_filter"));
    for _ in 0..3 {
        assert_eq!(ask(&model, &hello()).await.unwrap().content, "done");
    }
}

#[tokio::test]
async fn a_cut_or_filtered_stream_is_a_fatal_model_error() {
    let cut_text = sse(&[
        delta_chunk(json!({ "role": "assistant", "content": "" })),
        delta_chunk(json!({ "content": "the answer stops " })),
        // The reason may come with the last delta.
        json!({ "choices": [{ "index": 0, "delta": { "content": MARK }, "finish_reason": "length" }] }),
        usage_chunk(30, 20),
    ]);
    let other_choice_cut = sse(&[
        delta_chunk(json!({ "content": "done" })),
        json!({ "choices": [{ "index": 1, "delta": {}, "finish_reason": "length" }] }),
        finish_chunk("stop"),
    ]);
    let server = Server::start(vec![
        Reply::sse(&cut_text, 13),
        Reply::sse(&cut_calls_stream("length"), 17),
        Reply::sse(&cut_calls_stream("content_filter"), 17),
        Reply::sse(&cut_calls_stream("tool_calls"), 17),
        Reply::sse(&other_choice_cut, 17),
    ])
    .await;
    let model = server.model();

    let (result, deltas) = ask_streaming(&model, &hello()).await;
    assert_spent(&expect_stop(result, "length"));
    // The deltas were already out when the reason came.
    assert_eq!(deltas, ["the answer stops ", MARK]);
    let (result, _) = ask_streaming(&model, &hello()).await;
    expect_stop(result, "length");
    let (result, _) = ask_streaming(&model, &hello()).await;
    expect_stop(result, "content_filter");

    // The same calls, finished: both are answered.
    let (result, _) = ask_streaming(&model, &hello()).await;
    let calls = result.unwrap().tool_calls;
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].arguments, "{\"a\":4,\"b");
    // Only the first choice is the answer.
    let (result, _) = ask_streaming(&model, &hello()).await;
    assert_eq!(result.unwrap().content, "done");
}

#[tokio::test]
async fn a_cut_answer_stops_an_agent_run_and_none_of_its_calls_runs() {
    let server = Server::start(vec![
        completion(cut_calls(), usage(), "length"),
        text_completion("2 + 3 = 5", 40, 5),
    ])
    .await;
    let add = Arc::new(Add::default());
    let (session, _store) = add_session(Arc::new(server.model()), add.clone()).await;

    let error = session
        .run(RequestId::new(), "what is 2 + 3?", RunContext::default())
        .await
        .unwrap_err();
    assert!(!error.to_string().contains(MARK), "{error}");
    let (run, revision) = assert_model_stop(&session, &error, "finish_reason length", 1).await;
    assert_eq!(add.calls(), 0);

    // Resuming asks the model again; this time it finishes.
    let outcome = session
        .resume_run(
            run,
            RunContext::default(),
            revision,
            ResumePolicy::default(),
        )
        .await
        .unwrap();
    assert_eq!(outcome.final_text, "2 + 3 = 5");
    assert_eq!((outcome.turns, outcome.tool_calls), (1, 0));
    assert_eq!(add.calls(), 0);
    assert_eq!(server.bodies().len(), 2);
}

#[tokio::test]
async fn a_filtered_stream_stops_an_agent_stream_and_none_of_its_calls_runs() {
    let server = Server::start(vec![Reply::sse(&cut_calls_stream("content_filter"), 29)]).await;
    let add = Arc::new(Add::default());
    let (session, _store) = add_session(Arc::new(server.model()), add.clone()).await;

    let mut events =
        std::pin::pin!(session.stream(RequestId::new(), "what is 2 + 3?", RunContext::default()));
    let mut seen = Vec::new();
    let mut error = None;
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => seen.push(event),
            Err(e) => error = Some(e),
        }
    }
    let error = error.expect("the stream ends with the model error");
    assert_model_stop(&session, &error, "finish_reason content_filter", 1).await;
    assert_eq!(add.calls(), 0);
    assert!(seen
        .iter()
        .any(|e| matches!(e, Event::TextDelta { text, .. } if text.contains(MARK))));
    assert!(!seen
        .iter()
        .any(|e| matches!(e, Event::ToolStarted { .. } | Event::ModelResponded { .. })));
    assert_eq!(server.bodies()[0]["stream"], true);
}
