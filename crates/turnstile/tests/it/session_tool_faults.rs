//! Whatever goes wrong with a tool call becomes an error result fed back to
//! the model; the run goes on and completes.

use std::sync::Arc;
use std::time::Duration;

use turnstile::store::JournalStatus;
use turnstile::{
    AgentLimits, ConversationId, Message, Outcome, RequestId, RunContext, Tool, ToolCall,
};
use turnstile_testkit::session::*;
use turnstile_testkit::tools::*;

/// Runs one request whose first turn asks for `calls`, then answers
/// "recovered". Returns the outcome, the model, and the request id.
async fn run_turn(
    calls: Vec<ToolCall>,
    tools: Vec<Arc<dyn Tool>>,
    limits: AgentLimits,
) -> (Outcome, Arc<ProbeModel>, Vec<JournalStatus>) {
    let store = memory_store().await;
    let model = ProbeModel::new(
        vec![
            tools_reply(calls, usage(1, 1)),
            text_reply("recovered", usage(1, 1)),
        ],
        0,
    );
    let conversation_id = ConversationId::new();
    let session = session(
        agent(model.clone(), tools).with_limits(limits),
        &store,
        conversation_id,
    );
    let request_id = RequestId::new();
    let outcome = session
        .run(request_id, "use the tools", RunContext::default())
        .await
        .expect("the run completes despite the tool fault");
    let journal = store
        .journal(request_id, 1)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.status)
        .collect();
    (outcome, model, journal)
}

/// Asserts a completed run whose turn-1 results are all errors containing
/// the given texts, and that the model was given exactly those results.
fn assert_error_results(outcome: &Outcome, model: &ProbeModel, expected: &[(&str, &str)]) {
    assert_eq!(outcome.final_text, "recovered");
    assert_eq!(model.calls(), 2);
    let results = tool_results(&outcome.messages);
    assert_eq!(results.len(), expected.len(), "{results:?}");
    for ((call_id, content, is_error), (want_id, want_text)) in results.iter().zip(expected) {
        assert_eq!(call_id, want_id);
        assert!(*is_error, "{call_id} is not an error result: {content}");
        assert!(
            content.contains(want_text),
            "{call_id}: {content:?} does not mention {want_text:?}"
        );
    }
    assert_one_result_per_call(&outcome.messages);
    // The model's second call saw the error results, in order.
    let seen = model.seen();
    let fed: Vec<Message> = seen[1]
        .iter()
        .filter(|m| matches!(m, Message::Tool { .. }))
        .cloned()
        .collect();
    let stored: Vec<Message> = outcome
        .messages
        .iter()
        .filter(|m| matches!(m, Message::Tool { .. }))
        .cloned()
        .collect();
    assert_eq!(fed, stored);
}

#[tokio::test]
async fn unknown_tool_name_becomes_an_error_result_and_the_run_completes() {
    let (outcome, model, journal) = run_turn(
        vec![call("c1", "no_such_tool")],
        vec![CountingTool::new("count")],
        AgentLimits::default(),
    )
    .await;
    assert_error_results(&outcome, &model, &[("c1", "unknown tool")]);
    assert_eq!(journal, vec![JournalStatus::Failed]);
}

#[tokio::test]
async fn invalid_json_arguments_become_an_error_result_without_running_the_tool() {
    let count = CountingTool::new("count");
    let bad = ToolCall {
        id: "c1".into(),
        name: "count".into(),
        arguments: "{not json".into(),
        provider_metadata: None,
    };
    let (outcome, model, journal) =
        run_turn(vec![bad], vec![count.clone()], AgentLimits::default()).await;
    assert_error_results(&outcome, &model, &[("c1", "invalid JSON")]);
    assert_eq!(count.calls(), 0);
    assert_eq!(journal, vec![JournalStatus::Failed]);
}

#[tokio::test]
async fn tool_error_becomes_an_error_result_and_the_run_completes() {
    let (outcome, model, journal) = run_turn(
        vec![call("c1", "failing")],
        vec![Arc::new(FailingTool)],
        AgentLimits::default(),
    )
    .await;
    assert_error_results(&outcome, &model, &[("c1", "disk on fire")]);
    assert_eq!(journal, vec![JournalStatus::Failed]);
}

#[tokio::test]
async fn panicking_tool_becomes_an_error_result_and_the_run_completes() {
    let (outcome, model, _) = run_turn(
        vec![call("c1", "panicking")],
        vec![Arc::new(PanickingTool)],
        AgentLimits::default(),
    )
    .await;
    assert_error_results(&outcome, &model, &[("c1", "panicked")]);
}

#[tokio::test]
async fn tool_past_its_timeout_becomes_an_error_result_and_the_run_completes() {
    let limits = AgentLimits {
        tool_timeout: Duration::from_millis(50),
        ..AgentLimits::default()
    };
    let (outcome, model, _) = run_turn(
        vec![call("c1", "sleeping")],
        vec![Arc::new(SleepingTool)],
        limits,
    )
    .await;
    assert_error_results(&outcome, &model, &[("c1", "timed out")]);
}

#[tokio::test]
async fn every_kind_of_tool_fault_in_one_turn_is_answered_and_healthy_calls_still_run() {
    let count = CountingTool::new("count");
    let limits = AgentLimits {
        tool_timeout: Duration::from_millis(50),
        ..AgentLimits::default()
    };
    let calls = vec![
        call("c1", "no_such_tool"),
        ToolCall {
            id: "c2".into(),
            name: "count".into(),
            arguments: "{not json".into(),
            provider_metadata: None,
        },
        call("c3", "failing"),
        call("c4", "panicking"),
        call("c5", "sleeping"),
        call("c6", "count"),
    ];
    let tools: Vec<Arc<dyn Tool>> = vec![
        count.clone(),
        Arc::new(FailingTool),
        Arc::new(PanickingTool),
        Arc::new(SleepingTool),
    ];
    let (outcome, model, journal) = run_turn(calls, tools, limits).await;

    assert_eq!(outcome.final_text, "recovered");
    assert_eq!(outcome.tool_calls, 6);
    let results = tool_results(&outcome.messages);
    let errors: Vec<bool> = results.iter().map(|r| r.2).collect();
    assert_eq!(errors, vec![true, true, true, true, true, false]);
    assert_eq!(results[5].1, "count call 1");
    assert_eq!(count.calls(), 1);
    assert_eq!(journal.len(), 6);
    assert_eq!(
        journal
            .iter()
            .filter(|s| **s == JournalStatus::Failed)
            .count(),
        5
    );
    assert_eq!(model.seen()[1].len(), outcome.messages.len() - 1);
    assert_one_result_per_call(&outcome.messages);
}

#[tokio::test]
async fn calls_beyond_the_per_turn_limit_are_answered_with_errors_without_running() {
    let count = CountingTool::new("count");
    let limits = AgentLimits {
        max_tool_calls_per_turn: 2,
        ..AgentLimits::default()
    };
    let calls = vec![
        call("c1", "count"),
        call("c2", "count"),
        call("c3", "count"),
    ];
    let (outcome, model, _) = run_turn(calls, vec![count.clone()], limits).await;

    assert_eq!(model.calls(), 2);
    assert_eq!(count.calls(), 2);
    let results = tool_results(&outcome.messages);
    assert_eq!(
        results.iter().map(|r| r.2).collect::<Vec<_>>(),
        vec![false, false, true]
    );
    assert!(results[2].1.contains("not run"), "{:?}", results[2]);
    assert_one_result_per_call(&outcome.messages);
}

/// A counting tool that declares integer parameters `a` and `b`.
struct Adder(Arc<CountingTool>);

#[turnstile::async_trait]
impl Tool for Adder {
    fn spec(&self) -> turnstile::ToolSpec {
        turnstile::ToolSpec {
            name: "add".into(),
            description: "adds".into(),
            parameters: serde_json::json!({
                "type": "object",
                "properties": { "a": { "type": "integer" }, "b": { "type": "integer" } },
                "required": ["a", "b"]
            }),
        }
    }

    async fn call(
        &self,
        arguments: serde_json::Value,
        context: turnstile::ToolContext,
    ) -> Result<turnstile::Content, turnstile::ToolError> {
        self.0.call(arguments, context).await
    }
}

#[tokio::test]
async fn arguments_that_do_not_match_the_tools_schema_never_reach_the_tool() {
    let counter = CountingTool::new("add");
    let adder: Arc<dyn Tool> = Arc::new(Adder(counter.clone()));
    let calls = vec![
        ToolCall::new("wrong-type", "add", serde_json::json!({"a": "two", "b": 3})),
        ToolCall::new("missing", "add", serde_json::json!({"a": 2})),
        ToolCall::new("fits", "add", serde_json::json!({"a": 2, "b": 3})),
    ];
    let (outcome, model, journal) = run_turn(calls, vec![adder], AgentLimits::default()).await;
    assert_eq!(counter.calls(), 1, "only the call that fits ran");
    assert_eq!(
        journal,
        [
            JournalStatus::Failed,
            JournalStatus::Failed,
            JournalStatus::Completed
        ]
    );
    let results = tool_results(&outcome.messages);
    assert_eq!(results[0].0, "wrong-type");
    assert!(
        results[0].2 && results[0].1.contains("/a"),
        "{:?}",
        results[0]
    );
    assert!(results[0].1.contains("do not match the tool's parameters"));
    assert!(results[1].2 && results[1].1.contains("\"b\" is a required property"));
    assert_eq!(results[2], ("fits".into(), "add call 1".into(), false));
    assert_eq!(model.calls(), 2);
}
