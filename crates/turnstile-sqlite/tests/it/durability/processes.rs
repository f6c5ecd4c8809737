//! Two OS processes racing for one conversation in one database file.
//!
//! The test re-runs its own test binary twice, filtered to this test and
//! with [`CHILD_DB`] set: each child opens the file, reports ready, waits for
//! "go" on stdin, then claims the conversation from [`TASKS_PER_CHILD`] tasks
//! at once and prints one line per result.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use tokio::sync::Barrier;
use turnstile::store::ClaimOutcome;
use turnstile::{ConversationId, Error, Revision, SqliteStore, Store};

use turnstile_conformance::support::{new_conversation, new_request, TestResult};

const CHILD_DB: &str = "TURNSTILE_TEST_CHILD_DB";
const CHILD_CONVERSATION: &str = "TURNSTILE_TEST_CHILD_CONVERSATION";
const TASKS_PER_CHILD: usize = 16;
const CHILDREN: usize = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_os_processes_claiming_one_file_database_admit_exactly_one() -> TestResult {
    if let Ok(path) = std::env::var(CHILD_DB) {
        return child(&path).await;
    }
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("shared.db");
    let store = SqliteStore::open(&path).await?;
    let conversation = new_conversation(&store).await?;

    let test_name = concat!(
        module_path!(),
        "::two_os_processes_claiming_one_file_database_admit_exactly_one"
    );
    // Test names are paths inside the test crate: drop the crate's name.
    let test_name = test_name.split_once("::").map_or(test_name, |(_, t)| t);
    let mut children = Vec::new();
    for _ in 0..CHILDREN {
        let child = Command::new(std::env::current_exe()?)
            .args(["--exact", test_name, "--nocapture", "--test-threads=1"])
            .env(CHILD_DB, &path)
            .env(CHILD_CONVERSATION, conversation.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        children.push(Watched::new(child));
    }
    for child in &mut children {
        child.wait_for_line(|l| l.ends_with("CHILD ready"))?;
    }
    // Both are connected and waiting: start them together.
    for child in &mut children {
        child.start()?;
    }

    let mut results = Vec::new();
    for child in children {
        let (out, err) = child.finish()?;
        assert!(
            !out.contains("database is locked") && !err.contains("database is locked"),
            "a caller saw \"database is locked\":\n{out}\n{err}"
        );
        results.extend(
            out.lines()
                .filter_map(|l| l.split_once("CHILD result ").map(|(_, r)| r.to_owned())),
        );
    }

    assert_eq!(results.len(), CHILDREN * TASKS_PER_CHILD, "{results:#?}");
    let admitted: Vec<_> = results
        .iter()
        .filter_map(|r| r.strip_prefix("admitted "))
        .collect();
    assert_eq!(admitted.len(), 1, "exactly one winner: {results:#?}");
    let strays: Vec<_> = results
        .iter()
        .filter(|r| !(r.starts_with("admitted ") || *r == "busy" || *r == "conflict"))
        .collect();
    assert!(strays.is_empty(), "unexpected results: {strays:#?}");

    let admission = store.admission(conversation).await?;
    assert_eq!(admission.revision, Revision(1));
    let holder = admission.active.expect("held by the winner");
    assert_eq!(holder.request_id.to_string(), admitted[0]);
    Ok(())
}

/// How long a child may take to connect, or to finish its claims.
const CHILD_DEADLINE: Duration = Duration::from_secs(60);

/// A child process whose stdout lines arrive on a channel, so the parent can
/// wait for them with a deadline instead of hanging on a stuck child.
struct Watched {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: String,
}

impl Watched {
    fn new(mut child: Child) -> Self {
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Watched {
            child,
            lines,
            seen: String::new(),
        }
    }

    /// Waits for a line matching `wanted`; kills the child on deadline or exit.
    fn wait_for_line(&mut self, wanted: impl Fn(&str) -> bool) -> TestResult {
        let deadline = Instant::now() + CHILD_DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push_str(&line);
                    self.seen.push('\n');
                    if wanted(&line) {
                        return Ok(());
                    }
                }
                Err(e) => {
                    let err = kill(&mut self.child);
                    panic!("child stopped or stalled ({e}):\n{}\n{err}", self.seen);
                }
            }
        }
    }

    /// Tells the child to claim.
    fn start(&mut self) -> TestResult {
        let mut stdin = self.child.stdin.take().expect("piped stdin");
        stdin.write_all(b"go\n")?;
        Ok(())
    }

    /// Waits for the child to exit successfully; returns its stdout and stderr.
    fn finish(mut self) -> Result<(String, String), Box<dyn std::error::Error + Send + Sync>> {
        let deadline = Instant::now() + CHILD_DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push_str(&line);
                    self.seen.push('\n');
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let err = kill(&mut self.child);
                    panic!("child stalled:\n{}\n{err}", self.seen);
                }
            }
        }
        let status = self.child.wait()?;
        let mut err = String::new();
        if let Some(mut stderr) = self.child.stderr.take() {
            stderr.read_to_string(&mut err)?;
        }
        assert!(
            status.success(),
            "child failed ({status}):\n{}\n{err}",
            self.seen
        );
        Ok((self.seen, err))
    }
}

/// Kills a child that failed to keep up; returns its stderr.
fn kill(child: &mut Child) -> String {
    child.kill().ok();
    child.wait().ok();
    let mut err = String::new();
    if let Some(mut stderr) = child.stderr.take() {
        stderr.read_to_string(&mut err).ok();
    }
    err
}

/// The child's side: claim at revision 0 from many tasks at once.
async fn child(path: &str) -> TestResult {
    let conversation: ConversationId = std::env::var(CHILD_CONVERSATION)?.parse()?;
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(path).await?);
    println!("CHILD ready");
    let go = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    })
    .await??;
    assert_eq!(go.trim_end(), "go");

    let start = Arc::new(Barrier::new(TASKS_PER_CHILD));
    let tasks: Vec<_> = (0..TASKS_PER_CHILD)
        .map(|i| {
            let (store, start) = (store.clone(), start.clone());
            tokio::spawn(async move {
                let claim = new_request(conversation, Revision(0), &format!("child task {i}"));
                start.wait().await;
                match store.claim(&claim).await {
                    Ok(ClaimOutcome::Admitted(f)) => format!("admitted {}", f.request_id),
                    Ok(ClaimOutcome::Existing(r)) => format!("existing {}", r.request_id),
                    Err(Error::Busy { .. }) => "busy".to_owned(),
                    Err(Error::Conflict { .. }) => "conflict".to_owned(),
                    Err(e) => format!("error {}", e.to_string().replace('\n', " ")),
                }
            })
        })
        .collect();
    for task in tasks {
        println!("CHILD result {}", task.await?);
    }
    Ok(())
}
