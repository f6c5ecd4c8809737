//! A delete killed with SIGKILL at growing delays, on a real WAL file
//! database: the delete is one transaction, so afterwards the conversation
//! is either wholly there (every request replays) or wholly gone with its
//! tombstones (its id, request ids and run ids answer `Deleted`), and the
//! file passes the integrity check `doctor` runs. Its inputs carry an image
//! of their own and one the neighbouring conversation also sends: the
//! stored images are all there, or only the shared one, never a reference
//! without its bytes or bytes without a reference. The space given back after
//! the commit (incremental vacuum, WAL checkpoint) may be cut short too.
//!
//! The child is this test binary itself, re-run with `--ignored --exact
//! delete_worker`; each attempt deletes from a fresh copy of one filled file.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use turnstile::{
    Agent, AgentSession, Attachment, Content, ContextPolicy, ConversationId, Durability, Error,
    Namespace, Part, RequestId, RunContext, RunId, ScriptedModel, ScriptedReply, SqliteOptions,
    SqliteStore, Store, StoreAdmin, Tool, ToolCall, ToolContext, ToolError, ToolSpec,
};
use turnstile_testkit::{process, worker_test};

const REQUESTS: usize = 300;

/// Returns a kilobyte, so the conversation takes many pages.
struct Bulky;

#[turnstile::async_trait]
impl Tool for Bulky {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "bulky".into(),
            description: "Returns a kilobyte".into(),
            parameters: serde_json::json!({"type": "object"}),
        }
    }

    async fn call(
        &self,
        _: serde_json::Value,
        _: ToolContext,
    ) -> Result<turnstile::Content, ToolError> {
        Ok("b".repeat(1024).into())
    }
}

fn namespace() -> Namespace {
    Namespace::new("deletion").unwrap()
}

fn session(store: Arc<SqliteStore>, conversation: ConversationId) -> AgentSession {
    let script = vec![
        ScriptedReply::tool_calls(vec![ToolCall::new("b", "bulky", serde_json::json!({}))]),
        ScriptedReply::text("answer"),
    ];
    let agent = Agent::new(Arc::new(ScriptedModel::new(script))).with_tool(Arc::new(Bulky));
    AgentSession::new(
        agent,
        store,
        conversation,
        namespace(),
        ContextPolicy::default(),
    )
}

/// The deleted conversation (`0`) and one beside it (`1`).
fn conversation(c: u128) -> ConversationId {
    ConversationId::from_uuid(uuid::Uuid::from_u128(c + 1)).unwrap()
}

fn request(c: u128, r: usize) -> RequestId {
    RequestId::from_uuid(uuid::Uuid::from_u128(((c + 1) << 32) | (r as u128 + 1))).unwrap()
}

/// The image both conversations send.
fn shared_image() -> Attachment {
    Attachment::new("image/png", vec![42u8; 4096]).unwrap()
}

/// Request `r` of conversation `c`: text, the shared image and, in the
/// deleted conversation, an image of its own.
fn input(c: u128, r: usize) -> Content {
    let mut parts = vec![
        Part::text(format!("q{r} {}", "x".repeat(1024))),
        Part::Image(shared_image()),
    ];
    if c == 0 {
        let own = format!("the image of request {r}").into_bytes();
        parts.push(Part::Image(Attachment::new("image/png", own).unwrap()));
    }
    Content::new(parts)
}

/// `REQUESTS` completed requests in conversation 0, one in conversation 1;
/// the run ids of conversation 0's first and last requests.
async fn fill(path: &Path) -> [RunId; 2] {
    let options = SqliteOptions {
        durability: Durability::Normal,
        ..SqliteOptions::default()
    };
    let store = Arc::new(SqliteStore::open_with(path, options).await.unwrap());
    let deleted = session(store.clone(), conversation(0));
    let mut runs = Vec::new();
    for r in 0..REQUESTS {
        let outcome = deleted
            .run(request(0, r), input(0, r), RunContext::default())
            .await
            .unwrap();
        runs.push(outcome.run_id);
    }
    session(store.clone(), conversation(1))
        .run(request(1, 0), input(1, 0), RunContext::default())
        .await
        .unwrap();
    store.close().await.unwrap();
    [runs[0], runs[REQUESTS - 1]]
}

#[tokio::test]
#[ignore = "child process of the delete kill test"]
async fn delete_worker() {
    let path = std::env::var("DELETE_DB").unwrap();
    let store = SqliteStore::open(&path).await.unwrap();
    println!("DELETING");
    store
        .delete_conversation(&namespace(), conversation(0), REQUESTS as u64, None)
        .await
        .unwrap();
    println!("DELETED");
    std::future::pending::<()>().await;
}

/// Runs the child on `path` and kills it `delay` after it starts deleting.
fn delete_and_kill(path: &Path, delay: Duration) {
    let mut child = process::worker(&worker_test!(delete_worker))
        .env("DELETE_DB", path)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let started = lines.any(|l| l.is_ok_and(|l| l.contains("DELETING")));
    assert!(started, "the worker started deleting");
    std::thread::sleep(delay);
    child.kill().unwrap(); // SIGKILL on unix
    child.wait().unwrap();
}

/// What a killed delete left.
#[derive(Debug, PartialEq, Eq)]
enum Left {
    Whole,
    Gone,
}

/// Checks the file after a kill: healthy, the neighbour intact, and
/// conversation 0 wholly there or wholly gone.
async fn inspect(path: &Path, runs: [RunId; 2]) -> Left {
    let store = Arc::new(SqliteStore::open(path).await.unwrap());
    let doctor = store.doctor(Duration::from_secs(300)).await.unwrap();
    assert_eq!(doctor.integrity_ok, Some(true), "{:?}", doctor.integrity);
    let replay = |c, r| {
        let session = session(store.clone(), conversation(c));
        async move {
            session
                .run(request(c, r), input(c, r), RunContext::default())
                .await
        }
    };
    assert!(
        replay(1, 0).await.unwrap().replayed,
        "the neighbour replays"
    );
    let shared = store.blob(shared_image().sha256()).await.unwrap();
    assert_eq!(
        shared.as_deref(),
        Some(&[42u8; 4096][..]),
        "the shared image"
    );

    let left = match store.conversation(&namespace(), conversation(0)).await {
        Ok(found) => {
            assert_eq!(found.version, REQUESTS as u64);
            let transcript = store
                .transcript_window(conversation(0), u32::MAX)
                .await
                .unwrap();
            assert_eq!(transcript.len(), REQUESTS * 4);
            for r in [0, REQUESTS / 2, REQUESTS - 1] {
                let outcome = replay(0, r).await.unwrap();
                assert!(outcome.replayed && outcome.final_text == "answer");
            }
            for run in runs {
                assert!(store.run(run).await.unwrap().is_some());
            }
            assert_eq!(doctor.blobs, Some(REQUESTS as u64 + 1), "every image");
            Left::Whole
        }
        Err(Error::Deleted { conversation_id }) => {
            assert_eq!(conversation_id, conversation(0));
            for r in [0, REQUESTS / 2, REQUESTS - 1] {
                assert_eq!(store.request(request(0, r)).await.unwrap(), None);
                let retried = replay(0, r).await;
                assert!(matches!(retried, Err(Error::Deleted { .. })), "{retried:?}");
            }
            for run in runs {
                let found = store.run(run).await;
                assert!(matches!(found, Err(Error::Deleted { .. })), "{found:?}");
            }
            let transcript = store
                .transcript_window(conversation(0), u32::MAX)
                .await
                .unwrap();
            assert!(transcript.is_empty());
            assert_eq!(doctor.blobs, Some(1), "only the neighbour's image");
            Left::Gone
        }
        Err(other) => panic!("neither whole nor gone: {other:?}"),
    };
    store.close().await.unwrap();
    left
}

#[tokio::test]
async fn a_delete_killed_at_any_point_leaves_the_conversation_whole_or_gone_and_the_file_healthy() {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("filled.db");
    let runs = fill(&template).await;
    assert!(!dir.path().join("filled.db-wal").exists());
    let mut seen = Vec::new();
    for attempt in 0..12u64 {
        let path = dir.path().join(format!("attempt-{attempt}.db"));
        // Closed, the template is one file (its WAL folded in on close).
        std::fs::copy(&template, &path).unwrap();
        // 0 ms, then growing steps; the last ones outlast the delete.
        delete_and_kill(&path, Duration::from_millis(attempt * attempt * 8));
        seen.push(inspect(&path, runs).await);
    }
    assert!(
        seen.contains(&Left::Whole) && seen.contains(&Left::Gone),
        "the kills landed on both sides of the commit: {seen:?}"
    );
}
