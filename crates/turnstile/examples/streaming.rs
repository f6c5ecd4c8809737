//! The events of a request as they become durable: run started, each
//! turn, model answer, tool call and checkpoint, and last the commit.
//!
//! `cargo run -p turnstile --example streaming`

use std::sync::Arc;

use futures_util::StreamExt;
use serde_json::json;
use turnstile::{
    async_trait, Agent, AgentSession, Content, ContextPolicy, ConversationId, Event, Namespace,
    RequestId, RunContext, ScriptedModel, ScriptedReply, SqliteStore, Tool, ToolCall, ToolContext,
    ToolError, ToolSpec,
};

struct Clock;

#[async_trait]
impl Tool for Clock {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "clock".into(),
            description: "The time".into(),
            parameters: json!({"type": "object", "properties": {}}),
        }
    }

    async fn call(&self, _: serde_json::Value, _: ToolContext) -> Result<Content, ToolError> {
        Ok("12:00".into())
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), turnstile::Error> {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedReply::tool_calls(vec![ToolCall::new("c1", "clock", json!({}))]),
        ScriptedReply::text("It is noon."),
    ]));
    let session = AgentSession::new(
        Agent::new(model).with_tool(Arc::new(Clock)),
        Arc::new(SqliteStore::in_memory().await?),
        ConversationId::new(),
        Namespace::new("examples")?,
        ContextPolicy::default(),
    );
    // An `EventStream` is boxed and pinned: `StreamExt::next` works as is.
    let mut events = session.stream(RequestId::new(), "what time is it?", RunContext::default());
    while let Some(event) = events.next().await {
        match event? {
            Event::ConversationCommitted { outcome, .. } => {
                println!("committed: {}", outcome.final_text)
            }
            other => println!("{other:?}"),
        }
    }
    Ok(())
}
