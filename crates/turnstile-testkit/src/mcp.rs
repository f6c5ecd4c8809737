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
    let mut command = tokio::process::Command::new(python());
    command.arg(script()).arg("--effects").arg(effects);
    command
}

/// The same as one command line, each word single-quoted (for
/// `turnstile run --mcp-stdio`).
pub fn command_line(effects: &Path) -> String {
    [
        python(),
        script(),
        PathBuf::from("--effects"),
        effects.to_owned(),
    ]
    .iter()
    .map(|word| format!("'{}'", word.display()))
    .collect::<Vec<_>>()
    .join(" ")
}

/// The venv's Python.
fn python() -> PathBuf {
    crate::python::venv("mcp-venv", "mcp/requirements.txt", "TURNSTILE_MCP_VENV").join("bin/python")
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
