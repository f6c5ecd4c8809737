//! The agent options of `run`, `resume`, `recover` and `recover-expired`:
//! the model, the tools whose calls wait for approval and the MCP servers
//! tools come from (all part of the agent fingerprint a continued request
//! is checked against).

use clap::Args;

use super::approvals::ApprovalArgs;
use super::mcp::McpArgs;
use super::model::ModelArgs;

#[derive(Args, Debug)]
pub struct AgentArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub approval: ApprovalArgs,
    #[command(flatten)]
    pub mcp: McpArgs,
}
