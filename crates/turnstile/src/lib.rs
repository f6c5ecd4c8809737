//! turnstile: durable LLM agent conversations, on SQLite embedded (and on
//! any backend that passes the store conformance suite).
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
//! use turnstile::{Content,
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
//!     async fn call(&self, args: serde_json::Value, _: ToolContext) -> Result<Content, ToolError> {
//!         let (a, b) = (args["a"].as_i64(), args["b"].as_i64());
//!         match (a, b) {
//!             (Some(a), Some(b)) => Ok((a + b).to_string().into()),
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
//! This crate is the facade: it re-exports what applications use of
//! [`turnstile_core`] (the engine; its `backend` kit for backend authors is
//! not re-exported) and, by cargo feature, a backend and a model client:
//!
//! | feature | adds | crate |
//! |---|---|---|
//! | `sqlite` (default) | [`SqliteStore`], [`SqliteOptions`], [`Durability`], [`MigrationObserver`], [`MigrationEvent`] | `turnstile-sqlite` |
//! | `postgres` | `PostgresStore`, `PostgresOptions` | `turnstile-postgres` |
//! | `openai` (default) | [`OpenAiModel`], [`OpenAiConfig`], [`RetryPolicy`] | `turnstile-openai` |
//! | `anthropic` | `AnthropicModel`, `AnthropicConfig`, `PromptCache`, `RetryPolicy` | `turnstile-anthropic` |
//! | `mcp` (Rust 1.88) | `McpServer`, `McpPolicy`, `Annotations` | `turnstile-mcp` |
//!
//! - [`session`]: [`AgentSession`] — `run`, `stream`, `resume_run`,
//!   `recover_after_owner_exit`, `recovery_usage`, `abandon` — and the turn
//!   protocol. [`ContextPolicy`] sets the window of recent committed entries
//!   the model sees; with [`AgentSession::with_summary_agent`], older entries
//!   are summarized in batches before a request's first turn, at most
//!   [`MaxPasses`] passes per request, kept across recoveries.
//!   Human approval of tool calls: a tool added with
//!   [`Agent::with_tool_requiring_approval`] (or named by an
//!   [`ApprovalPolicy`]) stops the run with [`Error::AwaitingApproval`];
//!   [`AgentSession::approve`] / [`AgentSession::reject`] decide each call
//!   in the store and [`AgentSession::continue_after_approval`] goes on.
//! - [`store`]: the [`Store`] contract and its records; [`admin`]: the
//!   operations contract ([`StoreAdmin`]: listings, retention with
//!   [`admin::RetentionPolicy`] and [`admin::Retention`], health).
//! - [`agent`]: the [`Model`] and [`Tool`] traits, [`ScriptedModel`], budgets,
//!   [`RunContext`] (a wall-clock deadline stored with the request,
//!   [`AgentUpgrade`] to continue a request with a changed agent).
//!
//! The revision compare-and-swap fences competing recoverers and a replaced
//! owner's writes to the database. It cannot fence external services a
//! replaced owner may still call: tools get a stable
//! [`ToolContext::idempotency_key`] to pass to services that deduplicate.

#![warn(missing_docs)]

// What applications use; the backend author's kit (`turnstile_core::backend`)
// stays in turnstile-core.

// The modules applications navigate for the rest of a contract's records.
pub use turnstile_core::{admin, agent, checkpoint, events, ids, message, outcome, session, store};

// Sessions: running, resuming and recovering requests.
pub use turnstile_core::{
    recover_expired, ActiveRequest, AdmissionState, AgentSession, ContextPolicy, EventStream,
    LeasePolicy, MaxPasses, PastReasoning, Recovery, ResumePolicy,
};
// Agents: the model, its tools and what bounds a run.
pub use turnstile_core::{
    Agent, AgentLimits, AgentUpgrade, ApprovalPolicy, Budget, Model, Reconciliation, RunContext,
    ScriptedModel, ScriptedReply, Tool, ToolContext, ToolError, Verifier,
};
// The vocabulary: ids, messages, checkpoints, outcomes, events, errors.
pub use turnstile_core::{
    Attachment, BlobHash, BudgetKind, CallInDoubt, CheckpointPhase, Content, ConversationId, Error,
    Event, JsonText, LoopCheckpoint, Message, ModelError, Namespace, Outcome, Part,
    ProviderMetadata, Reasoning, RequestId, Revision, RunId, StoreError, ToolCall, ToolResult,
    ToolSpec, Usage, VerificationReport,
};
// The stores' contracts: durable steps and operations.
pub use turnstile_core::{Store, StoreAdmin};

/// Re-exported so implementations of [`Model`], [`Tool`] and [`Verifier`]
/// need no extra dependency.
pub use turnstile_core::async_trait;

#[cfg(feature = "postgres")]
pub use turnstile_postgres::{PostgresOptions, PostgresStore};
#[cfg(feature = "sqlite")]
pub use turnstile_sqlite::{
    Durability, MigrationEvent, MigrationObserver, SqliteOptions, SqliteStore,
};

#[cfg(feature = "anthropic")]
pub use turnstile_anthropic::{AnthropicConfig, AnthropicModel, PromptCache};
// One type, shared by both clients.
#[cfg(all(feature = "anthropic", not(feature = "openai")))]
pub use turnstile_anthropic::RetryPolicy;
#[cfg(feature = "mcp")]
pub use turnstile_mcp::{
    Annotations, McpError, McpPolicy, McpServer, McpToolInfo, IDEMPOTENCY_KEY_META, RECONCILE_TOOL,
};
#[cfg(feature = "openai")]
pub use turnstile_openai::{redacted_url, OpenAiConfig, OpenAiModel, ReasoningReplay, RetryPolicy};
/// Requests and event logs over HTTP (feature `server`).
#[cfg(feature = "server")]
pub use turnstile_server as server;
