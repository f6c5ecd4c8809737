//! Tools from MCP servers (cargo feature `mcp`): [`McpServer`] connects to
//! one (started as a child process speaking on its stdin and stdout, or
//! over streamable HTTP), lists its tools as turnstile [`Tool`](turnstile_core::agent::Tool)s
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
//! - **Servers that go away.** A call the server did not answer (it
//!   exited, or the connection dropped) is in doubt
//!   ([`ToolError::in_doubt`](turnstile_core::agent::ToolError::in_doubt)):
//!   the run stops with its turn in flight. The next call starts the server
//!   again, with a growing wait while it keeps going away.
//! - **Changed tools.** A server's `notifications/tools/list_changed` has
//!   its list read again before the next call
//!   ([`McpServer::refresh`]); an agent keeps the tools it was built
//!   with, and a call of one the server no longer offers is not sent.
//! - **Calls in doubt.** When a crash leaves a call in doubt, a recovery
//!   first asks the server through the reconcile convention below, if it
//!   offers it; otherwise (or when it cannot tell) a tool that says it is
//!   idempotent or read-only runs again with the same key
//!   ([`McpPolicy::retry_in_doubt`] overrides), and any other call is
//!   ambiguous: the default resume policy refuses it.
//! - **Results become parts.** Text, images, `structuredContent` (a JSON
//!   part), embedded resources (text, or a file) and resource links (a
//!   line naming them); `isError` is a failed call, which the model is
//!   told about.

mod connect;
mod content;
mod policy;
mod server;
mod tool;

pub use policy::{Annotations, McpPolicy};
pub use server::{McpError, McpServer, McpToolInfo};

/// The `_meta` member of every `tools/call` that holds the call's
/// idempotency key.
pub const IDEMPOTENCY_KEY_META: &str = "turnstile/idempotency-key";

/// The tool of turnstile's reconcile convention. A server that can tell
/// whether a call of one of its tools took effect offers a tool of this
/// name (it is not shown to the model). A recovery calls it, with the
/// call's key in `_meta` as usual, and the arguments
/// `{"tool": NAME, "idempotency_key": KEY, "arguments": {…}}`. It answers
/// with `structuredContent` `{"status": "done"}` and, as its content, what
/// the call answered (`"failed": true` beside the status when the call
/// failed): that answer is journaled as the call's result and the call does
/// not run again; `{"status": "not_done"}`: the call runs once; anything
/// else, `isError`, or no answer: unknown.
pub const RECONCILE_TOOL: &str = "turnstile_reconcile";
