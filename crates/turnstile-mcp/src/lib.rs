//! Tools from MCP servers (cargo feature `mcp`): [`McpServer`] connects to
//! one, lists its tools as turnstile [`Tool`](turnstile_core::agent::Tool)s
//! and adds them to an agent, each gated by the behaviour its annotations
//! declare ([`Annotations`], [`McpPolicy`]).
//!
//! Built on `rmcp`, the official Rust MCP SDK (which needs Rust 1.88).
//!
//! - **Calls carry their idempotency key.** Every `tools/call` carries the
//!   call's idempotency key (turnstile's `request/turn/call` key, the same
//!   on every retry of the call) in its `_meta` under
//!   [`IDEMPOTENCY_KEY_META`], so a server that deduplicates can.
//! - **Declared behaviour becomes policy.** A tool whose annotations do not
//!   say `readOnlyHint: true`, or that say `destructiveHint: true`, needs
//!   approval (turnstile's durable approvals) unless the caller says
//!   otherwise per tool.
//! - **Results become parts.** Text, images, `structuredContent` (a JSON
//!   part), embedded resources (text, or a file) and resource links (a
//!   line naming them); `isError` is a failed call, which the model is
//!   told about.

mod content;
mod policy;
mod server;
mod tool;

pub use policy::{Annotations, McpPolicy};
pub use server::{McpError, McpServer, McpToolInfo};

/// The `_meta` member of every `tools/call` that holds the call's
/// idempotency key.
pub const IDEMPOTENCY_KEY_META: &str = "turnstile/idempotency-key";
