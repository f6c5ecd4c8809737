//! turnstile: durable LLM agent conversations on SQLite.

pub mod agent;
pub mod checkpoint;
mod error;
pub mod events;
pub mod ids;
pub mod message;
pub mod session;
pub mod store;

pub use agent::{
    Agent, AgentLimits, Budget, Model, RunContext, ScriptedModel, ScriptedReply, Tool, ToolContext,
    ToolError, Verifier,
};
pub use checkpoint::{CheckpointPhase, LoopCheckpoint};
pub use error::{BudgetKind, Error, ModelError, StoreError};
pub use events::Event;
pub use ids::{ConversationId, Namespace, RequestId, Revision, RunId};
pub use message::{Message, ToolCall, ToolSpec, Usage, VerificationReport};
pub use session::{AgentSession, ContextPolicy, Outcome, ResumePolicy};
pub use store::{SqliteOptions, SqliteStore, Store};
