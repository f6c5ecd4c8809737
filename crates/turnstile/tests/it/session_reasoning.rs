//! What the model is sent of reasoning: the current request's always
//! (exactly as it gave it), committed requests' as a placeholder (an empty
//! reasoning part naming its provider) by default, left out or sent whole
//! when the context policy asks for it.
//! Storage keeps all of it either way.

use turnstile::{
    AgentSession, ContextPolicy, ConversationId, Message, Namespace, Part, PastReasoning,
    ProviderMetadata, Reasoning, RequestId, RunContext, ScriptedReply,
};
use turnstile_testkit::session::*;
use turnstile_testkit::tools::*;

fn reasoning(step: &str) -> Reasoning {
    Reasoning {
        provider: "anthropic".into(),
        text: Some(format!("thinking about {step}")),
        signature: Some(format!("signature of {step}")),
        redacted: None,
    }
}

/// A tool turn and a final answer, each with signed reasoning; the tool
/// turn with provider metadata too.
fn script() -> Vec<ScriptedReply> {
    vec![
        tools_reply(vec![call("c1", "count")], usage(1, 1))
            .with_reasoning(reasoning("the call"))
            .with_provider_metadata(ProviderMetadata::new(r#"{"id": "r1"}"#).unwrap()),
        text_reply("done", usage(1, 1)).with_reasoning(reasoning("the answer")),
    ]
}

/// The reasoning of every assistant message in `messages`, in order.
fn reasoning_of(messages: &[Message]) -> Vec<Vec<Reasoning>> {
    messages
        .iter()
        .filter(|m| m.role() == "assistant")
        .map(|m| m.content().reasoning().cloned().collect())
        .collect()
}

/// Runs two requests with `policy`; returns what the model was sent, call by
/// call, and the stored transcript.
async fn two_requests(policy: ContextPolicy) -> (Vec<Vec<Message>>, Vec<Message>) {
    let store = memory_store().await;
    let model = ProbeModel::new(script(), 0);
    let conversation_id = ConversationId::new();
    let session = AgentSession::new(
        agent(model.clone(), vec![CountingTool::new("count")]),
        store.clone(),
        conversation_id,
        Namespace::new("tests").unwrap(),
        policy,
    );
    for input in ["first", "second"] {
        session
            .run(RequestId::new(), input, RunContext::default())
            .await
            .unwrap();
    }
    let transcript = store
        .transcript_window(conversation_id, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.message)
        .collect();
    (model.seen(), transcript)
}

#[tokio::test]
async fn committed_requests_reasoning_is_a_placeholder_by_default_and_the_current_ones_is_sent() {
    let (seen, transcript) = two_requests(ContextPolicy::default()).await;
    assert_eq!(seen.len(), 4, "two calls per request");
    // The first request's second call: its own tool turn, reasoning and all.
    assert_eq!(
        reasoning_of(&seen[1]),
        [vec![reasoning("the call")]],
        "{:?}",
        seen[1]
    );
    // The second request's first call: the first request's answers with a
    // placeholder for their reasoning, their text, tool calls and metadata
    // kept.
    let past: Vec<_> = seen[2].iter().filter(|m| m.role() == "assistant").collect();
    assert_eq!(past.len(), 2);
    let placeholder = Reasoning {
        provider: "anthropic".into(),
        ..Reasoning::default()
    };
    assert_eq!(
        reasoning_of(&seen[2]),
        [vec![placeholder.clone()], vec![placeholder.clone()]]
    );
    assert_eq!(
        past[0].content().parts(),
        [Part::Reasoning(placeholder.clone())]
    );
    assert_eq!(past[0].tool_calls().len(), 1);
    assert!(matches!(
        past[0],
        Message::Assistant { provider_metadata: Some(m), .. } if m.as_str() == r#"{"id": "r1"}"#
    ));
    assert_eq!(
        past[1].content().parts(),
        [Part::Reasoning(placeholder), Part::text("done")]
    );
    // The second request's own tool turn is sent whole.
    assert_eq!(
        reasoning_of(&seen[3]).last(),
        Some(&vec![reasoning("the call")])
    );
    // Storage keeps everything.
    assert_eq!(
        reasoning_of(&transcript),
        [
            vec![reasoning("the call")],
            vec![reasoning("the answer")],
            vec![reasoning("the call")],
            vec![reasoning("the answer")],
        ]
    );
}

#[tokio::test]
async fn past_reasoning_sent_gives_the_model_every_committed_answers_reasoning() {
    let policy = ContextPolicy::default().with_past_reasoning(PastReasoning::Sent);
    let (seen, _) = two_requests(policy).await;
    assert_eq!(
        reasoning_of(&seen[2]),
        [vec![reasoning("the call")], vec![reasoning("the answer")]]
    );
}

#[tokio::test]
async fn past_reasoning_omitted_leaves_no_trace_of_it() {
    let policy = ContextPolicy::default().with_past_reasoning(PastReasoning::Omitted);
    let (seen, _) = two_requests(policy).await;
    let past: Vec<_> = seen[2].iter().filter(|m| m.role() == "assistant").collect();
    assert_eq!(reasoning_of(&seen[2]), [vec![], vec![]]);
    assert!(past[0].content().parts().is_empty(), "{:?}", past[0]);
    assert_eq!(past[0].tool_calls().len(), 1);
    assert_eq!(past[1].content().parts(), [Part::text("done")]);
}
