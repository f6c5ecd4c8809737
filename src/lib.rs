//! turnstile: durable LLM agent conversations on SQLite.

pub mod checkpoint;
mod error;
pub mod ids;
pub mod message;
pub mod store;

pub use checkpoint::{CheckpointPhase, LoopCheckpoint};
pub use error::{BudgetKind, Error, ModelError, StoreError};
pub use ids::{ConversationId, Namespace, RequestId, Revision, RunId};
pub use message::{Message, ToolCall, ToolSpec, Usage, VerificationReport};
pub use store::{SqliteOptions, SqliteStore, Store};
