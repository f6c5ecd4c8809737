//! `--mcp-stdio 'COMMAND ARGS'` and `--mcp-http 'URL [--headers-env VAR]'`:
//! tools from MCP servers, each started as a child process speaking MCP on
//! its stdin and stdout, or reached over streamable HTTP. Their tools join
//! the agent (and so its fingerprint); a tool that does not declare itself
//! read-only, or declares itself destructive, waits for approval. The
//! servers are named `mcp1`, `mcp2`, … by their place (the stdio ones
//! first); a tool whose name another tool has is given its server's name as
//! a prefix (`mcp2_lookup`).

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
    /// An MCP server to take tools from over streamable HTTP: its URL,
    /// optionally followed by `--headers-env VAR`, an environment variable
    /// holding the headers every request carries, one `Name: value` per
    /// line (`Authorization: Bearer …`); the flag names the variable, never
    /// its value. Repeatable; after the --mcp-stdio servers in the agent.
    #[arg(long = "mcp-http", value_name = "URL")]
    pub http: Vec<String>,
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
        for (n, value) in self.http.iter().enumerate() {
            let n = self.stdio.len() + n + 1;
            let usage = |e| CliError::Usage(format!("--mcp-http #{n}: {e}"));
            let (url, headers) = http_flag(value).map_err(usage)?;
            let server = McpServer::http(format!("mcp{n}"), &url, &headers)
                .await
                .map_err(|e| usage(e.to_string()))?;
            let exposed = server.exposed(&names).map_err(|e| usage(e.to_string()))?;
            names.extend(exposed.into_iter().map(|(name, _)| name));
            servers.push(server);
        }
        Ok(servers)
    }
}

/// The URL of an `--mcp-http` value and the headers of its
/// `--headers-env VAR`.
fn http_flag(value: &str) -> Result<(String, Vec<(String, String)>), String> {
    let words = shlex::split(value).unwrap_or_default();
    let (url, headers) = match words.as_slice() {
        [url] => (url, Vec::new()),
        [url, flag, var] if flag == "--headers-env" => (url, headers_from_env(var)?),
        // The value is not quoted back: its URL may hold a secret.
        _ => {
            return Err(
                "the value is not `URL` or `URL --headers-env VAR`, quoted as a shell would".into(),
            )
        }
    };
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err("the URL must start with http:// or https://".into());
    }
    Ok((url.clone(), headers))
}

/// The headers in the environment variable `var`, one `Name: value` per
/// line. Errors name the variable and the line, never a value.
fn headers_from_env(var: &str) -> Result<Vec<(String, String)>, String> {
    let text = std::env::var(var)
        .map_err(|_| format!("the environment variable {var} (--headers-env) is not set"))?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| match line.split_once(':') {
            Some((name, value)) if !name.trim().is_empty() => {
                Ok((name.trim().to_owned(), value.trim().to_owned()))
            }
            _ => Err(format!(
                "line {} of the environment variable {var} is not `Name: value`",
                i + 1
            )),
        })
        .collect()
}

/// The policy of the command line: what each tool declares.
pub(super) fn policy() -> McpPolicy {
    McpPolicy::default()
}

/// An `--mcp-http` value as a printed command repeats it: its URL's
/// password redacted, as `--base-url`'s is (secrets belong in
/// `--headers-env`).
pub(super) fn redacted_http_flag(value: &str) -> String {
    match shlex::split(value) {
        Some(mut words) if !words.is_empty() => {
            words[0] = turnstile::redacted_url(&words[0]);
            shlex::try_join(words.iter().map(String::as_str)).unwrap_or_default()
        }
        _ => String::new(),
    }
}
