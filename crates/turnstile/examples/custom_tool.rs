//! A tool of your own: a word counter the scripted model calls once, then
//! the answer. The tool gets a stable idempotency key (unchanged across
//! resumes) to pass to services that deduplicate.
//!
//! `cargo run -p turnstile --example custom_tool`

use std::sync::Arc;

use serde_json::json;
use turnstile::{
    async_trait, Agent, AgentSession, Content, ContextPolicy, ConversationId, Namespace, RequestId,
    RunContext, ScriptedModel, ScriptedReply, SqliteStore, Tool, ToolCall, ToolContext, ToolError,
    ToolSpec,
};

struct WordCount;

#[async_trait]
impl Tool for WordCount {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "word_count".into(),
            description: "Counts the words of a text".into(),
            parameters: json!({
                "type": "object",
                "properties": { "text": { "type": "string" } },
                "required": ["text"]
            }),
        }
    }

    async fn call(&self, args: serde_json::Value, ctx: ToolContext) -> Result<Content, ToolError> {
        let text = args["text"]
            .as_str()
            .ok_or_else(|| ToolError::new("text must be a string"))?;
        println!("word_count runs once, key {}", ctx.idempotency_key);
        Ok(text.split_whitespace().count().to_string().into())
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), turnstile::Error> {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedReply::tool_calls(vec![ToolCall::new(
            "c1",
            "word_count",
            json!({"text": "durable agents do not lose work"}),
        )]),
        ScriptedReply::text("That is six words."),
    ]));
    let agent = Agent::new(model).with_tool(Arc::new(WordCount));
    let store = Arc::new(SqliteStore::in_memory().await?);
    let session = AgentSession::new(
        agent,
        store,
        ConversationId::new(),
        Namespace::new("examples")?,
        ContextPolicy::default(),
    );
    let outcome = session
        .run(RequestId::new(), "how many words?", RunContext::default())
        .await?;
    println!(
        "{} ({} turns, {} tool call)",
        outcome.final_text, outcome.turns, outcome.tool_calls
    );
    Ok(())
}
