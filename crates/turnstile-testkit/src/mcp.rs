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

/// The server serving streamable HTTP on a free loopback port, recording
/// its calls in `effects`; with `token`, every request needs
/// `Authorization: Bearer <token>`; with `reconcile`, it offers turnstile's
/// reconcile convention. Killed on drop.
pub struct HttpServer {
    /// `http://127.0.0.1:PORT/mcp`.
    pub url: String,
    port: u16,
    effects: PathBuf,
    token: Option<String>,
    reconcile: bool,
    child: std::process::Child,
}

impl HttpServer {
    /// Starts it and waits until it accepts connections.
    pub fn start(effects: &Path, token: Option<&str>, reconcile: bool) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free loopback port")
            .port();
        let child = Self::spawn(port, effects, token, reconcile);
        let mut server = Self {
            url: format!("http://127.0.0.1:{port}/mcp"),
            port,
            effects: effects.to_owned(),
            token: token.map(ToOwned::to_owned),
            reconcile,
            child,
        };
        server.wait_until_listening();
        server
    }

    fn spawn(
        port: u16,
        effects: &Path,
        token: Option<&str>,
        reconcile: bool,
    ) -> std::process::Child {
        let mut command = std::process::Command::new(python());
        command
            .arg(script())
            .arg("--http")
            .arg(port.to_string())
            .arg("--effects")
            .arg(effects);
        if reconcile {
            command.arg("--reconcile");
        }
        if let Some(token) = token {
            command.arg("--token").arg(token);
        }
        command
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the MCP HTTP server")
    }

    /// Waits for the server to say it bound its port (a port another
    /// process took makes it exit instead).
    fn wait_until_listening(&mut self) {
        use std::io::BufRead;
        let stdout = self.child.stdout.take().expect("the server's stdout");
        let mut lines = std::io::BufReader::new(stdout).lines();
        match lines.next() {
            Some(Ok(line)) if line == "LISTENING" => {}
            other => panic!("the MCP HTTP server did not bind its port: {other:?}"),
        }
        // Bound; accepting once uvicorn has started.
        let started = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(60),
                "the MCP HTTP server did not listen within 60 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Kills it with SIGKILL (and reaps it).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again on the same port, after [`HttpServer::kill`].
    pub fn restart(&mut self) {
        self.child = Self::spawn(
            self.port,
            &self.effects,
            self.token.as_deref(),
            self.reconcile,
        );
        self.wait_until_listening();
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.kill();
    }
}
