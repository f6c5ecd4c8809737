//! Crash torture on PostgreSQL: worker processes drive eight conversations
//! concurrently on one database (a schema of its own on the test server)
//! and are killed with SIGKILL at seeded random moments, again and again;
//! each next worker recovers every held admission
//! (`recover_after_owner_exit` with `RetryInterruptedTurn`) and goes on with
//! the remaining requests; a last worker, never killed, finishes everything.
//!
//! The SQLite torture (`crates/turnstile/tests/crash_torture.rs`) is the
//! model: the plan, the scripted model and the effect tools are its
//! `torture_support`, included by path; what a SIGKILL leaves is read the
//! same way. On PostgreSQL the server outlives the worker: after every kill
//! the parent waits until the server has ended every backend of the dead
//! worker (a commit it had sent finishes or rolls back first), then reads
//! the schema in one snapshot through a pool of its own: the consistency
//! rules of `durability::consistency_violations` (PostgreSQL's stand-in for
//! SQLite's integrity check), the tool-call journal, the requests and the
//! held admissions, and the side-effect log. At the end every conversation
//! must hold exactly what a crash-free run of the same seeded plan commits
//! on `SqliteStore::in_memory()`; no journaled tool call may have run again;
//! and every request's usage must be the sum of one recorded model answer
//! per turn.
//!
//! `TURNSTILE_TORTURE_KILLS` (default 50) and `TURNSTILE_TORTURE_SEED`
//! (default fixed, decimal or `0x` hex) choose the kill count and the seed.
//!
//! The workers are this test binary, re-run with `--ignored --exact
//! torture_worker`, told the database by environment (they never start a
//! server of their own).
#![cfg(unix)]

#[path = "../../turnstile/tests/torture_support/mod.rs"]
#[allow(dead_code)]
mod torture_support;

#[allow(dead_code)]
mod durability;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use durability::{Hooked, TraceHook};
use sqlx::{Connection, PgPool, Row};
use torture_support::{namespace, ConversationPlan, Plan, RequestPlan, Rng, Tracer};
use turnstile::store::{JournalStatus, RequestStatus, RunStatus, StoredOutcome};
use turnstile::{
    AgentSession, CheckpointPhase, ContextPolicy, PostgresOptions, PostgresStore, RequestId,
    ResumePolicy, RunContext, RunId, Store,
};
use turnstile_test_postgres::Server;

const DEFAULT_KILLS: u64 = 50;
const DEFAULT_SEED: u64 = 0x7475_726e_7374_696c;
/// The longest wait for a worker to get ready (twice this for the last
/// worker to finish).
const PATIENCE: Duration = Duration::from_secs(60);
/// Kills land up to this long after the worker says it is ready.
const MAX_KILL_DELAY_MS: u64 = 300;
/// Requests per conversation at the start; whenever the workers commit all
/// of them before the kill count is reached, every conversation gets this
/// many more.
const REQUESTS_PER_ROUND: usize = 3;
/// One kill in this many lands on a timer from the spawn instead, often
/// before or while the worker connects (and migrates, the first time).
const EARLY_KILL_ONE_IN: u64 = 8;
/// SIGKILL's number on every unix.
const SIGKILL: i32 = 9;
const LOG: &str = "effects.log";
const SCHEMA: &str = "torture";

struct Settings {
    kills: u64,
    seed: u64,
}

impl Settings {
    fn from_env() -> Self {
        let kills = env_number("TURNSTILE_TORTURE_KILLS", DEFAULT_KILLS);
        assert!(kills >= 1, "TURNSTILE_TORTURE_KILLS must be at least 1");
        let seed = env_number("TURNSTILE_TORTURE_SEED", DEFAULT_SEED);
        Self { kills, seed }
    }
}

fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Err(std::env::VarError::NotPresent) => default,
        Err(e) => panic!("{name}: {e}"),
        Ok(text) => {
            let text = text.trim();
            let parsed = match text.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => text.parse(),
            };
            parsed.unwrap_or_else(|e| panic!("{name}={text:?} is not a number: {e}"))
        }
    }
}

/// The store every worker opens, and the parent for its final checks.
fn options(url: &str) -> PostgresOptions {
    PostgresOptions {
        schema: Some(SCHEMA.into()),
        pool_size: 8,
        ..PostgresOptions::new(url)
    }
}

// ---------------------------------------------------------------------------
// The worker (child process)
// ---------------------------------------------------------------------------

/// The child: recovers every held request of the plan and runs the rest,
/// eight conversations at once, until it is killed or done. Does nothing
/// unless started by the test below.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child process of the crash torture test"]
async fn torture_worker() {
    let Ok(url) = std::env::var("TORTURE_URL") else {
        return;
    };
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| panic!("{name} unset: run by crash_torture only"))
    };
    let dir = PathBuf::from(var("TORTURE_DIR"));
    let seed: u64 = var("TORTURE_SEED").parse().expect("seed");
    let requests: usize = var("TORTURE_REQUESTS").parse().expect("requests");
    let plan = Plan::new(seed, requests);
    // A panic anywhere (a conversation task included) is reported on the
    // trace at once: a kill may come before the task's result is joined.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        println!("@panic {}", info.to_string().replace('\n', " | "));
        default_hook(info);
    }));
    let store: Arc<dyn Store> = Arc::new(
        PostgresStore::connect_with(options(&url))
            .await
            .unwrap_or_else(|e| panic!("worker could not connect: {e}")),
    );
    println!("@ready");
    let log = dir.join(LOG);
    let tasks: Vec<_> = plan
        .conversations
        .into_iter()
        .map(|conversation| {
            let (store, log) = (store.clone(), log.clone());
            tokio::spawn(async move {
                let c = conversation.index;
                let result = drive(store, conversation, log).await;
                if let Err(e) = &result {
                    // Reported at once: a kill may come before the join.
                    println!("@{c} failed {e}");
                }
                result
            })
        })
        .collect();
    let mut failures = Vec::new();
    for task in tasks {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(e),
            Err(e) => failures.push(format!("conversation task failed: {e}")),
        }
    }
    assert!(failures.is_empty(), "worker failures: {failures:#?}");
    println!("@done");
}

/// Runs a conversation's requests in order: a held one is recovered, a
/// committed one skipped, a new one run.
async fn drive(
    store: Arc<dyn Store>,
    conversation: ConversationPlan,
    log: PathBuf,
) -> Result<(), String> {
    let c = conversation.index;
    let tracer = Tracer { enabled: true };
    let (agent, _) = torture_support::agent(&conversation, &log, true, tracer);
    let traced: Arc<dyn Store> = Arc::new(Hooked {
        inner: store,
        hook: Arc::new(TraceHook {
            conversation: c,
            tracer,
        }),
    });
    let session = AgentSession::new(
        agent,
        traced.clone(),
        conversation.id,
        namespace(),
        ContextPolicy::default(),
    );
    for request in &conversation.requests {
        let what = format!("conversation {c} request {}", request.index);
        let status = traced
            .request(request.id)
            .await
            .map_err(|e| format!("{what}: reading the request: {e}"))?
            .map(|record| record.status);
        let outcome = match status {
            Some(RequestStatus::Completed) => continue,
            Some(RequestStatus::Abandoned) => return Err(format!("{what} was abandoned")),
            None => {
                session
                    .run(request.id, &request.input, RunContext::default())
                    .await
            }
            Some(RequestStatus::Active) => {
                let admission = traced
                    .admission(conversation.id)
                    .await
                    .map_err(|e| format!("{what}: reading the admission: {e}"))?;
                tracer.event(c, &format!("recover {}", request.id));
                session
                    .recover_after_owner_exit(
                        request.id,
                        &request.input,
                        RunContext::default(),
                        admission.revision,
                        ResumePolicy::RetryInterruptedTurn,
                    )
                    .await
            }
        }
        .map_err(|e| format!("{what}: {e}"))?;
        if outcome.replayed {
            return Err(format!("{what}: an uncommitted request was replayed"));
        }
        tracer.event(c, &format!("committed {}", request.id));
    }
    tracer.event(c, "finished");
    Ok(())
}

// ---------------------------------------------------------------------------
// Running and killing workers
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum KillAt {
    /// This long after the worker printed `@ready`.
    AfterReady(Duration),
    /// This long after the spawn, ready or not.
    AfterSpawn(Duration),
}

/// What one worker process did: its trace (the text after `@` of each
/// line) and whether the SIGKILL ended it.
struct Life {
    trace: Vec<String>,
    killed: bool,
}

struct Target<'a> {
    url: &'a str,
    dir: &'a Path,
}

fn run_worker(target: &Target<'_>, seed: u64, requests: usize, kill: Option<KillAt>) -> Life {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--ignored",
            "--exact",
            "torture_worker",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("TORTURE_URL", target.url)
        .env("TORTURE_DIR", target.dir)
        .env("TORTURE_SEED", seed.to_string())
        .env("TORTURE_REQUESTS", requests.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn a worker");
    let spawned = Instant::now();
    let stdout = child.stdout.take().expect("piped stdout");
    let (lines, received) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            // The harness prints `test torture_worker ... ` before the
            // first trace line, on the same line.
            if let Some((_, trace)) = line.split_once('@') {
                if lines.send(trace.to_owned()).is_err() {
                    break;
                }
            }
        }
    });
    let mut trace = Vec::new();
    match kill {
        Some(KillAt::AfterSpawn(delay)) => {
            std::thread::sleep(delay.saturating_sub(spawned.elapsed()));
            child.kill().expect("SIGKILL the worker");
        }
        Some(KillAt::AfterReady(delay)) => {
            loop {
                match received.recv_timeout(PATIENCE) {
                    Ok(line) => {
                        let ready = line == "ready";
                        trace.push(line);
                        if ready {
                            break;
                        }
                    }
                    // Exited without getting ready: the status below says why.
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        let _ = child.kill();
                        panic!("a worker was not ready within {PATIENCE:?}");
                    }
                }
            }
            std::thread::sleep(delay);
            child.kill().expect("SIGKILL the worker");
        }
        None => {
            // Not killed: it must finish, and not hang.
            while child.try_wait().expect("poll the worker").is_none() {
                if spawned.elapsed() > 2 * PATIENCE {
                    child.kill().expect("SIGKILL the hung worker");
                    panic!("the last worker did not finish within {:?}", 2 * PATIENCE);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    let status = child.wait().expect("wait for the worker");
    reader.join().expect("stdout reader");
    trace.extend(received.try_iter());
    let done = trace.iter().any(|line| line == "done");
    let killed = status.signal() == Some(SIGKILL);
    if !killed {
        assert!(
            status.success() && done,
            "a worker failed ({status}); the end of its trace: {:#?}",
            &trace[trace.len().saturating_sub(40)..]
        );
    }
    Life { trace, killed }
}

/// Waits until the server has ended every backend of the dead worker
/// (turnstile's connections are named `turnstile`): a statement it was
/// running, a commit included, has then finished or rolled back, so the
/// snapshot that follows is what the kill left.
async fn wait_for_worker_backends_to_end(pool: &PgPool) -> Duration {
    let started = Instant::now();
    loop {
        let left: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = 'turnstile'",
        )
        .fetch_one(pool)
        .await
        .expect("read pg_stat_activity");
        if left == 0 {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{left} backends of a killed worker still open after 20 s"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

// ---------------------------------------------------------------------------
// What the parent reads after every worker
// ---------------------------------------------------------------------------

/// Input, output, cache-read and cache-write tokens as stored.
type UsageColumns = ([Option<i64>; 4], [Option<i64>; 4]);

/// The schema and the side-effect log after a worker's death.
#[derive(Clone, Debug, Default)]
struct Snapshot {
    /// Broken consistency rules (must stay empty).
    violations: Vec<String>,
    consistency_checked: bool,
    /// Idempotency keys journaled with a result (completed or failed).
    journaled: HashSet<String>,
    /// Idempotency keys journaled as requested, without a result.
    requested: HashSet<String>,
    /// Executions per idempotency key, from the side-effect log.
    effects: HashMap<String, usize>,
    effect_lines: usize,
    completed: HashSet<RequestId>,
    active: HashSet<RequestId>,
    /// The requests holding an admission, with the admission's usage and
    /// the usage of its run's latest checkpoint (none before a first turn).
    held: HashMap<RequestId, UsageColumns>,
}

impl Snapshot {
    /// Reads everything in one repeatable-read transaction: one snapshot.
    async fn take(pool: &PgPool, dir: &Path) -> Self {
        let mut snapshot = Self {
            effects: durability::effects_in(&dir.join(LOG)),
            ..Self::default()
        };
        snapshot.effect_lines = snapshot.effects.values().sum();
        let mut conn = pool.acquire().await.expect("an inspection connection");
        let mut tx = conn.begin().await.expect("begin");
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .execute(&mut *tx)
            .await
            .expect("repeatable read");
        let has_schema: bool = sqlx::query_scalar(
            "SELECT to_regclass('tool_calls') IS NOT NULL AND to_regclass('admissions') IS NOT NULL",
        )
        .fetch_one(&mut *tx)
        .await
        .expect("read the schema");
        if !has_schema {
            // Killed before the first migration committed.
            return snapshot;
        }
        snapshot.violations = durability::consistency_violations(&mut tx).await;
        snapshot.consistency_checked = true;
        let calls = sqlx::query("SELECT request_id, turn, call_id, status FROM tool_calls")
            .fetch_all(&mut *tx)
            .await
            .expect("read the tool-call journal");
        for row in calls {
            let request: uuid::Uuid = row.get("request_id");
            let turn: i64 = row.get("turn");
            let call: Vec<u8> = row.get("call_id");
            let status: String = row.get("status");
            let key = format!(
                "{}/{turn}/{}",
                request.hyphenated(),
                String::from_utf8(call).expect("a UTF-8 call id")
            );
            match status.as_str() {
                "requested" => snapshot.requested.insert(key),
                "completed" | "failed" => snapshot.journaled.insert(key),
                other => panic!("journal row {key} has status {other:?}"),
            };
        }
        let requests = sqlx::query("SELECT request_id, status FROM requests")
            .fetch_all(&mut *tx)
            .await
            .expect("read the requests");
        for row in requests {
            let id = RequestId::from_uuid(row.get("request_id")).expect("request id");
            let status: String = row.get("status");
            match status.as_str() {
                "completed" => snapshot.completed.insert(id),
                "active" => snapshot.active.insert(id),
                other => panic!("request {id} is {other}"),
            };
        }
        // Each held admission's usage (what `recovery_usage` reports) and
        // the usage of its run's latest checkpoint.
        let held = sqlx::query(
            "SELECT a.active_request_id AS request,
                    a.input_tokens AS ai, a.output_tokens AS ao,
                    a.cache_read_tokens AS ar, a.cache_write_tokens AS aw,
                    c.input_tokens AS ci, c.output_tokens AS co,
                    c.cache_read_tokens AS cr, c.cache_write_tokens AS cw
             FROM admissions a
             LEFT JOIN loop_checkpoints c ON c.conversation_id = a.conversation_id
                 AND c.run_id = a.run_id
                 AND c.turn = (SELECT MAX(turn) FROM loop_checkpoints
                               WHERE conversation_id = a.conversation_id AND run_id = a.run_id)
             WHERE a.active_request_id IS NOT NULL",
        )
        .fetch_all(&mut *tx)
        .await
        .expect("read the admissions");
        for row in held {
            let id = RequestId::from_uuid(row.get("request")).expect("request id");
            let usage = |cols: [&str; 4]| cols.map(|col| row.get::<Option<i64>, _>(col));
            let admission = usage(["ai", "ao", "ar", "aw"]);
            let checkpoint = usage(["ci", "co", "cr", "cw"]);
            snapshot.held.insert(id, (admission, checkpoint));
        }
        tx.rollback().await.expect("end the snapshot");
        snapshot
    }
}

// ---------------------------------------------------------------------------
// Counters
// ---------------------------------------------------------------------------

#[derive(Default)]
struct Stats {
    kills: u64,
    early_kills: u64,
    /// Kills that landed after every conversation had finished: not counted.
    idle_kills: u64,
    /// Workers that finished everything before their kill: not counted.
    unkilled_workers: u64,
    rounds_of_requests: usize,
    worker_runs: u64,
    consistency_checks: u64,
    /// Where each conversation stood when a kill landed (8 per kill).
    landings: BTreeMap<String, u64>,
    kills_with_a_tool_in_flight: u64,
    kills_with_a_commit_in_flight: u64,
    /// Admissions found held after a kill (summed over kills).
    held_after_kills: usize,
    recoveries: u64,
    recoveries_after_an_effect_without_journal: u64,
    /// Committed requests by whether they were ever recovered.
    commits: BTreeMap<&'static str, u64>,
    /// Calls that ran again although journaled before the kill (must stay
    /// empty).
    journaled_reruns: Vec<String>,
    requests_committed_under_kills: usize,
    requests_left_for_the_last_worker: usize,
    model_calls: u64,
    reexecuted_unjournaled_calls: u64,
    journaled_calls_checked: usize,
    /// The longest wait for a dead worker's backends to end.
    longest_backend_wait: Duration,
}

impl Stats {
    fn land(&mut self, landing: impl Into<String>) {
        *self.landings.entry(landing.into()).or_default() += 1;
    }

    fn landed(&self, prefix: &str) -> u64 {
        self.landings
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, n)| n)
            .sum()
    }
}

/// Checks what one worker life did between two snapshots, and counts where
/// its kill landed.
fn check_life(
    life_no: u64,
    life: &Life,
    before: &Snapshot,
    after: &Snapshot,
    known_keys: &HashSet<String>,
    stats: &mut Stats,
) {
    let at = format!("after worker {life_no}");
    stats.consistency_checks += u64::from(after.consistency_checked);
    stats.journaled_calls_checked += before.journaled.len();
    assert!(
        after.violations.is_empty(),
        "{at}: the schema is inconsistent: {:#?}",
        after.violations
    );
    for key in &before.journaled {
        assert!(
            after.journaled.contains(key),
            "{at}: journaled call {key} lost its result"
        );
    }
    for request in &before.completed {
        assert!(
            after.completed.contains(request),
            "{at}: committed request {request} is no longer completed"
        );
    }
    assert_eq!(
        after.held.keys().copied().collect::<HashSet<_>>(),
        after.active,
        "{at}: the active requests are not exactly those holding an admission"
    );
    for (request, (admission, checkpoint)) in &after.held {
        // Before its run's first checkpoint a request has spent nothing.
        let latest = checkpoint.map(|tokens| tokens.or(Some(0)));
        assert_eq!(
            *admission, latest,
            "{at}: the recovery usage of {request} is not its latest checkpoint's"
        );
    }
    for key in &after.journaled {
        assert!(
            after.effects.get(key).copied().unwrap_or(0) >= 1,
            "{at}: {key} is journaled but its effect never happened"
        );
    }
    for (key, &count) in &after.effects {
        assert!(known_keys.contains(key), "{at}: unknown effect key {key:?}");
        let earlier = before.effects.get(key).copied().unwrap_or(0);
        assert!(count >= earlier, "{at}: the side-effect log shrank");
        let added = count - earlier;
        assert!(added <= 1, "{at}: {key} ran {added} times in one worker");
        if added == 1 && before.journaled.contains(key) {
            // Reported (with the counts) and failed at the end.
            stats.journaled_reruns.push(format!("{at}: {key}"));
        } else if added == 1 && earlier >= 1 {
            // Ran before, never journaled, ran again: at least once.
            stats.reexecuted_unjournaled_calls += 1;
        }
    }

    // Where the kill landed, per conversation: the innermost open step.
    let mut open: HashMap<usize, Vec<(String, String)>> = HashMap::new();
    let mut finished: HashSet<usize> = HashSet::new();
    let mut ready = false;
    let mut recovered = 0;
    for line in &life.trace {
        match line.as_str() {
            "ready" => ready = true,
            "done" => {}
            _ => {
                let (c, event) = line.split_once(' ').expect("trace line");
                if c == "panic" {
                    panic!("{at}: the worker panicked: {event}");
                }
                let c: usize = c.parse().expect("conversation index");
                if let Some(error) = event.strip_prefix("failed ") {
                    panic!("{at}: conversation {c} failed: {error}");
                }
                let mut words = event.splitn(3, ' ');
                match (words.next(), words.next(), words.next()) {
                    (Some("+"), Some(kind), detail) => open
                        .entry(c)
                        .or_default()
                        .push((kind.to_owned(), detail.unwrap_or("").to_owned())),
                    (Some("-"), Some(kind), None) => {
                        // Steps nest, except reads a session makes at once:
                        // the latest open step of that kind ends.
                        let steps = open.entry(c).or_default();
                        let at_kind = steps.iter().rposition(|(k, _)| k == kind);
                        assert!(
                            at_kind.is_some(),
                            "{at}: unbalanced trace: {kind} never began"
                        );
                        steps.remove(at_kind.unwrap_or_default());
                    }
                    (Some("recover"), Some(request), None) => {
                        stats.recoveries += 1;
                        recovered += 1;
                        let request: RequestId = request.parse().expect("request id");
                        assert!(
                            before.held.contains_key(&request),
                            "{at}: recovered {request}, which held no admission before"
                        );
                        let unjournaled = before.requested.iter().any(|key| {
                            key.starts_with(&request.to_string())
                                && before.effects.contains_key(key)
                        });
                        if unjournaled {
                            stats.recoveries_after_an_effect_without_journal += 1;
                        }
                    }
                    (Some("committed"), Some(_), None) => {}
                    (Some("finished"), None, None) => {
                        finished.insert(c);
                    }
                    _ => panic!("{at}: unexpected trace line {line:?}"),
                }
            }
        }
    }
    if !life.killed {
        assert_eq!(
            recovered,
            before.held.len(),
            "{at}: a worker that ran to its end recovers every held admission"
        );
        for (c, steps) in &open {
            assert!(
                steps.is_empty(),
                "{at}: conversation {c} left {steps:?} open"
            );
        }
        return;
    }
    if finished.len() == torture_support::CONVERSATIONS {
        // Killed after every conversation finished: no work was interrupted.
        stats.idle_kills += 1;
        return;
    }
    stats.kills += 1;
    stats.held_after_kills += after.held.len();
    if !ready {
        stats.early_kills += 1;
    }
    let mut tool_in_flight = false;
    let mut commit_in_flight = false;
    for c in 0..torture_support::CONVERSATIONS {
        let top = open.get(&c).and_then(|steps| steps.last());
        let landing = match top {
            None if !ready => "starting up".to_owned(),
            None if finished.contains(&c) => "conversation finished".to_owned(),
            None => "between steps".to_owned(),
            Some((kind, key)) if kind == "tool" => {
                tool_in_flight = true;
                assert!(
                    !after.journaled.contains(key),
                    "{at}: {key} was journaled while its tool was still running"
                );
                let ran = after.effects.get(key).copied().unwrap_or(0)
                    > before.effects.get(key).copied().unwrap_or(0);
                if ran {
                    "tool: after its effect, unjournaled".to_owned()
                } else {
                    "tool: before its effect".to_owned()
                }
            }
            Some((kind, request)) if kind == "write:commit" => {
                commit_in_flight = true;
                let request: RequestId = request.parse().expect("request id");
                if after.completed.contains(&request) {
                    "write:commit (durable)".to_owned()
                } else {
                    "write:commit (rolled back)".to_owned()
                }
            }
            Some((kind, _)) if kind == "model" => "model call".to_owned(),
            Some((kind, _)) if kind.starts_with("read:") => "store read".to_owned(),
            Some((kind, _)) => kind.clone(),
        };
        stats.land(landing);
    }
    stats.kills_with_a_tool_in_flight += u64::from(tool_in_flight);
    stats.kills_with_a_commit_in_flight += u64::from(commit_in_flight);
}

// ---------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------

#[test]
fn sigkilled_workers_on_eight_conversations_commit_exactly_what_a_crash_free_run_commits() {
    let settings = Settings::from_env();
    let seed = settings.seed;
    println!(
        "crash torture (PostgreSQL): seed {seed} (0x{seed:x}), {} kills, {} conversations \
         (set TURNSTILE_TORTURE_SEED / TURNSTILE_TORTURE_KILLS to change)",
        settings.kills,
        torture_support::CONVERSATIONS,
    );
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path();
    let url = Server::shared().fresh_database();
    let target = Target { url: &url, dir };
    let pool = {
        let _runtime = rt.enter();
        durability::inspect_pool(&url, SCHEMA)
    };

    let mut requests = REQUESTS_PER_ROUND;
    let mut plan = Plan::new(seed, requests);
    let mut known_keys = planned_keys(&plan);
    let mut rng = Rng::derive(seed, &[u64::from(u32::MAX), 0x6b69_6c6c]);
    let mut stats = Stats {
        rounds_of_requests: 1,
        ..Stats::default()
    };
    let mut before = Snapshot::default();
    let mut life_no = 0;
    while stats.kills < settings.kills {
        let kill = if rng.range(1, EARLY_KILL_ONE_IN) == 1 {
            KillAt::AfterSpawn(Duration::from_millis(rng.range(0, 40)))
        } else {
            KillAt::AfterReady(Duration::from_millis(rng.range(0, MAX_KILL_DELAY_MS)))
        };
        life_no += 1;
        let life = run_worker(&target, seed, requests, Some(kill));
        stats.worker_runs += 1;
        stats.unkilled_workers += u64::from(!life.killed);
        let waited = rt.block_on(wait_for_worker_backends_to_end(&pool));
        stats.longest_backend_wait = stats.longest_backend_wait.max(waited);
        let after = rt.block_on(Snapshot::take(&pool, dir));
        check_life(life_no, &life, &before, &after, &known_keys, &mut stats);
        stats.model_calls += count_model_calls(&life);
        before = after;
        if plan
            .requests()
            .all(|(_, r)| before.completed.contains(&r.id))
        {
            // The work ran out before the kills did: a round more.
            requests += REQUESTS_PER_ROUND;
            stats.rounds_of_requests += 1;
            plan = Plan::new(seed, requests);
            known_keys = planned_keys(&plan);
        }
    }
    let total_requests = plan.requests().count();
    stats.requests_committed_under_kills = before.completed.len();
    stats.requests_left_for_the_last_worker = total_requests - before.completed.len();

    // The last worker is not killed: it recovers and finishes everything.
    life_no += 1;
    let last = run_worker(&target, seed, requests, None);
    stats.worker_runs += 1;
    rt.block_on(wait_for_worker_backends_to_end(&pool));
    let after = rt.block_on(Snapshot::take(&pool, dir));
    check_life(life_no, &last, &before, &after, &known_keys, &mut stats);
    stats.model_calls += count_model_calls(&last);
    let kills_done = started.elapsed();

    // The crash-free reference of the same (final) plan, on SQLite.
    let reference = rt.block_on(durability::reference_run(&plan, &dir.join("reference.log")));
    assert_eq!(
        reference.effects.keys().cloned().collect::<HashSet<_>>(),
        known_keys,
        "the reference ran every planned call"
    );
    assert!(
        reference.effects.values().all(|&n| n == 1),
        "the reference ran a call twice"
    );

    let journaled_calls = rt.block_on(final_checks(
        &url, &pool, dir, &plan, &reference, &mut stats,
    ));

    // The side-effect log: every planned call ran; a call ran more than
    // once only after a kill found it unjournaled (checked per worker by
    // `check_life`); the replays in `final_checks` ran nothing.
    let log = rt.block_on(Snapshot::take(&pool, dir));
    rt.block_on(pool.close());
    let extra: usize = log.effects.values().map(|n| n - 1).sum();
    let turns: usize = plan.requests().map(|(_, r)| r.turns.len()).sum();
    let duplicated_keys = log.effects.values().filter(|&&n| n > 1).count();
    let recovered = stats.commits.get("recovered").copied().unwrap_or(0);
    let say = |name: &str, value: &dyn std::fmt::Display| {
        println!("crash torture (PostgreSQL): {name}: {value}");
    };
    say("seed", &seed);
    say("kills (SIGKILL, work in progress)", &stats.kills);
    say("  before the worker was ready", &stats.early_kills);
    say(
        "  with a tool call in flight",
        &stats.kills_with_a_tool_in_flight,
    );
    say(
        "  with a commit in flight",
        &stats.kills_with_a_commit_in_flight,
    );
    say("  after all work (not counted)", &stats.idle_kills);
    say("worker processes", &stats.worker_runs);
    say(
        "  done before their kill (not counted)",
        &stats.unkilled_workers,
    );
    say(
        "consistency checks (all rules held)",
        &stats.consistency_checks,
    );
    say(
        "longest wait for a dead worker's backends",
        &format!("{:?}", stats.longest_backend_wait),
    );
    let shape = format!("{} x {requests}", torture_support::CONVERSATIONS);
    say("conversations x requests", &shape);
    say(
        "  rounds of requests (more when the work ran out)",
        &stats.rounds_of_requests,
    );
    say("requests committed", &total_requests);
    say("  by killed workers", &stats.requests_committed_under_kills);
    say(
        "  by the last worker",
        &stats.requests_left_for_the_last_worker,
    );
    say("  after one or more recoveries", &recovered);
    say(
        "admissions held after a kill (usage = latest checkpoint)",
        &stats.held_after_kills,
    );
    say("recoveries (RetryInterruptedTurn)", &stats.recoveries);
    say(
        "  of a request with an unjournaled effect",
        &stats.recoveries_after_an_effect_without_journal,
    );
    say("model answers recorded (usage counted once each)", &turns);
    say("model calls made", &stats.model_calls);
    let lost = stats.model_calls.saturating_sub(turns as u64);
    say("  lost to kills (not in usage)", &lost);
    say("tool calls journaled completed", &journaled_calls);
    say(
        "journaled calls checked not to run again (call x worker)",
        &stats.journaled_calls_checked,
    );
    say("side-effect lines", &log.effect_lines);
    say("  distinct keys", &log.effects.len());
    say(
        "  keys run more than once (unjournaled at a kill)",
        &duplicated_keys,
    );
    say("  duplicated effects of unjournaled calls", &extra);
    say(
        "  duplicated effects of journaled calls",
        &stats.journaled_reruns.len(),
    );
    say(
        "elapsed (kills / total)",
        &format!(
            "{:.1} s / {:.1} s",
            kills_done.as_secs_f64(),
            started.elapsed().as_secs_f64()
        ),
    );
    for (landing, n) in &stats.landings {
        println!("crash torture (PostgreSQL): conversations at a kill: {landing}: {n}");
    }

    assert_eq!(
        log.effect_lines, after.effect_lines,
        "replaying committed requests ran a tool"
    );
    assert_eq!(
        log.effects.keys().cloned().collect::<HashSet<_>>(),
        known_keys,
        "the side-effect log holds exactly the planned calls"
    );
    assert_eq!(
        extra,
        stats.reexecuted_unjournaled_calls as usize + stats.journaled_reruns.len(),
        "every repeated effect is a re-run of a call that was unjournaled at a kill"
    );
    assert!(
        stats.model_calls >= turns as u64,
        "fewer model calls ({}) than recorded answers ({turns})",
        stats.model_calls
    );

    // Coverage: the kills hit every kind of step, and recovery had work.
    assert_eq!(stats.kills, settings.kills);
    assert!(
        stats.journaled_reruns.is_empty(),
        "journaled calls ran again: {:#?}",
        stats.journaled_reruns
    );
    assert!(
        stats.requests_left_for_the_last_worker > 0,
        "every request committed before the last kill"
    );
    assert!(stats.recoveries > 0, "no held request was ever recovered");
    if settings.kills >= DEFAULT_KILLS {
        for step in [
            "model call",
            "tool: after its effect",
            "write:record_tool_result",
            "write:finish_turn",
            "write:commit",
        ] {
            assert!(stats.landed(step) > 0, "no kill landed in a {step:?} step");
        }
    }
}

fn planned_keys(plan: &Plan) -> HashSet<String> {
    plan.requests().flat_map(|(_, r)| r.keys()).collect()
}

fn count_model_calls(life: &Life) -> u64 {
    life.trace
        .iter()
        .filter(|line| {
            line.split(' ').nth(1) == Some("+") && line.split(' ').nth(2) == Some("model")
        })
        .count() as u64
}

/// Transcripts, outcomes, journal and replays of every conversation
/// against the crash-free reference (`durability::assert_plan_committed`),
/// then every request's runs and checkpoints. Returns the number of
/// journaled tool calls.
async fn final_checks(
    url: &str,
    pool: &PgPool,
    dir: &Path,
    plan: &Plan,
    reference: &durability::Reference,
    stats: &mut Stats,
) -> usize {
    let pg = PostgresStore::connect_with(options(url))
        .await
        .expect("reconnect");
    let store: Arc<dyn Store> = Arc::new(pg.clone());
    let journaled = durability::assert_plan_committed(
        store.clone(),
        plan,
        reference,
        &HashSet::new(),
        &dir.join(LOG),
    )
    .await;
    for (_, request) in plan.requests() {
        let stored = store
            .request(request.id)
            .await
            .expect("request")
            .and_then(|r| r.outcome)
            .expect("committed");
        check_request(&*store, pool, request, &stored).await;
        let runs = runs_of(&*store, pool, request.id).await;
        let kind = if runs.len() > 1 { "recovered" } else { "fresh" };
        *stats.commits.entry(kind).or_default() += 1;
    }
    pg.close().await;
    journaled
}

/// The runs of a request, oldest first, through the public API (the ids
/// from the `runs` table).
async fn runs_of(
    store: &dyn Store,
    pool: &PgPool,
    request: RequestId,
) -> Vec<turnstile::store::RunRecord> {
    let ids: Vec<uuid::Uuid> = sqlx::query_scalar("SELECT run_id FROM runs WHERE request_id = $1")
        .bind(request.as_uuid())
        .fetch_all(pool)
        .await
        .expect("list runs");
    let mut runs = Vec::new();
    for id in ids {
        let id = RunId::from_uuid(id).expect("run id");
        runs.push(store.run(id).await.expect("read run").expect("listed run"));
    }
    runs.sort_by_key(|r| r.run_id);
    runs
}

/// The committed run, its chain of predecessors and every checkpoint: one
/// recorded model answer per turn, its usage counted once.
async fn check_request(
    store: &dyn Store,
    pool: &PgPool,
    request: &RequestPlan,
    stored: &StoredOutcome,
) {
    let what = format!("request {}", request.id);
    let runs = runs_of(store, pool, request.id).await;
    let by_id: HashMap<RunId, &turnstile::store::RunRecord> =
        runs.iter().map(|r| (r.run_id, r)).collect();
    // A single chain from the first run to the committing one.
    let mut chain = vec![stored.run_id];
    while let Some(from) = by_id[chain.last().expect("never empty")].resumed_from {
        assert!(by_id.contains_key(&from), "{what}: unknown predecessor");
        chain.push(from);
    }
    assert_eq!(chain.len(), runs.len(), "{what}: runs outside the chain");
    for run in &runs {
        let expected = if run.run_id == stored.run_id {
            RunStatus::Completed
        } else {
            RunStatus::Superseded
        };
        assert_eq!(run.status, expected, "{what}: run {}", run.run_id);
    }

    let usage = request.cumulative_usage();
    let calls = request.cumulative_calls();
    let last = request.turns.len();
    let mut recorded = vec![0usize; last + 1];
    let mut completed = 0;
    for run in &runs {
        for checkpoint in store.checkpoints(run.run_id).await.expect("checkpoints") {
            let t = checkpoint.turn as usize;
            assert!((1..=last).contains(&t), "{what}: checkpoint of turn {t}");
            let at = format!("{what}: run {} turn {t} {:?}", run.run_id, checkpoint.phase);
            let (want_usage, want_calls) = match checkpoint.phase {
                CheckpointPhase::TurnInFlight | CheckpointPhase::ModelPending => {
                    (usage[t - 1], calls[t - 1])
                }
                CheckpointPhase::ToolsInFlight | CheckpointPhase::ToolsPending => {
                    recorded[t] += 1;
                    (usage[t], calls[t - 1])
                }
                CheckpointPhase::Ready | CheckpointPhase::Completed => {
                    recorded[t] += 1;
                    (usage[t], calls[t])
                }
            };
            assert_eq!(checkpoint.usage, want_usage, "{at}: usage");
            assert_eq!(checkpoint.tool_calls_count, want_calls, "{at}: tool calls");
            if checkpoint.phase == CheckpointPhase::Completed {
                completed += 1;
                assert_eq!(run.run_id, stored.run_id, "{at}: completed by another run");
                assert_eq!(t, last, "{at}: completed before the last turn");
            }
        }
    }
    assert_eq!(completed, 1, "{what}: completed checkpoints");
    for (t, n) in recorded.iter().enumerate().skip(1) {
        assert!(*n >= 1, "{what}: no checkpoint recorded turn {t}'s answer");
    }
    assert_eq!(stored.usage, usage[last], "{what}: committed usage");
    assert_eq!(
        stored.tool_calls, calls[last],
        "{what}: committed tool calls"
    );
    // The journal: one row per planned call, with its result, by a run of
    // the request (`assert_plan_committed` checked the calls and statuses).
    for (i, _) in request.turns.iter().enumerate() {
        let t = u32::try_from(i + 1).expect("small");
        for entry in store.journal(request.id, t).await.expect("journal") {
            assert_eq!(entry.status, JournalStatus::Completed, "{what}: {entry:?}");
            assert!(by_id.contains_key(&entry.run_id), "{what}: {entry:?}");
        }
    }
}
