//! Fault injection at every write site of a request: a SQL trigger makes the
//! site's statement raise. Each time the caller gets a typed error, the
//! failed step leaves no partial rows, the admission is held (or, for the
//! claim, unchanged), and once the fault is removed the request recovers and
//! commits with a well-formed transcript.

use std::sync::Arc;

use sqlx::sqlite::SqlitePoolOptions;
use sqlx::SqlitePool;
use turnstile::store::RequestStatus;
use turnstile::{
    Agent, AgentSession, ContextPolicy, ConversationId, Error, Message, Namespace, RequestId,
    ResumePolicy, RunContext, ScriptedModel, ScriptedReply, SqliteStore, Store, ToolCall,
};
use turnstile_testkit::tools::Echo;

const INPUT: &str = "echo twice";

fn script() -> Vec<ScriptedReply> {
    let echo = |id: &str| ToolCall::new(id, "echo", serde_json::json!({ "text": id }));
    vec![
        ScriptedReply::tool_calls(vec![echo("a")]),
        ScriptedReply::tool_calls(vec![echo("b")]),
        ScriptedReply::text("done"),
    ]
}

struct Fixture {
    _dir: tempfile::TempDir,
    store: Arc<SqliteStore>,
    raw: SqlitePool,
    session: AgentSession,
    conversation: ConversationId,
}

impl Fixture {
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("faults.db");
        let store = Arc::new(SqliteStore::open(&path).await.unwrap());
        let raw = SqlitePoolOptions::new()
            .max_connections(1)
            .connect(&format!("sqlite:{}", path.display()))
            .await
            .unwrap();
        let conversation = ConversationId::new();
        let agent = Agent::new(Arc::new(ScriptedModel::new(script()))).with_tool(Echo::new());
        let session = AgentSession::new(
            agent,
            store.clone(),
            conversation,
            Namespace::new("faults").unwrap(),
            ContextPolicy::default(),
        );
        Self {
            _dir: dir,
            store,
            raw,
            session,
            conversation,
        }
    }

    async fn inject(&self, trigger: &str) {
        sqlx::query(trigger).execute(&self.raw).await.unwrap();
    }

    async fn heal(&self) {
        sqlx::query("DROP TRIGGER fault")
            .execute(&self.raw)
            .await
            .unwrap();
    }

    async fn count(&self, table: &str) -> i64 {
        // Table names come from this file, never from input.
        sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
            .fetch_one(&self.raw)
            .await
            .unwrap()
    }

    async fn counts(&self) -> Vec<i64> {
        let mut counts = Vec::new();
        for table in [
            "requests",
            "runs",
            "run_messages",
            "loop_checkpoints",
            "tool_calls",
            "transcript",
        ] {
            counts.push(self.count(table).await);
        }
        counts
    }
}

/// Every tool call answered once, right after its call.
fn assert_well_formed(messages: &[Message]) {
    let mut open: Vec<&str> = Vec::new();
    for message in messages {
        match message {
            Message::Tool { call_id, .. } => {
                let at = open
                    .iter()
                    .position(|c| c == call_id)
                    .expect("orphan result");
                open.remove(at);
            }
            other => {
                assert!(open.is_empty(), "unanswered {open:?}");
                open = other.tool_calls().iter().map(|c| c.id.as_str()).collect();
            }
        }
    }
    assert!(open.is_empty(), "unanswered {open:?}");
}

fn assert_store_error<T: std::fmt::Debug>(site: &str, result: Result<T, Error>) {
    match result {
        Err(Error::Store(e)) => assert!(e.message().contains("injected"), "{site}: {e}"),
        other => panic!("{site}: expected the injected store error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_failing_claim_changes_nothing_and_the_retry_runs() {
    let f = Fixture::new().await;
    f.inject(
        "CREATE TRIGGER fault BEFORE INSERT ON requests BEGIN SELECT RAISE(ABORT, 'injected'); END",
    )
    .await;
    let request = RequestId::new();
    let before = f.counts().await;
    assert_store_error(
        "claim",
        f.session.run(request, INPUT, RunContext::default()).await,
    );
    assert_eq!(
        f.counts().await,
        before,
        "partial rows after a failed claim"
    );
    let admission = f.store.admission(f.conversation).await.unwrap();
    assert!(admission.active.is_none());

    f.heal().await;
    let outcome = f
        .session
        .run(request, INPUT, RunContext::default())
        .await
        .unwrap();
    assert_eq!(outcome.final_text, "done");
    assert_well_formed(&outcome.messages);
}

/// Each site after the claim: the run fails with the injected error, the
/// failed transaction leaves nothing, the admission stays held, and after
/// the fault is removed recovery finishes the request.
#[tokio::test]
async fn every_write_site_after_the_claim_fails_cleanly_and_recovers() {
    let sites = [
        (
            "turn write-ahead",
            // the run's latest checkpoint is in its request's row
            "CREATE TRIGGER fault BEFORE UPDATE OF checkpoint_phase ON requests WHEN NEW.turn = 2 \
             BEGIN SELECT RAISE(ABORT, 'injected'); END",
        ),
        (
            "model answer and journal",
            "CREATE TRIGGER fault BEFORE INSERT ON tool_calls WHEN NEW.turn = 2 \
             BEGIN SELECT RAISE(ABORT, 'injected'); END",
        ),
        (
            "tool result",
            "CREATE TRIGGER fault BEFORE UPDATE OF status ON tool_calls WHEN NEW.turn = 2 \
             BEGIN SELECT RAISE(ABORT, 'injected'); END",
        ),
        (
            "turn checkpoint",
            "CREATE TRIGGER fault BEFORE INSERT ON first_run_checkpoints \
             WHEN NEW.turn = 2 AND NEW.phase = 'ready' \
             BEGIN SELECT RAISE(ABORT, 'injected'); END",
        ),
        (
            "commit",
            "CREATE TRIGGER fault BEFORE UPDATE OF transcript_length ON conversations \
             BEGIN SELECT RAISE(ABORT, 'injected'); END",
        ),
        (
            "release",
            "CREATE TRIGGER fault BEFORE UPDATE ON admissions \
             WHEN NEW.active_request_id IS NULL AND OLD.active_request_id IS NOT NULL \
             BEGIN SELECT RAISE(ABORT, 'injected'); END",
        ),
    ];
    for (site, trigger) in sites {
        let f = Fixture::new().await;
        f.inject(trigger).await;
        let request = RequestId::new();
        assert_store_error(
            site,
            f.session.run(request, INPUT, RunContext::default()).await,
        );
        let admission = f.store.admission(f.conversation).await.unwrap();
        let active = admission.active.clone().expect("admission held");
        assert_eq!(active.request_id, request, "{site}");
        let committed = f
            .store
            .transcript_window(f.conversation, 100)
            .await
            .unwrap();
        assert!(committed.is_empty(), "{site}: partial commit");
        let status = f.store.request(request).await.unwrap().unwrap().status;
        assert_eq!(status, RequestStatus::Active, "{site}");
        // The failed step wrote nothing: pending messages are whole turns
        // (the input, then assistant + result pairs, plus at most a
        // recorded answer whose results are still journaled).
        let pending = f
            .store
            .request_messages(request, u64::MAX >> 1)
            .await
            .unwrap();
        assert!(
            pending.len() <= 5,
            "{site}: {} pending messages",
            pending.len()
        );

        f.heal().await;
        let outcome = f
            .session
            .recover_after_owner_exit(
                request,
                INPUT,
                RunContext::default(),
                admission.revision,
                ResumePolicy::RetryInterruptedTurn,
            )
            .await
            .unwrap_or_else(|e| panic!("{site}: recovery failed: {e:?}"));
        assert_eq!(outcome.final_text, "done", "{site}");
        assert_eq!(outcome.tool_calls, 2, "{site}");
        assert_well_formed(&outcome.messages);
        assert_eq!(outcome.messages.len(), 6, "{site}");
        let admission = f.store.admission(f.conversation).await.unwrap();
        assert!(admission.active.is_none(), "{site}");
    }
}

#[tokio::test]
async fn a_failing_abandon_keeps_the_request_and_can_be_repeated() {
    let f = Fixture::new().await;
    // Stop the request after its first turn with a turn budget.
    let ctx = RunContext::default().with_budget(turnstile::Budget {
        max_turns: Some(1),
        ..Default::default()
    });
    let request = RequestId::new();
    let stopped = f.session.run(request, INPUT, ctx).await.unwrap_err();
    let (_, revision) = stopped.stopped_run().expect("a stopped run");
    f.inject(
        "CREATE TRIGGER fault BEFORE UPDATE OF state ON requests \
         WHEN NEW.status = 'abandoned' BEGIN SELECT RAISE(ABORT, 'injected'); END",
    )
    .await;
    let before = f.counts().await;
    assert_store_error("abandon", f.session.abandon(request, revision).await);
    assert_eq!(f.counts().await, before);
    let admission = f.store.admission(f.conversation).await.unwrap();
    assert_eq!(admission.revision, revision, "the admission moved");
    assert_eq!(admission.active.unwrap().request_id, request);

    f.heal().await;
    f.session.abandon(request, revision).await.unwrap();
    let status = f.store.request(request).await.unwrap().unwrap().status;
    assert_eq!(status, RequestStatus::Abandoned);
}
