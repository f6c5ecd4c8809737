//! A connection to one MCP server: started as a child process speaking
//! MCP on its stdin and stdout, its tools listed once at connect.

use std::process::Stdio;
use std::sync::Arc;

use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::Mutex;

use turnstile_core::agent::Agent;

use crate::policy::{Annotations, McpPolicy};
use crate::tool::McpTool;

/// An MCP server could not be started, connected to or listed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct McpError(pub String);

/// A tool a server offers, as it describes itself.
#[derive(Clone, Debug, PartialEq)]
pub struct McpToolInfo {
    /// Its name, as the model calls it.
    pub name: String,
    /// What it does.
    pub description: String,
    /// The JSON schema of its arguments.
    pub input_schema: Value,
    /// What it declares about its behaviour.
    pub annotations: Annotations,
}

/// A connected MCP server. Calls go through one connection, shared by the
/// tools [`McpServer::add_to`] adds; the server process is killed when the
/// last of them is dropped.
pub struct McpServer {
    name: String,
    pub(crate) client: RunningService<RoleClient, ()>,
    tools: Vec<McpToolInfo>,
    /// Held so the process lives as long as the connection (killed on
    /// drop).
    _child: Mutex<Child>,
}

impl McpServer {
    /// Starts `command` as an MCP server speaking on its stdin and stdout,
    /// connects (the MCP handshake) and lists its tools. Its stderr goes to
    /// the `tracing` log at debug level, a line at a time. `name` names the
    /// server in errors and logs.
    ///
    /// # Errors
    /// [`McpError`] when the command cannot be started, or the handshake or
    /// the tool listing fails (the server exited, or does not speak MCP).
    pub async fn stdio(
        name: impl Into<String>,
        mut command: Command,
    ) -> Result<Arc<Self>, McpError> {
        let name = name.into();
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| McpError(format!("cannot start the MCP server {name}: {e}")))?;
        let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
            return Err(McpError(format!(
                "the MCP server {name} has no stdin or stdout"
            )));
        };
        if let Some(stderr) = child.stderr.take() {
            let server = name.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::debug!(server = %server, "{line}");
                }
            });
        }
        let client = ().serve((stdout, stdin)).await.map_err(|e| {
            McpError(format!(
                "the MCP server {name} did not complete the MCP handshake: {e}"
            ))
        })?;
        let tools = client
            .list_all_tools()
            .await
            .map_err(|e| {
                McpError(format!(
                    "cannot list the tools of the MCP server {name}: {e}"
                ))
            })?
            .into_iter()
            .map(|tool| {
                let hints = tool.annotations.unwrap_or_default();
                McpToolInfo {
                    name: tool.name.into_owned(),
                    description: tool.description.map(|d| d.into_owned()).unwrap_or_default(),
                    input_schema: Value::Object((*tool.input_schema).clone()),
                    annotations: Annotations {
                        read_only: hints.read_only_hint,
                        destructive: hints.destructive_hint,
                        idempotent: hints.idempotent_hint,
                        open_world: hints.open_world_hint,
                    },
                }
            })
            .collect();
        tracing::debug!(server = %name, "MCP server connected");
        Ok(Arc::new(Self {
            name,
            client,
            tools,
            _child: Mutex::new(child),
        }))
    }

    /// The name it was given.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The tools it offers.
    pub fn tools(&self) -> &[McpToolInfo] {
        &self.tools
    }

    /// `agent` with every tool of this server added, each needing approval
    /// as `policy` says ([`McpPolicy::requires_approval`]). Which tools
    /// need approval is part of the agent's fingerprint, so a held request
    /// continues only with the same policy (or by the agent-upgrade
    /// opt-in).
    pub fn add_to(self: &Arc<Self>, agent: Agent, policy: &McpPolicy) -> Agent {
        self.tools.iter().fold(agent, |agent, info| {
            let tool = Arc::new(McpTool::new(self.clone(), info.clone()));
            match policy.requires_approval(&info.name, &info.annotations) {
                true => agent.with_tool_requiring_approval(tool),
                false => agent.with_tool(tool),
            }
        })
    }
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.name)
            .field("tools", &self.tools.len())
            .finish_non_exhaustive()
    }
}
