//! Shared helpers of the CLI's tests: running the built `turnstile` binary
//! on temp databases and reading the result back through the store.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use turnstile::store::Admission;
use turnstile::{ConversationId, SqliteStore, Store};

/// What a finished command left behind.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// The stdout parsed as one JSON document.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not json ({e}): {:?}", self.stdout))
    }

    /// Asserts a failure with `code`, reported as exactly one `error:` line
    /// on stderr and nothing on stdout.
    pub fn assert_error(&self, code: i32, contains: &str) {
        assert_eq!(self.code, code, "{self:#?}");
        let lines: Vec<_> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line on stderr: {self:#?}");
        assert!(lines[0].starts_with("error: "), "{self:#?}");
        assert!(
            lines[0].to_lowercase().contains(&contains.to_lowercase()),
            "stderr should mention {contains:?}: {self:#?}"
        );
        assert!(self.stdout.is_empty(), "nothing on stdout: {self:#?}");
    }

    /// Asserts a `--json` failure with `code`: one `error:` line on stderr
    /// and one JSON error document on stdout, whose `kind`, `exit_code` and
    /// `message` agree with it. Returns the document.
    pub fn assert_json_error(&self, code: i32, contains: &str) -> serde_json::Value {
        assert_eq!(self.code, code, "{self:#?}");
        let lines: Vec<_> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line on stderr: {self:#?}");
        let line = lines[0].strip_prefix("error: ").expect("an error line");
        assert!(
            line.to_lowercase().contains(&contains.to_lowercase()),
            "stderr should mention {contains:?}: {self:#?}"
        );
        let doc = self.json();
        assert_eq!(doc["status"], "error", "{doc}");
        assert_eq!(doc["exit_code"], code, "{doc}");
        assert!(doc["kind"].is_string(), "{doc}");
        let message = doc["message"].as_str().expect("a message");
        assert!(
            message.to_lowercase().contains(&contains.to_lowercase()),
            "the document's message should mention {contains:?}: {doc}"
        );
        doc
    }

    pub fn assert_success(&self) {
        assert_eq!(self.code, 0, "{self:#?}");
        assert!(self.stderr.is_empty(), "nothing on stderr: {self:#?}");
    }
}

/// The binary, with a clean environment for logging and colour.
pub fn command(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_turnstile"));
    command
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("OPENAI_API_KEY")
        .env("NO_COLOR", "1");
    command
}

/// Runs the binary to completion with `stdin` as its input.
pub fn turnstile_with_stdin(args: &[&str], stdin: &str) -> Run {
    let mut child = command(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start turnstile");
    // A command that stops reading early (input over its limit) closes
    // the pipe: that is its answer, not a failure of the test.
    let written = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    if let Err(e) = written {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "write stdin: {e}");
    }
    let output = child.wait_with_output().unwrap();
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

/// Runs the binary to completion with an empty stdin.
pub fn turnstile(args: &[&str]) -> Run {
    turnstile_with_stdin(args, "")
}

/// Starts `turnstile serve` on `db` with `model` and `extra` flags, on a
/// free loopback port; the server and the address it printed.
pub fn start_serve(db: &str, model: &str, extra: &[&str]) -> (std::process::Child, String) {
    let mut args = vec![
        "serve",
        "--db",
        db,
        "--listen",
        "127.0.0.1:0",
        "--model",
        model,
    ];
    args.extend(extra);
    let mut server = command(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the server");
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let base = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("the address first: {line:?}"))
        .to_owned();
    (server, base)
}

/// Runs `input` as a new request on `conversation` of `db` with `model`,
/// which must commit.
pub fn commit_request(db: &Path, conversation: &str, model: &str, input: &str) {
    turnstile(&[
        "run",
        "--db",
        db.to_str().unwrap(),
        "--conversation",
        conversation,
        "--model",
        model,
        input,
    ])
    .assert_success();
}

/// Starts `args` (a human-mode `run`) and kills it with SIGKILL once it
/// prints a line containing `marker`; returns the lines it printed.
pub fn run_and_kill_at(args: &[&str], marker: &str) -> Vec<String> {
    let mut child = command(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start turnstile");
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let mut seen = Vec::new();
    for line in stdout.lines() {
        let line = line.unwrap();
        let found = line.contains(marker);
        seen.push(line);
        if found {
            child.kill().unwrap(); // SIGKILL on unix
            child.wait().unwrap();
            return seen;
        }
    }
    let status = child.wait().unwrap();
    panic!("exited ({status}) before printing {marker:?}: {seen:#?}");
}

/// Runs a command line the CLI printed, through bash, as a user pasting it.
pub fn pasted(line: &str) -> Run {
    let binary = env!("CARGO_BIN_EXE_turnstile");
    let line = line.trim();
    assert!(line.starts_with("turnstile "), "{line}");
    let output = Command::new("bash")
        .arg("-c")
        .arg(line.replacen("turnstile", &format!("'{binary}'"), 1))
        .env_remove("RUST_LOG")
        .env_remove("OPENAI_API_KEY")
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

/// The one line of `run`'s stdout that starts (after its indent) with
/// `prefix`.
pub fn printed<'a>(run: &'a Run, prefix: &str) -> &'a str {
    let lines: Vec<&str> = run
        .stdout
        .lines()
        .filter(|l| l.trim_start().starts_with(prefix))
        .collect();
    assert_eq!(lines.len(), 1, "one {prefix:?} line: {run:#?}");
    lines[0]
}

pub fn uuid() -> String {
    ConversationId::new().to_string()
}

/// Writes a scripted-model file.
pub fn script(dir: &Path, name: &str, replies: serde_json::Value) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, replies.to_string()).unwrap();
    path
}

/// `scripted:PATH`.
pub fn scripted(path: &Path) -> String {
    format!("scripted:{}", path.display())
}

/// Two turns: `add` 2 + 3, then the answer; 10+5 and 20+4 tokens.
pub fn add_script(dir: &Path) -> PathBuf {
    script(
        dir,
        "add.json",
        serde_json::json!([
            {"tool_calls": [{"id": "c1", "name": "add", "arguments": {"a": 2, "b": 3}}],
             "usage": {"input_tokens": 10, "output_tokens": 5}},
            {"text": "2 + 3 = 5", "usage": {"input_tokens": 20, "output_tokens": 4}}
        ]),
    )
}

pub async fn open(db: &Path) -> SqliteStore {
    SqliteStore::open(db).await.expect("open the test database")
}

pub async fn admission(db: &Path, conversation: &str) -> Admission {
    let store = open(db).await;
    store
        .admission(conversation.parse().unwrap())
        .await
        .expect("read the admission")
}

/// The built binary, where the user `nobody` may run it: in place when
/// every directory above it lets others through, else a copy in `dir`.
#[cfg(unix)]
pub fn binary_for_others(dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let binary = std::path::PathBuf::from(env!("CARGO_BIN_EXE_turnstile"));
    let others_may = |p: &std::path::Path| {
        std::fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o001 != 0)
    };
    if binary.ancestors().all(others_may) {
        return binary;
    }
    let copy = dir.join("turnstile");
    std::fs::copy(&binary, &copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    copy
}
