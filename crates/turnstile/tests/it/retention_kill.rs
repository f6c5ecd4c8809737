//! Retention killed mid-way with SIGKILL, on a real WAL file database:
//! every batch is one transaction, so each request is pruned whole or not
//! at all, every completed request still replays, the held request is
//! untouched, and a later pass finishes the work.
//!
//! The child is this test binary itself, re-run with `--ignored --exact
//! retention_worker`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use turnstile::admin::RetentionPolicy;
use turnstile::{
    Agent, AgentSession, ContextPolicy, ConversationId, Durability, Error, Namespace, RequestId,
    RunContext, ScriptedModel, ScriptedReply, SqliteOptions, SqliteStore, Store, StoreAdmin,
    ToolCall,
};
use turnstile_testkit::tools::Echo;
use turnstile_testkit::{process, worker_test};

const CONVERSATIONS: usize = 12;
const REQUESTS: usize = 100;

fn session(store: Arc<SqliteStore>, conversation: ConversationId) -> AgentSession {
    let script = vec![
        ScriptedReply::tool_calls(vec![ToolCall::new(
            "e",
            "echo",
            serde_json::json!({"text": "echo"}),
        )]),
        ScriptedReply::text("answer"),
    ];
    let agent = Agent::new(Arc::new(ScriptedModel::new(script))).with_tool(Echo::new());
    AgentSession::new(
        agent,
        store,
        conversation,
        Namespace::new("retention").unwrap(),
        ContextPolicy::default(),
    )
}

fn request(c: usize, r: usize) -> RequestId {
    RequestId::from_uuid(uuid::Uuid::from_u128(
        ((c as u128 + 1) << 32) | (r as u128 + 1),
    ))
    .unwrap()
}

fn conversation(c: usize) -> ConversationId {
    ConversationId::from_uuid(uuid::Uuid::from_u128(c as u128 + 1)).unwrap()
}

fn policy() -> RetentionPolicy {
    RetentionPolicy {
        completed_older_than: Some(Duration::ZERO),
        ..RetentionPolicy::default()
    }
}

/// `CONVERSATIONS × REQUESTS` completed one-tool-turn requests, and one
/// request held mid-turn (stopped by its turn budget).
async fn fill(path: &Path) -> RequestId {
    let options = SqliteOptions {
        durability: Durability::Normal,
        ..SqliteOptions::default()
    };
    let store = Arc::new(SqliteStore::open_with(path, options).await.unwrap());
    for c in 0..CONVERSATIONS {
        let session = session(store.clone(), conversation(c));
        for r in 0..REQUESTS {
            session
                .run(request(c, r), &format!("q{r}"), RunContext::default())
                .await
                .unwrap();
        }
    }
    let held = RequestId::new();
    let budget = turnstile::Budget {
        max_turns: Some(1),
        ..turnstile::Budget::default()
    };
    let stopped = session(store.clone(), conversation(CONVERSATIONS))
        .run(held, "held", RunContext::default().with_budget(budget))
        .await;
    assert!(
        matches!(stopped, Err(Error::BudgetExceeded { .. })),
        "{stopped:?}"
    );
    store.close().await.unwrap();
    held
}

/// How many requests are pruned (their tool journal gone), checking each
/// is whole: pruned or not, its record and transcript intact.
async fn pruned(store: &SqliteStore) -> usize {
    let mut pruned = 0;
    for c in 0..CONVERSATIONS {
        assert_eq!(
            store
                .transcript_window(conversation(c), u32::MAX)
                .await
                .unwrap()
                .len(),
            REQUESTS * 4
        );
        for r in 0..REQUESTS {
            let record = store.request(request(c, r)).await.unwrap().unwrap();
            assert!(record.outcome.is_some());
            if store.journal(request(c, r), 1).await.unwrap().is_empty() {
                pruned += 1;
            }
        }
    }
    pruned
}

#[tokio::test]
#[ignore = "child process of the retention kill test"]
async fn retention_worker() {
    let path = std::env::var("RETENTION_DB").unwrap();
    let store = SqliteStore::open(&path).await.unwrap();
    println!("PRUNING");
    store.apply_retention(&policy()).await.unwrap();
    println!("DONE");
    std::future::pending::<()>().await;
}

/// Runs the child and kills it `delay` after it starts pruning; true if it
/// finished first.
fn prune_and_kill(path: &Path, delay: Duration) -> bool {
    let mut child = process::worker(&worker_test!(retention_worker))
        .env("RETENTION_DB", path)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for line in lines.by_ref() {
        if line.unwrap().contains("PRUNING") {
            break;
        }
    }
    std::thread::sleep(delay);
    child.kill().unwrap(); // SIGKILL on unix
    child.wait().unwrap();
    lines.any(|l| l.is_ok_and(|l| l.contains("DONE")))
}

#[tokio::test]
async fn retention_killed_mid_way_prunes_whole_requests_and_a_later_pass_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("retention.db");
    let held = fill(&path).await;
    let total = CONVERSATIONS * REQUESTS;

    let mut partial = 0;
    let mut before = 0;
    // Kills 1 ms, 2 ms, 4 ms … into the pass: whatever the machine's
    // speed, one lands in the pass's second half.
    for attempt in 0..14u32 {
        let finished = prune_and_kill(&path, Duration::from_millis(1 << attempt));
        let store = SqliteStore::open(&path).await.unwrap();
        let now = pruned(&store).await;
        assert!(now >= before, "a committed batch came undone");
        if !finished && now > before && now < total {
            partial += 1;
        }
        before = now;
        // The held request is untouched: it resumes and commits later.
        let admission = store.admission(conversation(CONVERSATIONS)).await.unwrap();
        assert_eq!(admission.active.map(|a| a.request_id), Some(held));
        store.close().await.unwrap();
        if now == total {
            break;
        }
    }
    assert!(
        partial > 0,
        "no kill landed between the first and the last batch"
    );

    let store = Arc::new(SqliteStore::open(&path).await.unwrap());
    store.apply_retention(&policy()).await.unwrap();
    assert_eq!(pruned(&store).await, total);
    // Every completed request replays its stored answer, no model called.
    for c in [0, CONVERSATIONS - 1] {
        let outcome = session(store.clone(), conversation(c))
            .run(request(c, 0), "q0", RunContext::default())
            .await
            .unwrap();
        assert!(outcome.replayed);
        assert_eq!(outcome.final_text, "answer");
    }
    let admission = store.admission(conversation(CONVERSATIONS)).await.unwrap();
    let active = admission.active.unwrap();
    assert_eq!(active.request_id, held);
    assert!(
        !store.journal(held, 1).await.unwrap().is_empty(),
        "an active request is never pruned"
    );
}
