//! Starting an MCP server, or reaching one over HTTP, and connecting to it:
//! the child process and its stderr, or the HTTP transport; the handshake
//! and the tool listing. Kept apart from [`McpServer`](crate::McpServer)
//! because a server that went away is connected to again the same way.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use rmcp::model::Tool as RmcpTool;
use rmcp::service::{MaybeSendFuture, NotificationContext, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::policy::Annotations;
use crate::server::{McpError, McpToolInfo};
use crate::RECONCILE_TOOL;

/// How long the handshake and the tool listing may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
/// How many of the server's last stderr lines an error quotes.
const STDERR_LINES: usize = 5;

/// How to reach a server again.
pub(crate) enum Launch {
    /// A child process speaking on its stdin and stdout.
    Stdio(StdioCommand),
    /// A streamable-HTTP endpoint, with the headers every request carries.
    Http {
        url: String,
        headers: HashMap<HeaderName, HeaderValue>,
    },
}

/// The command a stdio server was given, taken apart (a
/// `tokio::process::Command` cannot be cloned).
pub(crate) struct StdioCommand {
    program: OsString,
    args: Vec<OsString>,
    envs: Vec<(OsString, Option<OsString>)>,
    current_dir: Option<PathBuf>,
}

/// Marks the server's tool list stale when the server says it changed
/// (`notifications/tools/list_changed`); the list is read again before the
/// next call.
#[derive(Clone, Default)]
pub(crate) struct Listener {
    pub stale: Arc<AtomicBool>,
}

impl ClientHandler for Listener {
    fn on_tool_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl std::future::Future<Output = ()> + MaybeSendFuture + '_ {
        self.stale.store(true, Ordering::SeqCst);
        std::future::ready(())
    }
}

/// One live connection: the MCP session and, for a stdio server, the
/// process it talks to.
pub(crate) struct Connection {
    pub client: RunningService<RoleClient, Listener>,
    /// Held so the process lives as long as the connection (killed on
    /// drop).
    _child: Option<Child>,
}

/// What a server offers: its tools for the model, sorted by name (so the
/// agent's fingerprint does not depend on the server's order), and whether
/// it offers [`RECONCILE_TOOL`].
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Offer {
    pub tools: Vec<McpToolInfo>,
    pub reconciles: bool,
}

impl Launch {
    /// Connects, within a minute: the handshake and the tool listing.
    /// `listener` hears of changes to the server's tools.
    pub async fn connect(
        &self,
        name: &str,
        listener: &Listener,
    ) -> Result<(Connection, Offer), McpError> {
        match self {
            Launch::Stdio(command) => command.connect(name, listener).await,
            Launch::Http { url, headers } => connect_http(name, url, headers, listener).await,
        }
    }
}

/// Connects to the streamable-HTTP endpoint `url`.
async fn connect_http(
    name: &str,
    url: &str,
    headers: &HashMap<HeaderName, HeaderValue>,
    listener: &Listener,
) -> Result<(Connection, Offer), McpError> {
    // rmcp's reqwest takes the process's rustls provider; without one it
    // would panic. Ring, unless the application installed another.
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers.clone());
    let transport = StreamableHttpClientTransport::from_config(config);
    let (client, offer) = handshake(name, listener.clone().serve(transport)).await?;
    Ok((
        Connection {
            client,
            _child: None,
        },
        offer,
    ))
}

/// The handshake `serving` does, then the tool listing, within
/// [`CONNECT_TIMEOUT`].
async fn handshake<E: std::fmt::Display>(
    name: &str,
    serving: impl std::future::Future<Output = Result<RunningService<RoleClient, Listener>, E>>,
) -> Result<(RunningService<RoleClient, Listener>, Offer), McpError> {
    let connect = async {
        let client = serving.await.map_err(|e| {
            format!("the MCP server {name} did not complete the MCP handshake: {e}")
        })?;
        let tools = client
            .list_all_tools()
            .await
            .map_err(|e| format!("cannot list the tools of the MCP server {name}: {e}"))?;
        Ok::<_, String>((client, tools))
    };
    let (client, tools) = tokio::time::timeout(CONNECT_TIMEOUT, connect)
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "the MCP server {name} did not answer the MCP handshake within {} s",
                CONNECT_TIMEOUT.as_secs()
            ))
        })
        .map_err(McpError)?;
    Ok((client, offer(name, tools)?))
}

impl StdioCommand {
    pub fn of(command: &Command) -> Self {
        let std = command.as_std();
        Self {
            program: std.get_program().to_owned(),
            args: std.get_args().map(ToOwned::to_owned).collect(),
            envs: std
                .get_envs()
                .map(|(k, v)| (k.to_owned(), v.map(ToOwned::to_owned)))
                .collect(),
            current_dir: std.get_current_dir().map(ToOwned::to_owned),
        }
    }

    fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.args);
        for (key, value) in &self.envs {
            match value {
                Some(value) => command.env(key, value),
                None => command.env_remove(key),
            };
        }
        if let Some(dir) = &self.current_dir {
            command.current_dir(dir);
        }
        command
    }

    /// Starts the server as a child process speaking MCP on its stdin and
    /// stdout, connects (the MCP handshake) and lists its tools. Its
    /// stderr goes to the `tracing` log at debug level, a line at a time.
    async fn connect(
        &self,
        name: &str,
        listener: &Listener,
    ) -> Result<(Connection, Offer), McpError> {
        let mut child = self
            .command()
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
            let server = name.to_owned();
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
        let serving = listener.clone().serve((stdout, stdin));
        let (client, offer) = match handshake(name, serving).await {
            Ok(connected) => connected,
            Err(McpError(what)) => {
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
        Ok((
            Connection {
                client,
                _child: Some(child),
            },
            offer,
        ))
    }
}

/// Lists the server's tools again on `client`.
pub(crate) async fn relist(
    name: &str,
    client: &RunningService<RoleClient, Listener>,
) -> Result<Offer, McpError> {
    let tools = tokio::time::timeout(CONNECT_TIMEOUT, client.list_all_tools())
        .await
        .map_err(|_| {
            McpError(format!(
                "the MCP server {name} did not list its tools in time"
            ))
        })?
        .map_err(|e| {
            McpError(format!(
                "cannot list the tools of the MCP server {name}: {e}"
            ))
        })?;
    offer(name, tools)
}

/// The listed tools as turnstile sees them.
fn offer(name: &str, tools: Vec<RmcpTool>) -> Result<Offer, McpError> {
    // The reconcile convention's tool is turnstile's, not the model's.
    let reconciles = tools.iter().any(|tool| tool.name == RECONCILE_TOOL);
    let mut tools: Vec<McpToolInfo> = tools
        .into_iter()
        .filter(|tool| tool.name != RECONCILE_TOOL)
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
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(pair) = tools.windows(2).find(|pair| pair[0].name == pair[1].name) {
        return Err(McpError(format!(
            "the MCP server {name} lists the tool {:?} twice",
            pair[0].name
        )));
    }
    Ok(Offer { tools, reconciles })
}
