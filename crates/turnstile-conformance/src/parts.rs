//! Content parts (JSON among them), reasoning with its signature and
//! provider metadata come back from every read exactly as they were
//! written: through a claim's
//! input, a model answer with tool calls, a turn's tool messages and a
//! commit, in the request's pending messages, the transcript and a later
//! claim's window.

use turnstile_core::store::ToolResult;
use turnstile_core::{
    CheckpointPhase, Content, Message, Part, ProviderMetadata, Reasoning, Revision, ToolCall,
};

use crate::support::*;

/// Reasoning as providers send it: text with awkward characters and a
/// 64 KiB signature, or redacted data only.
fn reasoning() -> Vec<Part> {
    vec![
        Part::Reasoning(Reasoning {
            provider: "anthropic".into(),
            text: Some("step \0 one\u{202e}\r\n\"quoted\" é🦀".into()),
            signature: Some("Sg+/=".repeat(64 * 1024 / 5)),
            redacted: None,
        }),
        Part::Reasoning(Reasoning {
            provider: "anthropic".into(),
            text: None,
            signature: None,
            redacted: Some("EmwKAhgBEgy3va3pzix/LafPsn4a".into()),
        }),
        Part::text(""),
        Part::text("answer \0 text"),
    ]
}

/// Metadata a provider needs back byte for byte: unknown keys in their own
/// order, numbers past what an f64 holds, escapes and whitespace as sent.
fn metadata(tag: &str) -> ProviderMetadata {
    ProviderMetadata::new(format!(
        "{{ \"z\": {{\"thought_signature\": \"{tag}\"}}, \"a\": 123456789012345678901234567890, \
         \"f\": 1.50e400, \"s\": \"\\u00e9\\n\" }}"
    ))
    .expect("a JSON object")
}

pub async fn parts_reasoning_and_provider_metadata_round_trip_byte_exact(
    store: SharedStore,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let mut claim = new_request(conversation, Revision(0), "input with parts");
    claim.input = Message::User {
        content: Content::new(vec![Part::text("two "), Part::text("\0parts")]),
    };
    let fence = admitted(&*store, &claim).await?;

    let run = fence.run_id;
    let mut start = checkpoint(run, 0, CheckpointPhase::TurnInFlight, 1);
    start.turn = 1;
    store.begin_turn(&fence, &start).await?;
    let call = ToolCall {
        provider_metadata: Some(metadata("call")),
        ..ToolCall::new("call-1", "lookup", serde_json::json!({"q": 1}))
    };
    let answer = Message::Assistant {
        content: Content::new(reasoning()),
        tool_calls: vec![call.clone()],
        provider_metadata: Some(metadata("answer")),
    };
    let answered = checkpoint(run, 1, CheckpointPhase::ToolsInFlight, 1);
    store
        .record_model_response(&fence, &answered, &answer)
        .await?;
    // A structured result: text and JSON kept as written.
    let found = Content::new(vec![
        Part::text("found"),
        Part::json(" {\"n\": 123456789012345678901234567890, \"x\": 1e400, \"a\": [\"\\u0000\"]}")?,
    ]);
    let result = ToolResult {
        content: found.clone(),
        is_error: false,
    };
    store
        .record_tool_result(&fence, 1, &call.id, &result)
        .await?;
    let journal = store.journal(fence.request_id, 1).await?;
    assert_eq!(journal[0].result.as_ref(), Some(&result));
    let tool = Message::Tool {
        call_id: call.id.clone(),
        content: found,
        is_error: false,
    };
    let done = checkpoint(run, 1, CheckpointPhase::Ready, 3);
    store
        .finish_turn(&fence, &done, std::slice::from_ref(&tool), None)
        .await?;

    let pending = store.request_messages(fence.request_id, 3).await?;
    assert_eq!(pending, [claim.input.clone(), answer.clone(), tool.clone()]);

    let last = Message::Assistant {
        content: Content::new(reasoning()),
        tool_calls: Vec::new(),
        provider_metadata: Some(metadata("final")),
    };
    let committed = checkpoint(run, 2, CheckpointPhase::Ready, 4);
    store.commit(&fence, &committed, &last).await?;

    let expected = [claim.input, answer, tool, last];
    let transcript = store.transcript_range(conversation, 0, u64::MAX).await?;
    assert!(transcript.iter().map(|e| &e.message).eq(expected.iter()));
    let Some(Message::Assistant {
        provider_metadata: Some(stored),
        tool_calls,
        ..
    }) = transcript.get(1).map(|e| &e.message)
    else {
        panic!("the answer is second: {transcript:?}");
    };
    assert_eq!(stored.as_str(), metadata("answer").as_str());
    assert_eq!(
        tool_calls[0].provider_metadata.as_ref().map(|m| m.as_str()),
        Some(metadata("call").as_str())
    );

    let next = new_request(conversation, Revision(0), "next");
    let context = store
        .claim_context(&ns(), conversation, next.request_id, Some(u32::MAX))
        .await?;
    assert!(context
        .window
        .iter()
        .map(|e| &e.message)
        .eq(expected.iter()));
    Ok(())
}
