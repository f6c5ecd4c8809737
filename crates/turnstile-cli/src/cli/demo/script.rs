//! The demo's two requests: their inputs and the scripted model answers.
//! The tools they call are real; only the model is scripted.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use turnstile::agent::{ScriptedModel, ScriptedReply};
use turnstile::message::{Reasoning, ToolCall, Usage};

/// The namespace of the demo's conversations.
pub const NAMESPACE: &str = "demo";

/// The scripted model's name (part of the agent fingerprint, which the
/// worker and the recovering parent must share).
pub const MODEL_NAME: &str = "demo-scripted";

/// The first request: three turns, three tool calls.
pub const FIRST_INPUT: &str = "What is 17 + 25, what time is it in UTC, and how many words are \
                               in \"the quick brown fox jumps over the lazy dog\"?";

/// The second request: four turns, four tool calls; its worker is killed
/// after [`KILL_AFTER_TURN`].
pub const SECOND_INPUT: &str = "Add 1200 and 34, then add 66 to the result, count the words in \
                                \"durable agents survive crashes\", and tell me the time.";

/// The turn after whose checkpoint the worker is killed.
pub const KILL_AFTER_TURN: u32 = 2;

fn usage(input_tokens: u64, output_tokens: u64) -> Usage {
    Usage {
        input_tokens,
        output_tokens,
        ..Usage::default()
    }
}

fn call(id: &str, name: &str, arguments: serde_json::Value) -> ToolCall {
    ToolCall::new(id, name, arguments)
}

fn paced(replies: Vec<ScriptedReply>, pace: Duration) -> Vec<ScriptedReply> {
    replies
        .into_iter()
        .map(|reply| match pace.is_zero() {
            true => reply,
            false => reply.with_delay(pace),
        })
        .collect()
}

/// The model of the first request; each answer takes `pace`.
pub fn first_model(pace: Duration) -> Arc<ScriptedModel> {
    let replies = vec![
        ScriptedReply::tool_calls(vec![
            call("add-1", "add", json!({"a": 17, "b": 25})),
            call("clock-1", "clock", json!({})),
        ])
        .with_usage(usage(412, 38)),
        ScriptedReply::tool_calls(vec![call(
            "words-1",
            "word_count",
            json!({"text": "the quick brown fox jumps over the lazy dog"}),
        )])
        .with_usage(usage(655, 21)),
        ScriptedReply::text(
            "17 + 25 = 42, the sentence has 9 words, and the clock tool has just read the \
             current UTC time for you.",
        )
        .with_usage(usage(731, 42)),
    ];
    Arc::new(ScriptedModel::named(MODEL_NAME, paced(replies, pace)))
}

/// The signed reasoning of the second request's turn 2, the last turn
/// before the kill: the recovery must send it back exactly.
pub fn second_reasoning() -> Reasoning {
    Reasoning {
        provider: "demo".into(),
        text: Some("1234 is the first sum; add 66 to it before counting words.".into()),
        signature: Some("ZGVtby1zaWduYXR1cmUtb2YtdHVybi0y".into()),
        redacted: None,
    }
}

/// The model of the second request; each answer takes `pace`. It requires
/// its earlier answers back exactly, as a provider requires its signed
/// reasoning in a tool loop.
pub fn second_model(pace: Duration) -> Arc<ScriptedModel> {
    let replies = vec![
        ScriptedReply::tool_calls(vec![call("add-1", "add", json!({"a": 1200, "b": 34}))])
            .with_usage(usage(398, 24)),
        ScriptedReply::tool_calls(vec![call("add-2", "add", json!({"a": 1234, "b": 66}))])
            .with_reasoning(second_reasoning())
            .with_usage(usage(520, 24)),
        ScriptedReply::tool_calls(vec![
            call(
                "words-1",
                "word_count",
                json!({"text": "durable agents survive crashes"}),
            ),
            call("clock-1", "clock", json!({})),
        ])
        .with_usage(usage(644, 41)),
        ScriptedReply::text(
            "1200 + 34 = 1234, plus 66 makes 1300; the phrase has 4 words; and the clock was \
             read after the recovery.",
        )
        .with_usage(usage(802, 47)),
    ];
    Arc::new(ScriptedModel::named(MODEL_NAME, paced(replies, pace)).requiring_answers_back())
}
