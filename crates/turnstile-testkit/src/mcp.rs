//! A real MCP server for the MCP client's tests: `mcp/server.py`, on the
//! official Python SDK from PyPI (`mcp/requirements.txt`, installed into
//! the target directory on first use, see [`crate::python`], or the venv
//! at `$TURNSTILE_MCP_VENV`). Every call of its tools appends a line,
//! `<tool> <idempotency key or -> <arguments>`, to a log file the test
//! names: the server's own record of what ran.

use std::path::{Path, PathBuf};

/// The server's command, speaking MCP on stdin and stdout, recording its
/// calls in `effects`.
pub fn stdio_command(effects: &Path) -> tokio::process::Command {
    let venv = crate::python::venv("mcp-venv", "mcp/requirements.txt", "TURNSTILE_MCP_VENV");
    let mut command = tokio::process::Command::new(venv.join("bin/python"));
    command.arg(script()).env("MCP_EFFECTS_LOG", effects);
    command
}

/// The server's script.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp/server.py")
}

/// The lines of `effects` recording calls of `tool`: (idempotency key,
/// arguments).
pub fn calls_of(effects: &Path, tool: &str) -> Vec<(String, String)> {
    let log = std::fs::read_to_string(effects).unwrap_or_default();
    log.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ' ');
            let (name, key, arguments) = (fields.next()?, fields.next()?, fields.next()?);
            (name == tool).then(|| (key.to_owned(), arguments.to_owned()))
        })
        .collect()
}
