//! Tools from a streamable-HTTP MCP server on loopback (the test kit's
//! Python server, behind a bearer token): listed, called with the call's
//! idempotency key, and a call cut off by the server's death left in doubt,
//! then reconciled over a new connection once the server is back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use turnstile::{
    Agent, AgentSession, ContextPolicy, ConversationId, Error, McpPolicy, McpServer, Namespace,
    RequestId, ResumePolicy, RunContext, ScriptedModel, ScriptedReply, SqliteStore, ToolCall,
};
use turnstile_testkit::mcp::{calls_of, HttpServer};
use turnstile_testkit::session::tool_results;

const TOKEN: &str = "s3cret-token";

fn bearer() -> Vec<(String, String)> {
    vec![("Authorization".into(), format!("Bearer {TOKEN}"))]
}

async fn session(agent: Agent) -> AgentSession {
    AgentSession::new(
        agent,
        Arc::new(SqliteStore::in_memory().await.unwrap()),
        ConversationId::new(),
        Namespace::new("mcp-http").unwrap(),
        ContextPolicy::default(),
    )
}

#[tokio::test]
async fn an_http_server_is_reached_with_its_headers_and_calls_carry_their_key() {
    let dir = tempfile::tempdir().unwrap();
    let effects = dir.path().join("effects.log");
    let http = HttpServer::start(&effects, Some(TOKEN), true);

    // Without the token the server answers 401: refused at connect, the
    // token never quoted.
    let refused = McpServer::http("remote", &http.url, &[]).await.unwrap_err();
    assert!(refused.to_string().contains("remote"), "{refused}");
    let wrong = vec![("Authorization".to_owned(), "Bearer wrong".to_owned())];
    let refused = McpServer::http("remote", &http.url, &wrong)
        .await
        .unwrap_err();
    assert!(!refused.to_string().contains("wrong"), "{refused}");
    let bad = vec![("Bad Header".to_owned(), "x".to_owned())];
    assert!(McpServer::http("remote", &http.url, &bad).await.is_err());

    let server = McpServer::http("remote", &http.url, &bearer())
        .await
        .unwrap();
    assert!(server.reconciles());
    assert!(server.tools().iter().any(|t| t.name == "lookup"));
    assert!(server
        .tools()
        .iter()
        .all(|t| t.name != "turnstile_reconcile"));

    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedReply::tool_calls(vec![ToolCall::new("l1", "lookup", json!({ "key": "k" }))]),
        ScriptedReply::text("looked up"),
    ]));
    let session = session(
        server
            .add_to(Agent::new(model), &McpPolicy::default())
            .unwrap(),
    )
    .await;
    let request = RequestId::new();
    let outcome = session
        .run(request, "look it up", RunContext::default())
        .await
        .unwrap();
    assert_eq!(outcome.final_text, "looked up");
    assert_eq!(
        calls_of(&effects, "lookup"),
        [(format!("{request}/1/l1"), r#"{"key":"k"}"#.to_owned())]
    );
}

#[tokio::test]
async fn an_http_server_killed_mid_call_leaves_it_in_doubt_and_reconciles_it_once_back() {
    let dir = tempfile::tempdir().unwrap();
    let effects = dir.path().join("effects.log");
    let mut http = HttpServer::start(&effects, Some(TOKEN), true);
    let server = McpServer::http("remote", &http.url, &bearer())
        .await
        .unwrap();
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedReply::tool_calls(vec![ToolCall::new(
            "d1",
            "delete_file",
            json!({ "path": "/tmp/x", "hold": 30 }),
        )]),
        ScriptedReply::text("deleted"),
    ]));
    let policy = McpPolicy::default().without_approval("delete_file");
    let session = Arc::new(session(server.add_to(Agent::new(model), &policy).unwrap()).await);
    let request = RequestId::new();
    let running = {
        let session = session.clone();
        tokio::spawn(async move {
            session
                .run(request, "delete it", RunContext::default())
                .await
        })
    };
    let waited = Instant::now();
    while calls_of(&effects, "delete_file").is_empty() {
        assert!(waited.elapsed() < Duration::from_secs(60), "never called");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    http.kill();
    let stopped = tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the run stops once its server is gone")
        .unwrap();
    match &stopped {
        Err(Error::ToolInDoubt { call, .. }) => assert_eq!(call.call_id, "d1"),
        other => panic!("expected ToolInDoubt, got {other:?}"),
    }

    // The server is back: the recovery reconnects, asks it, and journals
    // its answer without calling the tool again.
    http.restart();
    let revision = session.admission().await.unwrap().revision;
    let outcome = session
        .recover_after_owner_exit(
            request,
            "delete it",
            RunContext::default(),
            revision,
            ResumePolicy::RejectAmbiguous,
        )
        .await
        .unwrap();
    assert_eq!(outcome.final_text, "deleted");
    let answer = tool_results(&outcome.messages).remove(0).1;
    assert_eq!(answer, "deleted /tmp/x");
    assert_eq!(calls_of(&effects, "delete_file").len(), 1, "it ran once");
}
