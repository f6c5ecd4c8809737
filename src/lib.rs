//! turnstile: durable LLM agent conversations on SQLite.
//!
//! Every request is **admitted** to its conversation exclusively before any
//! model or tool work; the agent loop saves a **loop checkpoint** after every
//! turn as SQL rows; a crashed, cancelled or failed run resumes from its last
//! checkpoint with its usage, tool-call count and verification reports carried
//! over; **revision** compare-and-swap decides every ownership change and
//! fences a replaced owner's late writes; a completed request commits
//! atomically with the release of its admission.
//!
//! # Quick start
//!
//! ```
//! use std::sync::Arc;
//! use turnstile::{
//!     Agent, AgentSession, ContextPolicy, ConversationId, Namespace, RequestId, RunContext,
//!     ScriptedModel, ScriptedReply, SqliteStore, Tool, ToolCall, ToolContext, ToolError,
//!     ToolSpec, Usage,
//! };
//!
//! struct Add;
//!
//! #[turnstile::async_trait]
//! impl Tool for Add {
//!     fn spec(&self) -> ToolSpec {
//!         ToolSpec {
//!             name: "add".into(),
//!             description: "Adds two integers".into(),
//!             parameters: serde_json::json!({
//!                 "type": "object",
//!                 "properties": { "a": { "type": "integer" }, "b": { "type": "integer" } },
//!                 "required": ["a", "b"]
//!             }),
//!         }
//!     }
//!
//!     async fn call(&self, args: serde_json::Value, _: ToolContext) -> Result<String, ToolError> {
//!         let (a, b) = (args["a"].as_i64(), args["b"].as_i64());
//!         match (a, b) {
//!             (Some(a), Some(b)) => Ok((a + b).to_string()),
//!             _ => Err(ToolError::new("a and b must be integers")),
//!         }
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), turnstile::Error> {
//! let usage = Usage { input_tokens: 10, output_tokens: 5, ..Usage::default() };
//! let model = Arc::new(ScriptedModel::new(vec![
//!     ScriptedReply::tool_calls(vec![ToolCall::new("c1", "add", serde_json::json!({"a": 2, "b": 3}))])
//!         .with_usage(usage),
//!     ScriptedReply::text("2 + 3 = 5").with_usage(usage),
//! ]));
//! let agent = Agent::new(model.clone()).with_tool(Arc::new(Add));
//! let store = Arc::new(SqliteStore::in_memory().await?);
//! let session = AgentSession::new(
//!     agent,
//!     store,
//!     ConversationId::new(),
//!     Namespace::new("docs")?,
//!     ContextPolicy::default(),
//! );
//!
//! let request = RequestId::new();
//! let outcome = session.run(request, "what is 2 + 3?", RunContext::default()).await?;
//! assert_eq!(outcome.final_text, "2 + 3 = 5");
//! assert_eq!((outcome.turns, outcome.tool_calls), (2, 1));
//! assert_eq!(outcome.usage.total(), 30);
//!
//! // A retry with the same request id and input replays the stored answer.
//! let again = session.run(request, "what is 2 + 3?", RunContext::default()).await?;
//! assert!(again.replayed);
//! assert_eq!(model.calls(), 2);
//! # Ok(())
//! # }
//! ```
//!
//! # Where things are
//!
//! - [`store`]: the [`Store`] contract and [`SqliteStore`], the only code that
//!   talks SQL. Schema in `migrations/`.
//! - [`session`]: [`AgentSession`] — `run`, `stream`, `resume_run`,
//!   `recover_after_owner_exit`, `recovery_usage`, `abandon`.
//! - [`agent`]: the [`Model`] and [`Tool`] traits, [`ScriptedModel`], budgets,
//!   the turn loop.
//! - compaction (in [`session`]). [`ContextPolicy`] sets the window of recent
//!   committed entries the model sees; without a summary agent it is a plain
//!   sliding window. With [`AgentSession::with_summary_agent`], older entries
//!   are summarized in batches before a request's first turn (one summary call
//!   per `summary_batch` entries, each a turn of the request's budget) and the
//!   model sees the latest summary instead; at most [`MaxPasses`] passes per
//!   request, kept across recoveries.
//!
//! The revision compare-and-swap fences competing recoverers and a replaced
//! owner's writes to the database. It cannot fence external services a
//! replaced owner may still call: tools get a stable
//! [`ToolContext::idempotency_key`] to pass to services that deduplicate.

pub mod agent;
pub mod checkpoint;
#[cfg(feature = "cli")]
pub mod cli;
mod error;
pub mod events;
pub mod ids;
pub mod message;
pub mod outcome;
pub mod session;
pub mod store;

pub use agent::{
    Agent, AgentLimits, Budget, Model, RunContext, ScriptedModel, ScriptedReply, Tool, ToolContext,
    ToolError, Verifier,
};
#[cfg(feature = "openai")]
pub use agent::{OpenAiConfig, OpenAiModel};
pub use checkpoint::{CheckpointPhase, LoopCheckpoint};
pub use error::{BudgetKind, Error, ModelError, StoreError};
pub use events::Event;
pub use ids::{ConversationId, Namespace, RequestId, Revision, RunId};
pub use message::{Message, ToolCall, ToolResult, ToolSpec, Usage, VerificationReport};
pub use outcome::Outcome;
pub use session::MaxPasses;
pub use session::{AgentSession, ContextPolicy, ResumePolicy};
pub use store::{SqliteOptions, SqliteStore, Store};

/// Re-exported so implementations of [`Model`], [`Tool`] and [`Verifier`]
/// need no extra dependency.
pub use async_trait::async_trait;
