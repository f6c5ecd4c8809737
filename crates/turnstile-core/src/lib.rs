//! turnstile-core: the engine of [turnstile](https://docs.rs/turnstile),
//! without a database driver.
//!
//! Every request is **admitted** to its conversation exclusively before any
//! model or tool work; the agent loop saves a **loop checkpoint** after every
//! turn; a crashed, cancelled or failed run resumes from its last checkpoint
//! with its usage, tool-call count and verification reports carried over;
//! **revision** compare-and-swap decides every ownership change and fences a
//! replaced owner's late writes; a completed request commits atomically with
//! the release of its admission.
//!
//! Applications depend on the `turnstile` facade, which adds a backend
//! (`SqliteStore` by default) and its quick start. A backend depends on this
//! crate alone: it implements [`Store`] (and [`StoreAdmin`]
//! for the operations), builds [`StoreError`]s with its own classification
//! of busy and full, and proves itself with the `turnstile-conformance` suite.
//!
//! # Where things are
//!
//! - [`session`]: [`AgentSession`] (`run`, `resume_run`,
//!   `recover_after_owner_exit`, each also as an [`EventStream`]: `stream`,
//!   `resume_stream`, `recover_stream`; `admission`, `recovery_usage`,
//!   `abandon`) and the turn protocol (`session/turns/mod.rs`): how a request
//!   runs. Compaction ([`ContextPolicy`], [`MaxPasses`]) lives there too,
//!   and opt-in leases ([`LeasePolicy`], `AgentSession::with_lease`,
//!   [`recover_expired`]): takeover of a request whose owner stopped
//!   renewing, for many processes or machines on one store.
//! - [`store`]: the [`Store`] contract and its records: what must be durable.
//!   [`admin`]: the operations contract (listings, retention, health).
//! - [`agent`]: the [`Model`] and [`Tool`] traits, [`ScriptedModel`], budgets.
//! - [`ids`], [`message`], [`checkpoint`], [`outcome`], [`events`]: the
//!   vocabulary.
//! - [`backend`]: the backend author's kit (row decoders, refusal
//!   builders) that every backend shares; applications need none of it.
//!
//! The revision compare-and-swap fences competing recoverers and a replaced
//! owner's writes to the database. It cannot fence external services a
//! replaced owner may still call: tools get a stable
//! [`ToolContext::idempotency_key`] to pass to services that deduplicate.

#![warn(missing_docs)]

pub mod admin;
pub mod agent;
mod attachment;
pub mod backend;
pub mod checkpoint;
mod content;
mod error;
pub mod events;
pub mod ids;
pub mod message;
pub mod outcome;
pub mod session;
pub mod store;
mod stored_name;

pub use admin::StoreAdmin;
pub use agent::{
    Agent, AgentLimits, AgentUpgrade, ApprovalPolicy, Budget, Model, Reconciliation, RunContext,
    ScriptedModel, ScriptedReply, Tool, ToolContext, ToolError, Verifier,
};
pub use checkpoint::{CheckpointPhase, LoopCheckpoint};
pub use error::{BudgetKind, CallInDoubt, Error, ModelError, StoreError};
pub use events::Event;
pub use ids::{ConversationId, Namespace, RequestId, Revision, RunId};
pub use message::{
    Attachment, BlobHash, Content, JsonText, Message, Part, ProviderMetadata, Reasoning, ToolCall,
    ToolResult, ToolSpec, Usage, VerificationReport,
};
pub use outcome::Outcome;
pub use session::MaxPasses;
pub use session::{recover_expired, LeasePolicy, Recovery};
pub use session::{
    ActiveRequest, AdmissionState, AgentSession, ContextPolicy, EventStream, PastReasoning,
    ResumePolicy,
};
pub use store::Store;

/// Re-exported so implementations of [`Model`], [`Tool`] and [`Verifier`]
/// need no extra dependency.
pub use async_trait::async_trait;
