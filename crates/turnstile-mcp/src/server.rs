//! A connection to one MCP server: started as a child process speaking
//! MCP on its stdin and stdout, its tools listed once at connect.

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::Mutex;

use turnstile_core::agent::Agent;

use crate::policy::{Annotations, McpPolicy};
use crate::tool::McpTool;
use crate::RECONCILE_TOOL;

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

/// How long the handshake and the tool listing may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
/// How many of the server's last stderr lines an error quotes.
const STDERR_LINES: usize = 5;

/// A connected MCP server. Calls go through one connection, shared by the
/// tools [`McpServer::add_to`] adds; the server process is killed when the
/// last of them is dropped.
pub struct McpServer {
    name: String,
    pub(crate) client: RunningService<RoleClient, ()>,
    tools: Vec<McpToolInfo>,
    /// Whether it offers [`RECONCILE_TOOL`].
    reconciles: bool,
    /// Held so the process lives as long as the connection (killed on
    /// drop).
    _child: Mutex<Child>,
}

impl McpServer {
    /// Starts `command` as an MCP server speaking on its stdin and stdout,
    /// connects (the MCP handshake) and lists its tools, sorted by name (so
    /// the agent's fingerprint does not depend on the server's order). Its
    /// stderr goes to the `tracing` log at debug level, a line at a time.
    /// `name` names the server in errors and logs.
    ///
    /// # Errors
    /// [`McpError`] when the command cannot be started, or the handshake or
    /// the tool listing fails or takes over a minute (the server exited, or
    /// does not speak MCP), quoting the server's last stderr lines; or when
    /// it lists a tool name twice.
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
        let last_lines = Arc::new(StdMutex::new(VecDeque::new()));
        if let Some(stderr) = child.stderr.take() {
            let server = name.clone();
            let last_lines = last_lines.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::debug!(server = %server, "{line}");
                    if let Ok(mut last) = last_lines.lock() {
                        if last.len() == STDERR_LINES {
                            last.pop_front();
                        }
                        last.push_back(line);
                    }
                }
            });
        }
        let connect = async {
            let client = ().serve((stdout, stdin)).await.map_err(|e| {
                format!("the MCP server {name} did not complete the MCP handshake: {e}")
            })?;
            let tools = client
                .list_all_tools()
                .await
                .map_err(|e| format!("cannot list the tools of the MCP server {name}: {e}"))?;
            Ok::<_, String>((client, tools))
        };
        let connected = tokio::time::timeout(CONNECT_TIMEOUT, connect)
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "the MCP server {name} did not answer the MCP handshake within {} s",
                    CONNECT_TIMEOUT.as_secs()
                ))
            });
        let (client, tools) = match connected {
            Ok(connected) => connected,
            Err(what) => {
                // Its last words, once it has had a moment to say them.
                let _ = tokio::time::timeout(Duration::from_millis(200), child.wait()).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
                let last = last_lines.lock().map(|l| l.clone()).unwrap_or_default();
                return Err(McpError(match last.is_empty() {
                    true => what,
                    false => format!(
                        "{what}; its last stderr lines: {}",
                        Vec::from(last).join(" | ")
                    ),
                }));
            }
        };
        let mut tools: Vec<McpToolInfo> = tools
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
        // The reconcile convention's tool is turnstile's, not the model's.
        let reconciles = tools.iter().any(|tool| tool.name == RECONCILE_TOOL);
        tools.retain(|tool| tool.name != RECONCILE_TOOL);
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        if let Some(pair) = tools.windows(2).find(|pair| pair[0].name == pair[1].name) {
            return Err(McpError(format!(
                "the MCP server {name} lists the tool {:?} twice",
                pair[0].name
            )));
        }
        tracing::debug!(server = %name, "MCP server connected");
        Ok(Arc::new(Self {
            name,
            client,
            tools,
            reconciles,
            _child: Mutex::new(child),
        }))
    }

    /// The name it was given.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The tools it offers the model (not [`RECONCILE_TOOL`]).
    pub fn tools(&self) -> &[McpToolInfo] {
        &self.tools
    }

    /// Whether it offers [`RECONCILE_TOOL`], which reconciles its tools'
    /// calls left in doubt by a crash.
    pub fn reconciles(&self) -> bool {
        self.reconciles
    }

    /// `agent` with every tool of this server added, each needing approval
    /// as `policy` says ([`McpPolicy::requires_approval`]), and running
    /// again when a crash leaves a call in doubt as it says
    /// ([`McpPolicy::retries_in_doubt`], unless the server reconciles the
    /// call first). Both are part of the agent's fingerprint, so a held
    /// request continues only with the same policy (or by the
    /// agent-upgrade opt-in).
    ///
    /// # Errors
    /// [`McpError`] when the agent already has a tool of one of these names
    /// (its own, or another server's): a call would go to another tool than
    /// the one its name suggests.
    pub fn add_to(self: &Arc<Self>, agent: Agent, policy: &McpPolicy) -> Result<Agent, McpError> {
        if let Some(taken) = self
            .tools
            .iter()
            .find(|info| agent.tool_specs().iter().any(|spec| spec.name == info.name))
        {
            return Err(McpError(format!(
                "the MCP server {} offers a tool named {:?}, which the agent already has",
                self.name, taken.name
            )));
        }
        Ok(self.tools.iter().fold(agent, |agent, info| {
            let idempotent = policy.retries_in_doubt(&info.name, &info.annotations);
            let tool = Arc::new(McpTool::new(self.clone(), info.clone(), idempotent));
            match policy.requires_approval(&info.name, &info.annotations) {
                true => agent.with_tool_requiring_approval(tool),
                false => agent.with_tool(tool),
            }
        }))
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
