//! One MCP server: its tools, listed at connect, and its connection, which
//! is made again when the server is gone by the time of a call.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use serde_json::Value;
use tokio::process::Command;
use tokio::sync::Mutex;

use turnstile_core::agent::{Agent, ToolError};

use crate::connect::{relist, Connection, Launch, Listener, Offer, StdioCommand};
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

/// How many times one call tries to start a server that is gone.
const RESTART_ATTEMPTS: u32 = 3;
/// The wait before the first restart after an answered call is none; each
/// further restart waits twice as long as the last, from this, up to
/// [`RESTART_MAX_WAIT`].
const RESTART_FIRST_WAIT: Duration = Duration::from_millis(250);
const RESTART_MAX_WAIT: Duration = Duration::from_secs(8);

/// A connected MCP server. Calls go through one connection, shared by the
/// tools [`McpServer::add_to`] adds; the server process is killed when the
/// last of them is dropped. A server that exited (or closed the
/// connection) is started again by the next call, with a growing wait
/// between restarts while it keeps going away, so long as it offers the
/// same tools.
pub struct McpServer {
    name: String,
    launch: Launch,
    /// What it offers now: read again when it says its tools changed.
    offer: StdMutex<Offer>,
    /// Set when it said its tools changed, until they are read again.
    listener: Listener,
    connection: Mutex<Arc<Connection>>,
    /// Restarts since a call was last answered: the next one's wait.
    restarts: AtomicU32,
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
    pub async fn stdio(name: impl Into<String>, command: Command) -> Result<Arc<Self>, McpError> {
        Self::connect(name.into(), Launch::Stdio(StdioCommand::of(&command))).await
    }

    /// Connects to the streamable-HTTP MCP endpoint `url` (`http://` or
    /// `https://`), every request carrying `headers` (such as
    /// `Authorization`), and lists its tools as [`McpServer::stdio`] does.
    /// A connection that drops is made again by the next call, as a stdio
    /// server is started again.
    ///
    /// # Errors
    /// [`McpError`] for a header that is no valid HTTP header, or when the
    /// handshake or the tool listing fails or takes over a minute (the
    /// server is not there, refuses the headers, or does not speak MCP).
    pub async fn http(
        name: impl Into<String>,
        url: &str,
        headers: &[(String, String)],
    ) -> Result<Arc<Self>, McpError> {
        let name = name.into();
        let headers = headers
            .iter()
            .map(|(key, value)| {
                let key = HeaderName::try_from(key.as_str()).map_err(|_| {
                    McpError(format!(
                        "{key:?} is no HTTP header name (MCP server {name})"
                    ))
                })?;
                // The value may be a secret: never quoted, nor logged.
                let mut value = HeaderValue::try_from(value.as_str()).map_err(|_| {
                    McpError(format!(
                        "the value of the header {key} is no valid HTTP header value (MCP \
                         server {name})"
                    ))
                })?;
                value.set_sensitive(true);
                Ok((key, value))
            })
            .collect::<Result<_, McpError>>()?;
        let launch = Launch::Http {
            url: url.to_owned(),
            headers,
        };
        Self::connect(name, launch)
            .await
            .map_err(|McpError(e)| McpError(e.replace(url, &redacted(url))))
    }

    async fn connect(name: String, launch: Launch) -> Result<Arc<Self>, McpError> {
        let listener = Listener::default();
        let (connection, offer) = launch.connect(&name, &listener).await?;
        tracing::debug!(server = %name, "MCP server connected");
        Ok(Arc::new(Self {
            name,
            launch,
            offer: StdMutex::new(offer),
            listener,
            connection: Mutex::new(Arc::new(connection)),
            restarts: AtomicU32::new(0),
        }))
    }

    /// The live connection. A server that is gone is started again first:
    /// up to [`RESTART_ATTEMPTS`] times, each after a wait that doubles with
    /// every restart since a call was last answered.
    pub(crate) async fn connection(&self) -> Result<Arc<Connection>, ToolError> {
        let mut current = self.connection.lock().await;
        if !current.client.is_transport_closed() {
            return Ok(current.clone());
        }
        let mut why = String::new();
        for _ in 0..RESTART_ATTEMPTS {
            let restarts = self.restarts.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(restart_wait(restarts)).await;
            tracing::info!(server = %self.name, restarts, "restarting the MCP server");
            match self.launch.connect(&self.name, &self.listener).await {
                Ok((connection, offer)) if self.with_offer(|current| *current == offer) => {
                    *current = Arc::new(connection);
                    return Ok(current.clone());
                }
                Ok(_) => {
                    return Err(ToolError::new(format!(
                        "the MCP server {} was started again and offers other tools than \
                         the agent was built with: the call was not sent; start the agent \
                         again to take its new tools",
                        self.name
                    )))
                }
                Err(e) => why = self.redact(&e.0),
            }
        }
        Err(ToolError::new(format!(
            "the MCP server {} is gone and could not be started again ({why}): the call was \
             not sent",
            self.name
        )))
    }

    /// `text` with the server's URL, if it has one, as [`redacted`]: no user
    /// info, no query.
    pub(crate) fn redact(&self, text: &str) -> String {
        match &self.launch {
            Launch::Http { url, .. } => text.replace(url.as_str(), &redacted(url)),
            Launch::Stdio(_) => text.to_owned(),
        }
    }

    /// A call was answered: the server is healthy again.
    pub(crate) fn answered(&self) {
        self.restarts.store(0, Ordering::Relaxed);
    }

    /// The name it was given.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The tools it offers the model (not [`RECONCILE_TOOL`](crate::RECONCILE_TOOL)),
    /// as last listed.
    pub fn tools(&self) -> Vec<McpToolInfo> {
        self.with_offer(|offer| offer.tools.clone())
    }

    /// `f` of what it offers now, read under the lock (nothing copied).
    fn with_offer<T>(&self, f: impl FnOnce(&Offer) -> T) -> T {
        match self.offer.lock() {
            Ok(offer) => f(&offer),
            Err(poisoned) => f(&poisoned.into_inner()),
        }
    }

    /// Whether the server said its tools changed
    /// (`notifications/tools/list_changed`) since they were last listed.
    pub fn tools_changed(&self) -> bool {
        self.listener.stale.load(Ordering::SeqCst)
    }

    /// Lists the tools again when the server said they changed, and says
    /// whether they did. An agent built before keeps its tools (and its
    /// fingerprint): its calls of a tool that changed or went away are not
    /// sent. Build the agent again ([`McpServer::add_to`]) to take the new
    /// list; a request held under the old agent then continues only with
    /// the agent-upgrade opt-in, since its fingerprint differs.
    ///
    /// # Errors
    /// [`McpError`] when the server is gone or does not list its tools.
    pub async fn refresh(&self) -> Result<bool, McpError> {
        if !self.listener.stale.swap(false, Ordering::SeqCst) {
            return Ok(false);
        }
        let connection = self.connection.lock().await.clone();
        let offer = match relist(&self.name, &connection.client).await {
            Ok(offer) => offer,
            Err(e) => {
                self.listener.stale.store(true, Ordering::SeqCst);
                return Err(e);
            }
        };
        let mut current = match self.offer.lock() {
            Ok(current) => current,
            Err(poisoned) => poisoned.into_inner(),
        };
        let changed = *current != offer;
        if changed {
            tracing::info!(server = %self.name, "the MCP server's tools changed");
            *current = offer;
        }
        Ok(changed)
    }

    /// Whether `info` is what the server offers now under its name: its
    /// list read again first if the server said it changed.
    pub(crate) async fn still_offers(&self, info: &McpToolInfo) -> bool {
        if let Err(e) = self.refresh().await {
            tracing::warn!(server = %self.name, error = %e, "could not list the tools again");
        }
        self.with_offer(|offer| offer.tools.contains(info))
    }

    /// Whether it offers [`RECONCILE_TOOL`](crate::RECONCILE_TOOL), which reconciles its tools'
    /// calls left in doubt by a crash.
    pub fn reconciles(&self) -> bool {
        self.with_offer(|offer| offer.reconciles)
    }

    /// `agent` with every tool of this server added, each needing approval
    /// as `policy` says ([`McpPolicy::requires_approval`]), and running
    /// again when a crash leaves a call in doubt as it says
    /// ([`McpPolicy::retries_in_doubt`], unless the server reconciles the
    /// call first). Both are part of the agent's fingerprint, so a held
    /// request continues only with the same policy (or by the
    /// agent-upgrade opt-in).
    ///
    /// A tool whose name the agent already has (its own, or another
    /// server's) is added under [`McpServer::prefixed`] instead; the server
    /// is still called with the tool's own name. [`McpServer::exposed`]
    /// says which name each tool gets.
    ///
    /// # Errors
    /// [`McpError`] when the prefixed name is taken too.
    pub fn add_to(self: &Arc<Self>, agent: Agent, policy: &McpPolicy) -> Result<Agent, McpError> {
        let taken: Vec<String> = agent.tool_specs().iter().map(|s| s.name.clone()).collect();
        let exposed = self.exposed(&taken)?;
        let timeout = policy.timeout(agent.limits().tool_timeout);
        Ok(exposed.into_iter().fold(agent, |agent, (name, info)| {
            let idempotent = policy.retries_in_doubt(&info.name, &info.annotations);
            let asks = policy.requires_approval(&info.name, &info.annotations);
            let tool = Arc::new(McpTool::new(self.clone(), name, info, idempotent, timeout));
            match asks {
                true => agent.with_tool_requiring_approval(tool),
                false => agent.with_tool(tool),
            }
        }))
    }

    /// The name each tool is given beside tools named `taken`: its own, or
    /// [`McpServer::prefixed`] when its own is taken.
    ///
    /// # Errors
    /// [`McpError`] when a prefixed name is taken too.
    pub fn exposed(&self, taken: &[String]) -> Result<Vec<(String, McpToolInfo)>, McpError> {
        let tools = self.tools();
        // Taken: the agent's names, this server's own, and those given.
        let mut names: Vec<String> = taken.to_vec();
        names.extend(tools.iter().map(|info| info.name.clone()));
        let mut exposed = Vec::with_capacity(tools.len());
        for info in tools {
            let name = match taken.contains(&info.name) {
                false => info.name.clone(),
                true => {
                    let prefixed = self.prefixed(&info.name);
                    if names.contains(&prefixed) {
                        return Err(McpError(format!(
                            "the MCP server {} offers a tool named {:?}, which the agent \
                             already has, as it has {prefixed:?}: name the server otherwise",
                            self.name, info.name
                        )));
                    }
                    names.push(prefixed.clone());
                    prefixed
                }
            };
            exposed.push((name, info));
        }
        Ok(exposed)
    }

    /// `tool` prefixed with the server's name (`SERVER_tool`, each
    /// character of the name that a tool name may not hold replaced by
    /// `_`): the name a tool takes when another tool has its own.
    pub fn prefixed(&self, tool: &str) -> String {
        let server: String = self
            .name
            .chars()
            .map(|c| match c.is_ascii_alphanumeric() || c == '-' {
                true => c,
                false => '_',
            })
            .collect();
        format!("{server}_{tool}")
    }
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.name)
            .field("tools", &self.tools().len())
            .finish_non_exhaustive()
    }
}

/// The wait before a restart, after `restarts` restarts since a call was
/// last answered.
fn restart_wait(restarts: u32) -> Duration {
    match restarts {
        0 => Duration::ZERO,
        n => RESTART_FIRST_WAIT
            .saturating_mul(1 << (n - 1).min(16))
            .min(RESTART_MAX_WAIT),
    }
}

/// `url` without its user info and query, which may hold secrets.
pub(crate) fn redacted(url: &str) -> String {
    match url.parse::<http::Uri>() {
        Ok(uri) => format!(
            "{}://{}{}{}",
            uri.scheme_str().unwrap_or("http"),
            uri.host().unwrap_or_default(),
            uri.port().map(|p| format!(":{p}")).unwrap_or_default(),
            uri.path()
        ),
        Err(_) => "(a URL that does not parse)".to_owned(),
    }
}
