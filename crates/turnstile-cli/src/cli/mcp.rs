//! `--mcp-stdio 'COMMAND ARGS'`: tools from MCP servers, each started as a
//! child process speaking MCP on its stdin and stdout. Their tools join the
//! agent (and so its fingerprint); a tool that does not declare itself
//! read-only, or declares itself destructive, waits for approval. The
//! servers are named `mcp1`, `mcp2`, … by their place; a tool whose name
//! another tool has is given its server's name as a prefix (`mcp2_lookup`).

use std::sync::Arc;

use clap::Args;
use turnstile::{McpPolicy, McpServer};

use super::exit::CliError;
use super::tools;

#[derive(Args, Clone, Debug, Default)]
pub struct McpArgs {
    /// An MCP server to take tools from, as a command line started for
    /// this run (`'python3 server.py --flag'`, quoted as a shell would;
    /// repeatable). Its tools that do not declare themselves read-only wait
    /// for approval. Part of the agent: `resume` and `recover` need the same
    /// servers, in the same order.
    #[arg(long = "mcp-stdio", value_name = "COMMAND")]
    pub stdio: Vec<String>,
}

impl McpArgs {
    /// Starts and connects every server, in order, and checks that every
    /// tool has a name of its own, prefixed if need be
    /// ([`McpServer::exposed`]).
    pub(super) async fn connect(&self) -> Result<Vec<Arc<McpServer>>, CliError> {
        let mut servers = Vec::with_capacity(self.stdio.len());
        let mut names: Vec<String> = tools::toolbox().iter().map(|t| t.spec().name).collect();
        for (n, line) in self.stdio.iter().enumerate() {
            let words = shlex::split(line)
                .filter(|words| !words.is_empty())
                .ok_or_else(|| {
                    CliError::Usage(format!(
                        "--mcp-stdio {line:?} is not a command line: quote it as a shell would"
                    ))
                })?;
            let mut command = tokio::process::Command::new(&words[0]);
            command.args(&words[1..]);
            // Named by its place; errors add its program, never its
            // arguments (which may hold secrets).
            let usage = |e| CliError::Usage(format!("--mcp-stdio #{} ({}): {e}", n + 1, words[0]));
            let server = McpServer::stdio(format!("mcp{}", n + 1), command)
                .await
                .map_err(usage)?;
            let exposed = server.exposed(&names).map_err(usage)?;
            names.extend(exposed.into_iter().map(|(name, _)| name));
            servers.push(server);
        }
        Ok(servers)
    }
}

/// The policy of the command line: what each tool declares.
pub(super) fn policy() -> McpPolicy {
    McpPolicy::default()
}
