//! A run killed with SIGKILL while the model call after its tool round is
//! in flight, recovered by another process: the signed thinking block and
//! the redacted one that came with the tool call go back byte for byte
//! from the database (the fake refuses them off by one byte), and the tool
//! does not run again.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;

use serde_json::json;
use turnstile::{
    Agent, AgentSession, ContextPolicy, ConversationId, Namespace, RequestId, ResumePolicy,
    RunContext, SqliteStore, Store,
};
use turnstile_testkit::process::{signal, worker};
use turnstile_testkit::tools::{effects, Effect};
use turnstile_testkit::worker_test;

use crate::support::*;

const DB: &str = "TURNSTILE_ANTHROPIC_CRASH_DB";
const BASE_URL: &str = "TURNSTILE_ANTHROPIC_CRASH_URL";
const CONVERSATION: &str = "TURNSTILE_ANTHROPIC_CRASH_CONVERSATION";
const REQUEST: &str = "TURNSTILE_ANTHROPIC_CRASH_REQUEST";
const MODE: &str = "TURNSTILE_ANTHROPIC_CRASH_MODE";
const INPUT: &str = "add 1 and 2";

#[tokio::test]
async fn signed_thinking_goes_back_exactly_after_sigkill_and_recovery_elsewhere() {
    let first_answer = vec![
        thinking("Adding needs the tool; sum of 1 and 2 ✓."),
        json!({ "type": "redacted_thinking", "data": "RedactedAfterCrash==" }),
        tool_use("toolu_crash", "add", r#"{"a": 1, "b": 2}"#),
    ];
    let server = Server::start(vec![
        Reply::answer(first_answer.clone(), "tool_use"),
        Reply::Hang,
        Reply::answer(vec![text("3")], "end_turn"),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("crash.db");
    let conversation = ConversationId::new();
    let request = RequestId::new();
    let spawn = |mode: &str| {
        worker(&worker_test!(crash_worker))
            .env(DB, &db)
            .env(BASE_URL, &server.base_url)
            .env(CONVERSATION, conversation.to_string())
            .env(REQUEST, request.to_string())
            .env(MODE, mode)
            .stdout(Stdio::null())
            .spawn()
            .unwrap()
    };

    let mut running = spawn("run");
    server.until_requests(2).await;
    signal(&running, "-KILL");
    assert!(!running.wait().unwrap().success());

    let mut recovering = spawn("recover");
    let status = tokio::task::spawn_blocking(move || recovering.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "the recovery failed");

    assert_eq!(server.refused(), Vec::<String>::new());
    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    let answer = &requests[2].body["messages"][1];
    assert_eq!(answer["content"][0], first_answer[0]);
    assert_eq!(answer["content"][1], first_answer[1]);
    assert!(requests[2].raw.contains(r#""input":{"a": 1, "b": 2}"#));
    assert_eq!(effects(&dir.path().join("effects.log"), "toolu_crash"), 1);

    let store = SqliteStore::open(&db).await.unwrap();
    let admission = store.admission(conversation).await.unwrap();
    assert!(admission.active.is_none(), "the request committed");
}

/// The worker: runs the request (`run`, killed in its second model call)
/// or recovers it (`recover`).
#[tokio::test]
#[ignore = "a worker process of the test above"]
async fn crash_worker() {
    let var = |name: &str| std::env::var(name).unwrap();
    let db = var(DB);
    let log = Path::new(&db).with_file_name("effects.log");
    let config = turnstile::AnthropicConfig::new("claude-test")
        .with_base_url(var(BASE_URL))
        .with_api_key(KEY)
        .with_thinking_budget(2048);
    let model = Arc::new(turnstile::AnthropicModel::new(config).unwrap());
    let store = Arc::new(SqliteStore::open(&db).await.unwrap());
    let session = AgentSession::new(
        Agent::new(model).with_tool(Arc::new(Effect::new("add", &log))),
        store.clone(),
        var(CONVERSATION).parse::<ConversationId>().unwrap(),
        Namespace::new("anthropic-test").unwrap(),
        ContextPolicy::default(),
    );
    let request = var(REQUEST).parse::<RequestId>().unwrap();
    let outcome = match var(MODE).as_str() {
        "run" => session.run(request, INPUT, RunContext::default()).await,
        _ => {
            let revision = store
                .admission(session.conversation_id())
                .await
                .unwrap()
                .revision;
            session
                .recover_after_owner_exit(
                    request,
                    INPUT,
                    RunContext::default(),
                    revision,
                    // The killed turn was in flight: its journaled tool
                    // result is reused, the model asked again.
                    ResumePolicy::RetryInterruptedTurn,
                )
                .await
        }
    };
    assert_eq!(outcome.unwrap().final_text, "3");
}
