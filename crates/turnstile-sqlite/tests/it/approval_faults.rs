//! Fault injection at the approval write sites: a SQL trigger makes the
//! site's statement raise. The caller gets the typed store error, the step
//! leaves no partial rows, and once the fault is removed the same call goes
//! through.

use std::sync::Arc;

use sqlx::sqlite::SqlitePoolOptions;
use sqlx::SqlitePool;
use turnstile::store::ApprovalStatus;
use turnstile::{
    Agent, AgentSession, ContextPolicy, ConversationId, Error, Namespace, RequestId, ResumePolicy,
    RunContext, ScriptedModel, ScriptedReply, SqliteStore, Store, Tool, ToolCall, ToolContext,
    ToolError, ToolSpec,
};

const INPUT: &str = "deploy";

struct Deploy;

#[turnstile::async_trait]
impl Tool for Deploy {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "deploy".into(),
            description: "Deploys".into(),
            parameters: serde_json::json!({"type": "object"}),
        }
    }

    async fn call(
        &self,
        _: serde_json::Value,
        _: ToolContext,
    ) -> Result<turnstile::Content, ToolError> {
        Ok("deployed".into())
    }
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
        let script = vec![
            ScriptedReply::tool_calls(vec![ToolCall::new("d1", "deploy", serde_json::json!({}))]),
            ScriptedReply::text("done"),
        ];
        let agent = Agent::new(Arc::new(ScriptedModel::new(script)))
            .with_tool_requiring_approval(Arc::new(Deploy));
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

    async fn execute(&self, sql: &str) {
        sqlx::query(sql).execute(&self.raw).await.unwrap();
    }

    async fn approvals(&self) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM approvals")
            .fetch_one(&self.raw)
            .await
            .unwrap()
    }
}

fn assert_injected<T: std::fmt::Debug>(site: &str, result: Result<T, Error>) {
    match result {
        Err(Error::Store(e)) => assert!(e.message().contains("injected"), "{site}: {e}"),
        other => panic!("{site}: expected the injected store error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_stop_for_approval_that_fails_writes_no_approval_and_the_resumed_run_asks_again() {
    let f = Fixture::new().await;
    f.execute(
        "CREATE TRIGGER fault BEFORE INSERT ON approvals BEGIN SELECT RAISE(ABORT, 'injected'); END",
    )
    .await;
    let request = RequestId::new();
    assert_injected(
        "stop for approval",
        f.session.run(request, INPUT, RunContext::default()).await,
    );
    assert_eq!(f.approvals().await, 0, "a partial stop");
    let admission = f.store.admission(f.conversation).await.unwrap();
    let active = admission.active.expect("the admission stays held");
    // The failed step is recorded as a settled stop: nothing ran.
    let latest = f
        .store
        .latest_checkpoint(active.run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(latest.phase, turnstile::CheckpointPhase::ToolsPending);

    f.execute("DROP TRIGGER fault").await;
    let error = f
        .session
        .resume_run(
            active.run_id,
            RunContext::default(),
            admission.revision,
            ResumePolicy::RejectAmbiguous,
        )
        .await;
    let revision = match error {
        Err(Error::AwaitingApproval {
            revision, pending, ..
        }) => {
            assert_eq!(pending.len(), 1);
            revision
        }
        other => panic!("expected AwaitingApproval, got {other:?}"),
    };
    assert_eq!(f.approvals().await, 1);
    let revision = f.session.approve(request, "d1", revision).await.unwrap();
    let outcome = f
        .session
        .continue_after_approval(request, RunContext::default(), revision)
        .await
        .unwrap();
    assert_eq!(outcome.final_text, "done");
}

#[tokio::test]
async fn a_decision_that_fails_changes_nothing_and_can_be_repeated() {
    let f = Fixture::new().await;
    let request = RequestId::new();
    let revision = match f.session.run(request, INPUT, RunContext::default()).await {
        Err(Error::AwaitingApproval { revision, .. }) => revision,
        other => panic!("expected AwaitingApproval, got {other:?}"),
    };
    for trigger in [
        "CREATE TRIGGER fault BEFORE UPDATE ON approvals BEGIN SELECT RAISE(ABORT, 'injected'); END",
        "CREATE TRIGGER fault BEFORE UPDATE OF revision ON admissions \
         BEGIN SELECT RAISE(ABORT, 'injected'); END",
    ] {
        f.execute(trigger).await;
        assert_injected(trigger, f.session.approve(request, "d1", revision).await);
        let admission = f.store.admission(f.conversation).await.unwrap();
        assert_eq!(admission.revision, revision, "{trigger}");
        let approvals = f.store.approvals(request, 1).await.unwrap();
        assert_eq!(approvals[0].status, ApprovalStatus::Awaiting, "{trigger}");
        assert_eq!(approvals[0].decided_at, None, "{trigger}");
        f.execute("DROP TRIGGER fault").await;
    }
    let revision = f.session.approve(request, "d1", revision).await.unwrap();
    let outcome = f
        .session
        .continue_after_approval(request, RunContext::default(), revision)
        .await
        .unwrap();
    assert_eq!(outcome.final_text, "done");
}
