//! Recovery after the owner of a request is gone. The first "process" runs
//! a request whose model fails after a tool turn: the admission stays held
//! with its checkpoints. A second "process" opens the same database file,
//! reads where the request stands, restores its budget from
//! `recovery_usage` and finishes it with `recover_after_owner_exit`; the
//! tool that already ran is not run again. A retry of the request then
//! replays the stored answer.
//!
//! `cargo run -p turnstile --example recover_after_crash`

use std::sync::Arc;

use serde_json::json;
use turnstile::{
    async_trait, Agent, AgentSession, Content, ContextPolicy, ConversationId, Error, Namespace,
    RequestId, ResumePolicy, RunContext, ScriptedModel, ScriptedReply, SqliteStore, Tool, ToolCall,
    ToolContext, ToolError, ToolSpec, Usage,
};

/// A tool with an effect: it prints each time it really runs.
struct Charge;

#[async_trait]
impl Tool for Charge {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "charge".into(),
            description: "Charges a card".into(),
            parameters: json!({"type": "object", "properties": {"cents": {"type": "integer"}}}),
        }
    }

    async fn call(&self, args: serde_json::Value, ctx: ToolContext) -> Result<Content, ToolError> {
        println!(
            "  charge {} cents (key {})",
            args["cents"], ctx.idempotency_key
        );
        Ok("charged".into())
    }
}

fn session(store: Arc<SqliteStore>, conversation: ConversationId, fail: bool) -> AgentSession {
    let usage = Usage {
        input_tokens: 10,
        output_tokens: 5,
        ..Usage::default()
    };
    let answer = ScriptedReply::text("Your card was charged.").with_usage(usage);
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedReply::tool_calls(vec![ToolCall::new("c1", "charge", json!({"cents": 500}))])
            .with_usage(usage),
        if fail {
            answer.failing_first(1, "the model server went away")
        } else {
            answer
        },
    ]));
    AgentSession::new(
        Agent::new(model).with_tool(Arc::new(Charge)),
        store,
        conversation,
        Namespace::new("examples").expect("valid namespace"),
        ContextPolicy::default(),
    )
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("agents.db");
    let conversation = ConversationId::new();
    let request = RequestId::new();
    let input = "charge my card 5 dollars";

    println!("first process:");
    let store = Arc::new(SqliteStore::open(&path).await?);
    let stopped = session(store.clone(), conversation, true)
        .run(request, input, RunContext::default())
        .await;
    match stopped {
        Err(error @ Error::Model { .. }) => println!("  stopped: {error}"),
        other => return Err(format!("expected a model failure, got {other:?}").into()),
    }
    store.close().await?;

    println!("second process:");
    let store = Arc::new(SqliteStore::open(&path).await?);
    let session = session(store, conversation, false);
    let admission = session.admission().await?;
    let held = admission
        .active
        .as_ref()
        .ok_or("the admission should be held")?;
    println!(
        "  held by request {} (run {}) at revision {}, last checkpoint {:?}",
        held.request_id,
        held.run_id,
        admission.revision,
        held.checkpoint.as_ref().map(|c| (c.turn, c.phase.as_str()))
    );
    // What was spent already: the host restores its budget from it.
    let spent = session.recovery_usage(request).await?;
    println!("  already spent {} tokens", spent.total());
    let outcome = session
        .recover_after_owner_exit(
            request,
            input,
            RunContext::default(),
            admission.revision,
            ResumePolicy::default(),
        )
        .await?;
    println!(
        "  committed: {:?} ({} tokens in all)",
        outcome.final_text,
        outcome.usage.total()
    );

    let again = session.run(request, input, RunContext::default()).await?;
    println!("retry: replayed = {}", again.replayed);
    Ok(())
}
