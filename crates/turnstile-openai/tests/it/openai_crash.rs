//! A Gemini-through-OpenAI run killed with SIGKILL while the model call
//! after its tool round is in flight, recovered by another process: the
//! call's thought signature and the answer's unknown members go back byte
//! for byte from the database (the fixture refuses a signature a byte
//! off), and the tool does not run again.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use turnstile::{
    Agent, AgentSession, ContextPolicy, ConversationId, Namespace, RequestId, ResumePolicy,
    RunContext, SqliteStore, Store,
};
use turnstile_testkit::process::{signal, worker};
use turnstile_testkit::tools::{effects, Effect};
use turnstile_testkit::worker_test;

use crate::openai_metadata::gemini_call_with;
use crate::support::*;

const DB: &str = "TURNSTILE_GEMINI_CRASH_DB";
const BASE_URL: &str = "TURNSTILE_GEMINI_CRASH_URL";
const CONVERSATION: &str = "TURNSTILE_GEMINI_CRASH_CONVERSATION";
const REQUEST: &str = "TURNSTILE_GEMINI_CRASH_REQUEST";
const MODE: &str = "TURNSTILE_GEMINI_CRASH_MODE";
const INPUT: &str = "2 + 3?";
const SIGNATURE: &str = r#""extra_content":{"google":{"thought_signature":"Q3Jhc2g\u00e9=="}}"#;

#[tokio::test]
async fn thought_signatures_go_back_exactly_after_sigkill_and_recovery_elsewhere() {
    let hang = Reply::Raw {
        status: StatusCode::OK,
        content_type: "application/json",
        headers: Vec::new(),
        chunks: Vec::new(),
        delay: Duration::from_secs(3600),
        gap: Duration::ZERO,
    };
    let server = Server::start(vec![
        gemini_call_with("call_crash", SIGNATURE),
        hang,
        text_completion("5", 5, 1),
    ])
    .await;
    server.require_signature("call_crash", "Q3Jhc2gé==");
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("crash.db");
    let conversation = ConversationId::new();
    let request = RequestId::new();
    let spawn = |mode: &str| {
        worker(&worker_test!(gemini_crash_worker))
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
    let started = std::time::Instant::now();
    while server.raw_bodies().len() < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no second call"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    signal(&running, "-KILL");
    assert!(!running.wait().unwrap().success());

    let mut recovering = spawn("recover");
    let status = tokio::task::spawn_blocking(move || recovering.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "the recovery failed");

    let bodies = server.raw_bodies();
    assert_eq!(bodies.len(), 3);
    assert!(bodies[2].contains(SIGNATURE), "{}", bodies[2]);
    assert_eq!(effects(&dir.path().join("effects.log"), "call_crash"), 1);
    let store = SqliteStore::open(&db).await.unwrap();
    assert!(store
        .admission(conversation)
        .await
        .unwrap()
        .active
        .is_none());
}

/// The worker: runs the request (`run`, killed in its second model call)
/// or recovers it (`recover`).
#[tokio::test]
#[ignore = "a worker process of the test above"]
async fn gemini_crash_worker() {
    let var = |name: &str| std::env::var(name).unwrap();
    let db = var(DB);
    let log = Path::new(&db).with_file_name("effects.log");
    let config = turnstile::OpenAiConfig::new(var(BASE_URL), "gemini-test").with_api_key(KEY);
    let model = Arc::new(turnstile::OpenAiModel::new(config).unwrap());
    let store = Arc::new(SqliteStore::open(&db).await.unwrap());
    let session = AgentSession::new(
        Agent::new(model).with_tool(Arc::new(Effect::new("add", &log))),
        store.clone(),
        var(CONVERSATION).parse::<ConversationId>().unwrap(),
        Namespace::new("openai-test").unwrap(),
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
    assert_eq!(outcome.unwrap().final_text, "5");
}
