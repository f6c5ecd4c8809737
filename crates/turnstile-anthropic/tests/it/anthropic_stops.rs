//! Stop reasons: `max_tokens` and `refusal` stop a run with its admission
//! held and no tool call of the answer run, resumable; `pause_turn` is
//! continued by sending the paused answer back as it came.

use std::sync::Arc;

use serde_json::json;
use turnstile::{
    Agent, AgentSession, CheckpointPhase, ContextPolicy, ConversationId, Error, Message, Namespace,
    RequestId, ResumePolicy, RunContext, SqliteStore,
};
use turnstile_testkit::tools::CountingTool;

use crate::support::*;

#[tokio::test]
async fn a_cut_or_refused_answer_stops_the_run_resumable_and_runs_no_tool() {
    for (reason, needle) in [("max_tokens", "max_tokens (8192"), ("refusal", "refusal")] {
        let server = Server::start(vec![
            Reply::answer(
                vec![
                    text("Adding MARK"),
                    tool_use("toolu_1", "add", r#"{"a":1,"b":2}"#),
                ],
                reason,
            ),
            Reply::answer(vec![text("3")], "end_turn"),
        ])
        .await;
        let add = CountingTool::new("add");
        let session = AgentSession::new(
            Agent::new(Arc::new(server.model())).with_tool(add.clone()),
            Arc::new(SqliteStore::in_memory().await.unwrap()),
            ConversationId::new(),
            Namespace::new("anthropic-test").unwrap(),
            ContextPolicy::default(),
        );
        let error = session
            .run(RequestId::new(), "add", RunContext::default())
            .await
            .unwrap_err();
        match &error {
            Error::Model { source, .. } => {
                assert!(!source.retryable, "{source:?}");
                assert!(source.message.contains(needle), "{source}");
                assert!(source.message.contains("tool calls not run"), "{source}");
                assert!(!source.message.contains("MARK"), "{source}");
                let spent = (source.usage.input_tokens, source.usage.output_tokens);
                assert_eq!(spent, (10, 5), "the discarded answer's usage");
            }
            other => panic!("expected a model error, got {other:?}"),
        }
        assert_eq!(add.calls(), 0, "no call of a cut answer runs");
        let (run_id, revision) = error.stopped_run().expect("a stopped run");
        let store = session.store();
        let admission = store.admission(session.conversation_id()).await.unwrap();
        assert_eq!(admission.active.expect("admission held").run_id, run_id);
        let checkpoint = store.latest_checkpoint(run_id).await.unwrap().unwrap();
        assert_eq!(checkpoint.phase, CheckpointPhase::ModelPending);
        assert_eq!(checkpoint.usage.output_tokens, 5, "the run counts it");

        let outcome = session
            .resume_run(
                run_id,
                RunContext::default(),
                revision,
                ResumePolicy::default(),
            )
            .await
            .unwrap();
        assert_eq!(outcome.final_text, "3");
        let total = (outcome.usage.input_tokens, outcome.usage.output_tokens);
        assert_eq!(total, (20, 10), "both answers' tokens");
    }
}

#[tokio::test]
async fn a_paused_answer_is_continued_with_its_blocks_sent_back() {
    let server_tool = json!({
        "type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search",
        "input": { "query": "turnstile" },
    });
    for stream in [false, true] {
        let server = Server::start(vec![
            Reply::answer(vec![text("Searching."), server_tool.clone()], "pause_turn"),
            Reply::answer(vec![text("Found it.")], "end_turn"),
        ])
        .await;
        let (answer, deltas) =
            respond(&server.model(), &[Message::user("find")], &[], stream).await;
        let answer = answer.unwrap();
        assert_eq!(answer.content.text(), "Searching.Found it.");
        if stream {
            assert_eq!(deltas, "Searching.Found it.");
        }
        assert_eq!(
            (answer.usage.input_tokens, answer.usage.output_tokens),
            (20, 10),
            "both exchanges count"
        );
        let requests = server.requests();
        assert_eq!(requests.len(), 2);
        let continued = &requests[1].body["messages"];
        assert_eq!(continued[1]["role"], "assistant");
        assert_eq!(
            continued[1]["content"][0],
            json!({ "type": "text", "text": "Searching." })
        );
        assert_eq!(continued[1]["content"][1], server_tool);
    }
}
