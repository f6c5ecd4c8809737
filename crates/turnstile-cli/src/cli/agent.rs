//! The command-line agent (the model given, the real tools and the system
//! prompt) and its session on one conversation.

use std::sync::Arc;

use super::args::SessionArgs;
use super::{mcp, tools};
use turnstile::agent::{Agent, AgentLimits, Model};
use turnstile::ids::{ConversationId, Namespace};
use turnstile::session::{AgentSession, ContextPolicy};
use turnstile::{McpServer, StoreAdmin};

/// The system prompt of the command-line agent. It is part of the agent
/// fingerprint: `resume` and `recover` accept a request only from the agent
/// it was admitted with.
pub const SYSTEM_PROMPT: &str = "You are a careful assistant. Use the tools add, clock and \
                                 word_count when they help, then answer briefly.";

/// The command-line agent: `model`, the real tools and [`SYSTEM_PROMPT`].
pub(super) fn agent(model: Arc<dyn Model>) -> Agent {
    agent_requiring(model, &[], &[])
}

/// The command-line agent whose calls of the tools named in `approval`
/// wait for a human's approval, with the tools of the `mcp` servers (those
/// not declared read-only waiting for approval too).
pub(super) fn agent_requiring(
    model: Arc<dyn Model>,
    approval: &[String],
    mcp: &[Arc<McpServer>],
) -> Agent {
    let agent = tools::toolbox()
        .into_iter()
        .fold(Agent::new(model), |agent, tool| {
            match approval.contains(&tool.spec().name) {
                true => agent.with_tool_requiring_approval(tool),
                false => agent.with_tool(tool),
            }
        });
    // Each `--mcp-stdio`/`--mcp-http` server's tools were checked to get names of their
    // own beside these tools and each other when they connected
    // (`McpArgs::connect`).
    mcp.iter()
        .fold(agent, |agent, server| {
            match server.add_to(agent.clone(), &mcp::policy()) {
                Ok(with_server) => with_server,
                Err(e) => {
                    tracing::error!(error = %e, "an MCP server's tools were left out");
                    agent
                }
            }
        })
        .with_system_prompt(SYSTEM_PROMPT)
        // The request's stored budget (`--max-turns`, default 32) limits
        // its turns, so that a continuing command can raise it.
        .with_limits(AgentLimits {
            max_turns: u32::MAX,
            ..AgentLimits::default()
        })
}

pub(super) fn session(
    args: &SessionArgs,
    store: Arc<dyn StoreAdmin>,
    model: Arc<dyn Model>,
    approval: &[String],
    mcp: &[Arc<McpServer>],
) -> AgentSession {
    agent_session(
        args.conversation,
        args.namespace.clone(),
        store,
        model,
        approval,
        mcp,
    )
}

/// The command-line agent's session on one conversation.
pub(super) fn agent_session(
    conversation: ConversationId,
    namespace: Namespace,
    store: Arc<dyn StoreAdmin>,
    model: Arc<dyn Model>,
    approval: &[String],
    mcp: &[Arc<McpServer>],
) -> AgentSession {
    AgentSession::new(
        agent_requiring(model, approval, mcp),
        store,
        conversation,
        namespace,
        ContextPolicy::default(),
    )
}
