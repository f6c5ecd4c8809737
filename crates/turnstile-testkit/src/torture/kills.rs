//! The crash torture itself, on any backend: worker processes drive the
//! plan's eight conversations concurrently on one database and are killed
//! with SIGKILL at seeded random moments, again and again; each next worker
//! recovers every held admission (`recover_after_owner_exit` with
//! `RetryInterruptedTurn`) and goes on with the remaining requests; a last
//! worker, never killed, finishes everything.
//!
//! After every kill the parent reads what the kill left (`Snapshot`: the
//! backend's consistency check, the tool-call journal, the requests, the
//! held admissions, and the side-effect log) and checks the worker's life
//! against the one before (`check_life`). At the end every conversation
//! must hold exactly what a crash-free run of the same seeded plan commits;
//! no journaled tool call may have run again; and every request's usage
//! must be the sum of one recorded model answer per turn.
//!
//! What differs between the backends, a [`Backend`] says: how a worker is
//! told the database, what to wait for once a worker is dead, how the
//! database is read, and the store of the final checks.
//!
//! `TURNSTILE_TORTURE_KILLS` (default 50) and `TURNSTILE_TORTURE_SEED`
//! (default fixed, decimal or `0x` hex) choose the kill count and the seed;
//! the seed decides the plan and the kill moments (the moments are timers,
//! so what a kill interrupts still varies from run to run).
//!
//! The workers are the test binary, re-run to execute one ignored test
//! whose body is [`work`] (named with [`worker_test!`](crate::worker_test)). Every worker traces its
//! steps to stdout (see [`Tracer`]), which tells the parent where each kill
//! landed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use turnstile::store::RequestStatus;
use turnstile::{AgentSession, ContextPolicy, RequestId, ResumePolicy, RunContext, RunId, Store};

use super::checks::{
    assert_plan_committed, assert_transcript_follows_plan, check_request, effects_in,
    reference_run, runs_of, transcript_of, Reference,
};
use super::hooked::Hooked;
use super::{agent, namespace, ConversationPlan, Plan, Rng, Tracer};

pub const DEFAULT_KILLS: u64 = 50;
pub const DEFAULT_SEED: u64 = 0x7475_726e_7374_696c;
/// The longest wait for a worker to get ready (twice this for the last
/// worker to finish).
const PATIENCE: Duration = Duration::from_secs(60);
/// Requests per conversation at the start; whenever the workers commit all
/// of them before the kill count is reached, every conversation gets this
/// many more (a plan with more requests extends one with fewer).
const REQUESTS_PER_ROUND: usize = 3;
/// One kill in this many lands on a timer from the spawn instead, often
/// before or while the worker opens the crashed database.
const EARLY_KILL_ONE_IN: u64 = 8;
/// SIGKILL's number on every unix (no libc dependency for one constant).
const SIGKILL: i32 = 9;
/// The side-effect log, in the test's directory.
pub const LOG: &str = "effects.log";

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

// ---------------------------------------------------------------------------
// What differs between backends
// ---------------------------------------------------------------------------

/// The rows of a dead worker's database the parent reads; each backend
/// selects them with its own SQL.
#[derive(Default)]
pub struct Tables {
    /// What the backend's consistency check found broken (SQLite's
    /// `PRAGMA integrity_check`, PostgreSQL's consistency rules): must stay
    /// empty.
    pub broken: Vec<String>,
    /// Whether the check ran (not before the schema exists).
    pub checked: bool,
    /// `tool_calls`: request id, turn, call id, status.
    pub journal: Vec<(uuid::Uuid, i64, String, String)>,
    /// `requests`: request id, status.
    pub requests: Vec<(uuid::Uuid, String)>,
    /// Every held admission: its request, then the input, output,
    /// cache-read and cache-write tokens of its usage and of its run's
    /// latest checkpoint (none before a first turn).
    pub held: Vec<HeldRow>,
}

/// A held admission's request and usage columns, as selected.
pub type HeldRow = (
    uuid::Uuid,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
);

/// Input, output, cache-read and cache-write tokens as stored: the
/// admission's, then its run's latest checkpoint's.
type UsageColumns = ([Option<i64>; 4], [Option<i64>; 4]);

/// The runs of each request, from (request, run) rows of `runs`.
pub fn runs_by_request(rows: Vec<(uuid::Uuid, uuid::Uuid)>) -> HashMap<RequestId, Vec<RunId>> {
    let mut runs: HashMap<RequestId, Vec<RunId>> = HashMap::new();
    for (request, run) in rows {
        let request = RequestId::from_uuid(request).expect("request id");
        let run = RunId::from_uuid(run).expect("run id");
        runs.entry(request).or_default().push(run);
    }
    runs
}

/// What the torture needs of a backend.
#[turnstile::async_trait]
pub trait Backend: Sync {
    /// How the report's lines start.
    const NAME: &'static str;
    /// Kills land up to this long after the worker says it is ready.
    const MAX_KILL_DELAY_MS: u64;
    /// The report's name for the consistency checks, all passed.
    const CHECKS: &'static str;

    /// What a worker is told, besides `TORTURE_DIR`, `TORTURE_SEED` and
    /// `TORTURE_REQUESTS`, to find the database.
    fn worker_env(&self) -> Vec<(&'static str, String)>;

    /// Once a worker is dead: waits until what it left running has ended,
    /// and says how long that took (`None`: nothing outlives a worker).
    async fn settle(&self) -> Option<Duration>;

    /// The database as the dead worker left it; nothing if there is none
    /// yet.
    async fn read(&self, dir: &Path) -> Tables;

    /// A fresh store for the crash-free reference run.
    async fn reference_store(&self) -> Arc<dyn Store>;

    /// The final checks ([`final_checks`]) on a store of the database,
    /// with every run id of every request.
    async fn final_checks(
        &self,
        dir: &Path,
        plan: &Plan,
        reference: &Reference,
        stats: &mut Stats,
    ) -> usize;

    /// Once the torture is over.
    async fn close(&self) {}
}

// ---------------------------------------------------------------------------
// The worker (child process)
// ---------------------------------------------------------------------------

/// The body of the child's test: recovers every held request of the plan
/// and runs the rest, eight conversations at once, on the store `open`
/// opens (given the test's directory), until it is killed or done.
pub async fn work<F, Fut, S, E>(open: F)
where
    F: FnOnce(PathBuf) -> Fut,
    Fut: Future<Output = Result<S, E>>,
    S: Store + 'static,
    E: std::fmt::Display,
{
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
        open(dir.clone())
            .await
            .unwrap_or_else(|e| panic!("worker could not open its store: {e}")),
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
    let (agent, _) = agent(&conversation, &log, true, tracer);
    let traced: Arc<dyn Store> = Arc::new(Hooked::traced(store, c, tracer));
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

fn run_worker(
    worker: &str,
    dir: &Path,
    env: &[(&str, String)],
    seed: u64,
    requests: usize,
    kill: Option<KillAt>,
) -> Life {
    let mut child = crate::process::worker(worker)
        .envs(env.iter().map(|(name, value)| (name, value)))
        .env("TORTURE_DIR", dir)
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
            // The harness prints `test <worker> ... ` before the first
            // trace line, on the same line.
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

// ---------------------------------------------------------------------------
// What the parent reads after every worker
// ---------------------------------------------------------------------------

/// The database and the side-effect log after a worker's death.
#[derive(Clone, Debug, Default)]
struct Snapshot {
    /// What the consistency check found broken (must stay empty).
    broken: Vec<String>,
    checked: bool,
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
    async fn take(backend: &impl Backend, dir: &Path) -> Self {
        let effects = effects_in(&dir.join(LOG));
        let tables = backend.read(dir).await;
        let mut snapshot = Self {
            broken: tables.broken,
            checked: tables.checked,
            effect_lines: effects.values().sum(),
            effects,
            ..Self::default()
        };
        for (request, turn, call, status) in tables.journal {
            let key = format!("{}/{turn}/{call}", request.hyphenated());
            match status.as_str() {
                "requested" => snapshot.requested.insert(key),
                "completed" | "failed" => snapshot.journaled.insert(key),
                other => panic!("journal row {key} has status {other:?}"),
            };
        }
        for (id, status) in tables.requests {
            let id = RequestId::from_uuid(id).expect("request id");
            match status.as_str() {
                "completed" => snapshot.completed.insert(id),
                "active" => snapshot.active.insert(id),
                other => panic!("request {id} is {other}"),
            };
        }
        for (id, ai, ao, ar, aw, ci, co, cr, cw) in tables.held {
            let id = RequestId::from_uuid(id).expect("request id");
            let usage = ([ai, ao, ar, aw], [ci, co, cr, cw]);
            snapshot.held.insert(id, usage);
        }
        snapshot
    }
}

// ---------------------------------------------------------------------------
// Counters
// ---------------------------------------------------------------------------

#[derive(Default)]
pub struct Stats {
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
    /// The longest wait for what a dead worker left running to end (none
    /// where nothing outlives a worker).
    longest_settle: Option<Duration>,
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
    stats.consistency_checks += u64::from(after.checked);
    stats.journaled_calls_checked += before.journaled.len();
    assert!(
        after.broken.is_empty(),
        "{at}: the database is inconsistent: {:#?}",
        after.broken
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
                        // Steps nest, except reads a session makes at once
                        // (the conversation and the request): the latest
                        // open step of that kind ends.
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
    if finished.len() == super::CONVERSATIONS {
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
    for c in 0..super::CONVERSATIONS {
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

/// The test: the torture, on the backend `open` returns (called in the
/// test's runtime), in a fresh directory; the workers run the test named
/// `worker`, whose body is [`work`].
pub fn torture<B: Backend>(worker: &str, open: impl FnOnce() -> B) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let tmp = tempfile::tempdir().expect("temp dir");
    let backend = {
        let _runtime = rt.enter();
        open()
    };
    run(&rt, worker, tmp.path(), &backend);
    rt.block_on(backend.close());
}

/// The whole torture, in `dir`, on `backend`: the killed workers, the last
/// one, the comparison with the crash-free reference, the report and the
/// coverage checks.
fn run<B: Backend>(rt: &tokio::runtime::Runtime, worker: &str, dir: &Path, backend: &B) {
    let settings = Settings::from_env();
    let seed = settings.seed;
    println!(
        "{}: seed {seed} (0x{seed:x}), {} kills, {} conversations \
         (set TURNSTILE_TORTURE_SEED / TURNSTILE_TORTURE_KILLS to change)",
        B::NAME,
        settings.kills,
        super::CONVERSATIONS,
    );
    let started = Instant::now();
    let env = backend.worker_env();

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
            KillAt::AfterReady(Duration::from_millis(rng.range(0, B::MAX_KILL_DELAY_MS)))
        };
        life_no += 1;
        let life = run_worker(worker, dir, &env, seed, requests, Some(kill));
        stats.worker_runs += 1;
        stats.unkilled_workers += u64::from(!life.killed);
        if let Some(waited) = rt.block_on(backend.settle()) {
            stats.longest_settle = Some(stats.longest_settle.unwrap_or_default().max(waited));
        }
        let after = rt.block_on(Snapshot::take(backend, dir));
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
    let last = run_worker(worker, dir, &env, seed, requests, None);
    stats.worker_runs += 1;
    rt.block_on(backend.settle());
    let after = rt.block_on(Snapshot::take(backend, dir));
    check_life(life_no, &last, &before, &after, &known_keys, &mut stats);
    stats.model_calls += count_model_calls(&last);
    let kills_done = started.elapsed();

    // The crash-free reference of the same (final) plan.
    let reference = rt.block_on(async {
        let store = backend.reference_store().await;
        reference_run(store, &plan, &dir.join("reference.log")).await
    });
    assert_eq!(
        reference.effects.keys().cloned().collect::<HashSet<_>>(),
        known_keys,
        "the reference ran every planned call"
    );
    assert!(
        reference.effects.values().all(|&n| n == 1),
        "the reference ran a call twice"
    );

    let journaled_calls = rt.block_on(backend.final_checks(dir, &plan, &reference, &mut stats));

    // The side-effect log: every planned call ran; a call ran more than
    // once only after a kill found it unjournaled (checked per worker by
    // `check_life`); the replays in `final_checks` ran nothing.
    let log = rt.block_on(Snapshot::take(backend, dir));
    let extra: usize = log.effects.values().map(|n| n - 1).sum();
    let turns: usize = plan.requests().map(|(_, r)| r.turns.len()).sum();
    let duplicated_keys = log.effects.values().filter(|&&n| n > 1).count();
    let recovered = stats.commits.get("recovered").copied().unwrap_or(0);
    let say = |name: &str, value: &dyn std::fmt::Display| {
        println!("{}: {name}: {value}", B::NAME);
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
    say(B::CHECKS, &stats.consistency_checks);
    if let Some(waited) = stats.longest_settle {
        say(
            "longest wait for a dead worker's backends",
            &format!("{waited:?}"),
        );
    }
    let shape = format!("{} x {requests}", super::CONVERSATIONS);
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
        println!("{}: conversations at a kill: {landing}: {n}", B::NAME);
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
        // Each is expected at least a dozen times in 50 kills.
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
/// against the crash-free reference ([`assert_plan_committed`]), the
/// transcripts against the plan, then every request's runs (`runs`: the ids
/// of each request's runs, from the database) and checkpoints. Returns the
/// number of journaled tool calls.
pub async fn final_checks(
    store: Arc<dyn Store>,
    runs: &HashMap<RequestId, Vec<RunId>>,
    dir: &Path,
    plan: &Plan,
    reference: &Reference,
    stats: &mut Stats,
) -> usize {
    let journaled = assert_plan_committed(
        store.clone(),
        plan,
        reference,
        &HashSet::new(),
        &dir.join(LOG),
    )
    .await;
    for conversation in &plan.conversations {
        let what = format!("conversation {}", conversation.index);
        let transcript = transcript_of(&*store, conversation.id).await;
        let messages: Vec<_> = transcript.into_iter().map(|e| e.2).collect();
        assert_transcript_follows_plan(&what, conversation, &messages);
    }
    for (_, request) in plan.requests() {
        let stored = store
            .request(request.id)
            .await
            .expect("request")
            .and_then(|r| r.outcome)
            .expect("committed");
        let ids = runs.get(&request.id).map_or(&[][..], Vec::as_slice);
        let runs = runs_of(&*store, ids).await;
        check_request(&*store, request, &stored, &runs).await;
        let kind = if runs.len() > 1 { "recovered" } else { "fresh" };
        *stats.commits.entry(kind).or_default() += 1;
    }
    journaled
}
