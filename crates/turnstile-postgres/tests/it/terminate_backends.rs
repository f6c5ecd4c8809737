//! Connections dropped under the store, with `pg_terminate_backend`:
//!
//! - from inside tool calls: every tool call terminates every backend of
//!   the database before its effect, while other conversations' steps are
//!   in flight; the store's own next step finds its pooled connection dead;
//! - in a loop while commits run: a task terminates every turnstile
//!   backend every 80–160 ms while ten conversations commit request after
//!   request;
//! - right after a commit, for every step: a proxy between the store and
//!   the server lets one chosen write reach the server and commit, withholds
//!   the server's acknowledgement, terminates that backend, and passes on
//!   only the FATAL that follows. The store sees a dropped connection for a
//!   step that was applied, retries it, and must recognise it. Every write
//!   of a flow that covers claims, turns, tool results, commits, failures,
//!   resumes, recoveries, abandons and summary passes is hit in turn;
//! - the same sweep with the other half of the ambiguity: the chosen
//!   write's connection drops before the server sees it, so the retry
//!   (which runs with `retry = true`) must apply it after all;
//! - a retried abandon must not take another caller's abandon for its own
//!   (`a_retried_abandon_does_not_claim_another_callers_abandon`), nor a
//!   retried approval decision another caller's decision; a stop for
//!   approval and a decision whose acknowledgements are lost answer as
//!   they would have
//!   (`approval_steps_whose_acknowledgement_is_lost_answer_as_applied`).
//!
//! What must hold every time: no error reaches the caller (the store
//! retries), and nothing is lost or applied twice: every message exactly
//! once in the transcript, each journaled result once, each tool executed
//! once, the outcomes replay, and — for the proxy — the database ends
//! exactly as the same flow without the fault leaves it: the same rows in
//! every table, revisions, checkpoints, journal and summaries, and the
//! callers get the same answers.
#![cfg(unix)]

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use durability::ToolWatch;
use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use turnstile::{
    Agent, AgentSession, Budget, ContextPolicy, Error, MaxPasses, Outcome, PostgresOptions,
    PostgresStore, ResumePolicy, RunContext, ScriptedModel, ScriptedReply, Store, Usage,
};
use turnstile_test_postgres::Server;
use turnstile_testkit::postgres::durability;
use turnstile_testkit::session::more_turns;
use turnstile_testkit::torture::hooked::{Call, Hook, Hooked};
use turnstile_testkit::torture::{checks, namespace, ConversationPlan, Plan, Rng};

const SEED: u64 = 0x7465_726d;

fn options(url: &str, schema: &str) -> PostgresOptions {
    PostgresOptions {
        schema: Some(schema.into()),
        pool_size: 8,
        ..PostgresOptions::new(url)
    }
}

/// Runs every request of every conversation of `plan` once, concurrently
/// (a conversation's requests in order), on `store`: each must succeed at
/// the first call, as a fresh commit.
async fn run_plan_once(
    store: Arc<dyn Store>,
    plan: &Plan,
    log: &Path,
    journal: Arc<dyn Store>,
    watch: Arc<ToolWatch>,
    before: Option<durability::BeforeEffect>,
    paced: bool,
) -> Vec<String> {
    let tasks: Vec<_> = plan
        .conversations
        .iter()
        .map(|conversation| {
            let (agent, _) = durability::checked_agent(
                conversation,
                log,
                paced,
                journal.clone(),
                watch.clone(),
                before.clone(),
            );
            let session = AgentSession::new(
                agent,
                store.clone(),
                conversation.id,
                namespace(),
                ContextPolicy::default(),
            );
            let conversation = conversation.clone();
            tokio::spawn(async move {
                let mut errors = Vec::new();
                for request in &conversation.requests {
                    let what = format!(
                        "conversation {} request {}",
                        conversation.index, request.index
                    );
                    match session
                        .run(request.id, &request.input, RunContext::default())
                        .await
                    {
                        Ok(outcome) if !outcome.replayed => {}
                        Ok(_) => errors.push(format!("{what}: replayed before it committed")),
                        Err(e) => {
                            errors.push(format!("{what}: {e}"));
                            return errors;
                        }
                    }
                }
                errors
            })
        })
        .collect();
    let mut errors = Vec::new();
    for task in tasks {
        errors.extend(task.await.expect("a conversation task panicked"));
    }
    errors
}

/// What every fault of this file must leave: the plan committed exactly
/// as the crash-free reference commits it, one run per request, each tool
/// executed exactly once, no journaled call started again.
async fn assert_committed_once(
    store: Arc<dyn Store>,
    pool: &PgPool,
    plan: &Plan,
    dir: &Path,
    log: &Path,
    watch: &ToolWatch,
) -> usize {
    let mut conn = pool.acquire().await.expect("inspection connection");
    let violations = durability::consistency_violations(&mut conn).await;
    drop(conn);
    assert!(violations.is_empty(), "inconsistent: {violations:#?}");
    let runs: Vec<(uuid::Uuid, i64)> =
        sqlx::query_as("SELECT request_id, COUNT(*) FROM all_runs GROUP BY request_id")
            .fetch_all(pool)
            .await
            .expect("count runs");
    assert_eq!(runs.len(), plan.requests().count(), "requests with runs");
    for (request, n) in runs {
        assert_eq!(n, 1, "request {request} needed {n} runs");
    }
    let reference = durability::reference_run(plan, &dir.join("reference.log")).await;
    let journaled =
        checks::assert_plan_committed(store, plan, &reference, &HashSet::new(), log).await;
    let effects = checks::effects_in(log);
    assert_eq!(
        effects, reference.effects,
        "each planned tool call executed exactly once"
    );
    let reruns = watch.reruns_of_journaled_calls.lock().expect("reruns");
    assert!(reruns.is_empty(), "journaled calls ran again: {reruns:#?}");
    journaled
}

#[tokio::test]
async fn terminating_every_backend_from_inside_tool_calls_loses_and_repeats_nothing() {
    let started = Instant::now();
    let (retries, _counting) = durability::count_retries_here();
    let server = Server::shared();
    let (db, url) = server.fresh_database_named();
    let store = PostgresStore::connect_with(options(&url, "tools"))
        .await
        .expect("connect");
    let journal: Arc<dyn Store> = Arc::new(
        PostgresStore::connect_with(options(&url, "tools"))
            .await
            .expect("connect the tools' store"),
    );
    let pool = durability::inspect_pool(&url, "tools");
    let tmp = tempfile::tempdir().expect("temp dir");
    let log = tmp.path().join("effects.log");
    let plan = durability::first_conversations(&Plan::new(SEED, 4), 4);
    let terminated = Arc::new(AtomicU64::new(0));
    let terminate: durability::BeforeEffect = {
        let (db, terminated) = (db.clone(), terminated.clone());
        Arc::new(move || {
            terminated.fetch_add(server.terminate_backends(&db), Ordering::SeqCst);
        })
    };
    let watch = Arc::new(ToolWatch::default());
    let errors = run_plan_once(
        Arc::new(store.clone()),
        &plan,
        &log,
        journal,
        watch.clone(),
        Some(terminate),
        true,
    )
    .await;
    assert!(errors.is_empty(), "errors reached callers: {errors:#?}");
    let journaled = assert_committed_once(
        Arc::new(store.clone()),
        &pool,
        &plan,
        tmp.path(),
        &log,
        &watch,
    )
    .await;
    let terminated = terminated.load(Ordering::SeqCst);
    println!(
        "terminate from tools: {} tool calls, each terminating every backend: {terminated} \
         backends terminated; {} store retries ({:?}; by attempt {:?}); {journaled} calls \
         journaled once; {:.1} s",
        watch.executions.load(Ordering::SeqCst),
        retries.count(),
        retries.causes(4),
        retries.by_attempt(),
        started.elapsed().as_secs_f64()
    );
    assert!(terminated > 0, "no backend was terminated");
    pool.close().await;
    store.close().await;
}

#[tokio::test]
async fn terminating_backends_in_a_loop_while_commits_run_loses_and_repeats_nothing() {
    let started = Instant::now();
    let (retries, _counting) = durability::count_retries_here();
    let url = Server::shared().fresh_database();
    let store = PostgresStore::connect_with(options(&url, "loop"))
        .await
        .expect("connect");
    let journal: Arc<dyn Store> = Arc::new(
        PostgresStore::connect_with(options(&url, "loop"))
            .await
            .expect("connect the tools' store"),
    );
    let pool = durability::inspect_pool(&url, "loop");
    let tmp = tempfile::tempdir().expect("temp dir");
    let log = tmp.path().join("effects.log");
    let plan = Plan::new(SEED + 1, 10);
    // pg_terminate_backend of every turnstile backend of the database, every
    // 80 to 160 ms, from a connection of its own (`Server::terminate_backends`
    // waits for each backend to exit, too slow a loop for this). The store
    // gives a step eight attempts, so this pace must leave a retry far more
    // likely to finish than to be cut. At this pace about one retry in
    // twenty is cut again (four runs: 185–209 first retries, 7–9 second,
    // 0–2 third). With rounds 30–80 ms apart, reopening every connection
    // after each round slowed every attempt, one retry in three or four was
    // cut again, and one run in three here had a step cut eight times.
    let admin = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .expect("an admin connection");
    let stop = Arc::new(AtomicBool::new(false));
    let terminator = {
        let (stop, admin) = (stop.clone(), admin.clone());
        tokio::spawn(async move {
            let mut rng = Rng::new(SEED);
            let (mut rounds, mut terminated) = (0u64, 0i64);
            while !stop.load(Ordering::SeqCst) {
                let ended: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FILTER (WHERE pg_terminate_backend(pid))
                     FROM pg_stat_activity
                     WHERE datname = current_database() AND pid <> pg_backend_pid()
                       AND application_name = 'turnstile'",
                )
                .fetch_one(&admin)
                .await
                .expect("terminate the backends");
                terminated += ended;
                rounds += 1;
                tokio::time::sleep(Duration::from_millis(rng.range(80, 160))).await;
            }
            (rounds, terminated)
        })
    };
    let watch = Arc::new(ToolWatch::default());
    let errors = run_plan_once(
        Arc::new(store.clone()),
        &plan,
        &log,
        journal,
        watch.clone(),
        None,
        false,
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    let (rounds, terminated) = terminator.await.expect("the terminator");
    admin.close().await;
    let during = started.elapsed();
    assert!(errors.is_empty(), "errors reached callers: {errors:#?}");
    let journaled = assert_committed_once(
        Arc::new(store.clone()),
        &pool,
        &plan,
        tmp.path(),
        &log,
        &watch,
    )
    .await;
    println!(
        "terminate in a loop: {rounds} rounds terminated {terminated} backends in {:.1} s while \
         {} requests committed; {} store retries ({:?}; by attempt {:?}); {journaled} calls \
         journaled once; {:.1} s in all",
        during.as_secs_f64(),
        plan.requests().count(),
        retries.count(),
        retries.causes(4),
        retries.by_attempt(),
        started.elapsed().as_secs_f64()
    );
    assert!(terminated > 0, "no backend was terminated");
    assert!(
        retries.count() > 0,
        "no termination hit a step in flight: the test proved nothing"
    );
    pool.close().await;
    store.close().await;
}

// ---------------------------------------------------------------------------
// Acknowledgements lost right after a commit
// ---------------------------------------------------------------------------

/// A TCP proxy between turnstile and the server. Armed, it dooms the next
/// connection that sends a request (not a bare `Sync`, which is the pool's
/// ping): once that connection's server answers a request that ended
/// committed — a `CommandComplete` other than `ROLLBACK`, no error, and
/// `ReadyForQuery` idle — it withholds that answer, terminates the backend
/// with `pg_terminate_backend`, and passes on only what the server sends
/// then (its FATAL `57P01`).
struct AckCutter {
    port: u16,
    armed: AtomicBool,
    /// Armed, the next request is never sent: its connection is closed
    /// before the server sees it (a step that failed without applying).
    drop_next: AtomicBool,
    /// Requests dropped so.
    dropped: AtomicUsize,
    /// The tag of each withheld acknowledgement (`COMMIT`, `SELECT 1`, …).
    cuts: Mutex<Vec<String>>,
    admin: PgPool,
}

impl AckCutter {
    async fn start(server_port: u16, admin: PgPool) -> Arc<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .expect("bind the proxy");
        let cutter = Arc::new(AckCutter {
            port: listener.local_addr().expect("proxy address").port(),
            armed: AtomicBool::new(false),
            drop_next: AtomicBool::new(false),
            dropped: AtomicUsize::new(0),
            cuts: Mutex::new(Vec::new()),
            admin,
        });
        let accepting = cutter.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = TcpStream::connect(("127.0.0.1", server_port))
                    .await
                    .expect("the proxy connects to the server");
                tokio::spawn(accepting.clone().relay(client, server));
            }
        });
        cutter
    }

    fn cuts(&self) -> Vec<String> {
        self.cuts.lock().expect("cuts").clone()
    }

    async fn relay(self: Arc<Self>, client: TcpStream, server: TcpStream) {
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (mut client_reads, mut client_writes) = client.into_split();
        let (mut server_reads, mut server_writes) = server.into_split();
        let doomed = Arc::new(AtomicBool::new(false));
        let up = {
            let (cutter, doomed) = (self.clone(), doomed.clone());
            async move {
                let mut frames = Frames::new(true);
                let mut chunk = vec![0u8; 64 * 1024];
                loop {
                    let n = match client_reads.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    // Doomed before the request reaches the server.
                    let mut drop_it = false;
                    for (kind, frame) in frames.push(&chunk[..n]) {
                        // Not a request: a bare Sync (the pool's ping), a
                        // flush, a goodbye, or the ROLLBACK sqlx sends late
                        // for a transaction dropped uncommitted.
                        let request = kind.is_some_and(|k| !matches!(k, b'S' | b'H' | b'X'))
                            && !(kind == Some(b'Q') && frame[5..].starts_with(b"ROLLBACK"));
                        if request && cutter.drop_next.swap(false, Ordering::SeqCst) {
                            drop_it = true;
                        } else if request && cutter.armed.swap(false, Ordering::SeqCst) {
                            doomed.store(true, Ordering::SeqCst);
                        }
                    }
                    if drop_it {
                        // Never sent: the server ends the connection, and
                        // the client reads its end.
                        cutter.dropped.fetch_add(1, Ordering::SeqCst);
                        break;
                    }
                    if server_writes.write_all(&chunk[..n]).await.is_err() {
                        break;
                    }
                }
                let _ = server_writes.shutdown().await;
            }
        };
        let down = async move {
            let mut frames = Frames::new(false);
            let mut chunk = vec![0u8; 64 * 1024];
            // The server's messages since its last ReadyForQuery.
            let mut held: Vec<u8> = Vec::new();
            let (mut tag, mut failed, mut pid, mut cut) = (None::<String>, false, None, false);
            loop {
                let n = match server_reads.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                for (kind, frame) in frames.push(&chunk[..n]) {
                    let body = &frame[5..];
                    if cut {
                        held.extend_from_slice(&frame);
                        continue;
                    }
                    match kind {
                        Some(b'K') => {
                            pid = Some(i32::from_be_bytes(body[..4].try_into().expect("a pid")))
                        }
                        Some(b'C') => {
                            let end = body.iter().position(|&b| b == 0).unwrap_or(body.len());
                            tag = Some(String::from_utf8_lossy(&body[..end]).into_owned());
                        }
                        Some(b'E') => failed = true,
                        _ => {}
                    }
                    held.extend_from_slice(&frame);
                    if kind != Some(b'Z') {
                        continue;
                    }
                    let committed = body.first() == Some(&b'I')
                        && !failed
                        && tag.as_deref().is_some_and(|t| t != "ROLLBACK");
                    if committed && doomed.swap(false, Ordering::SeqCst) {
                        // The answer is withheld; the backend ends.
                        cut = true;
                        held.clear();
                        let pid = pid.expect("the backend's pid (BackendKeyData)");
                        let ended: bool =
                            sqlx::query_scalar("SELECT pg_terminate_backend($1, 5000)")
                                .bind(pid)
                                .fetch_one(&self.admin)
                                .await
                                .expect("pg_terminate_backend");
                        assert!(ended, "backend {pid} did not end");
                        self.cuts
                            .lock()
                            .expect("cuts")
                            .push(tag.clone().unwrap_or_default());
                    } else if client_writes.write_all(&held).await.is_err() {
                        return;
                    } else {
                        held.clear();
                    }
                    tag = None;
                    failed = false;
                }
                if cut && !held.is_empty() {
                    if client_writes.write_all(&held).await.is_err() {
                        return;
                    }
                    held.clear();
                }
            }
            let _ = client_writes.write_all(&held).await;
            let _ = client_writes.shutdown().await;
        };
        tokio::join!(up, down);
    }
}

/// Splits a byte stream of the PostgreSQL protocol into messages: the
/// client's first one (startup) has no type byte, every other one is a
/// type byte and a length that counts itself.
struct Frames {
    buf: Vec<u8>,
    untyped_first: bool,
}

impl Frames {
    fn new(untyped_first: bool) -> Self {
        Self {
            buf: Vec::new(),
            untyped_first,
        }
    }

    fn push(&mut self, data: &[u8]) -> Vec<(Option<u8>, Vec<u8>)> {
        self.buf.extend_from_slice(data);
        let mut out = Vec::new();
        loop {
            let (kind, total) = if self.untyped_first {
                let Some(len) = self.buf.get(..4) else { break };
                let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
                (None, len)
            } else {
                let Some(len) = self.buf.get(1..5) else { break };
                let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
                (Some(self.buf[0]), len + 1)
            };
            if self.buf.len() < total {
                break;
            }
            let frame: Vec<u8> = self.buf.drain(..total).collect();
            if kind.is_none() {
                self.untyped_first = false;
                // An untyped frame has no type byte: pad so that `[5..]`
                // is its body like a typed frame's.
                let mut padded = vec![0u8];
                padded.extend_from_slice(&frame);
                out.push((None, padded));
            } else {
                out.push((kind, frame));
            }
        }
        out
    }
}

/// Arms the proxy for the `target`-th write (1-based) of the flow, and
/// records every write the flow makes and which of them had its
/// acknowledgement cut.
/// The fault a flow's chosen write meets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// Applied and committed; the acknowledgement withheld, the backend
    /// terminated.
    AckLost,
    /// The connection drops before the server sees the request.
    NotSent,
}

struct ArmHook {
    cutter: Arc<AckCutter>,
    fault: Fault,
    target: usize,
    writes: AtomicUsize,
    ops: Mutex<Vec<&'static str>>,
    /// (the write, the tags cut while it ran)
    cut_during_target: Mutex<Option<(&'static str, Vec<String>)>>,
    cuts_before: AtomicUsize,
}

#[turnstile::async_trait]
impl Hook for ArmHook {
    async fn enter(&self, call: &Call) -> u64 {
        if !call.write {
            return 0;
        }
        let n = self.writes.fetch_add(1, Ordering::SeqCst) + 1;
        self.ops.lock().expect("ops").push(call.op);
        if n == self.target {
            self.cuts_before
                .store(self.faults_so_far(), Ordering::SeqCst);
            match self.fault {
                Fault::AckLost => self.cutter.armed.store(true, Ordering::SeqCst),
                Fault::NotSent => self.cutter.drop_next.store(true, Ordering::SeqCst),
            }
        }
        n as u64
    }

    fn leave(&self, call: &Call, token: u64, _ok: bool) {
        if call.write && token as usize == self.target {
            self.cutter.armed.store(false, Ordering::SeqCst);
            self.cutter.drop_next.store(false, Ordering::SeqCst);
            let from = self.cuts_before.load(Ordering::SeqCst);
            let during = match self.fault {
                Fault::AckLost => self.cutter.cuts()[from..].to_vec(),
                Fault::NotSent => vec!["not sent".to_owned(); self.faults_so_far() - from],
            };
            *self.cut_during_target.lock().expect("cut") = Some((call.op, during));
        }
    }
}

impl ArmHook {
    fn faults_so_far(&self) -> usize {
        match self.fault {
            Fault::AckLost => self.cutter.cuts().len(),
            Fault::NotSent => self.cutter.dropped.load(Ordering::SeqCst),
        }
    }
}

/// The agent of the flow: the plan's model and effect tools, with a
/// summary agent that summarizes older entries two at a time.
fn flow_session(
    conversation: &ConversationPlan,
    store: Arc<dyn Store>,
    log: &Path,
) -> AgentSession {
    let (agent, _) = turnstile_testkit::torture::agent(
        conversation,
        log,
        false,
        turnstile_testkit::torture::Tracer { enabled: false },
    );
    let summarizer = Arc::new(ScriptedModel::new(vec![ScriptedReply::text(
        "the story so far",
    )
    .with_usage(Usage {
        input_tokens: 7,
        output_tokens: 3,
        ..Usage::default()
    })]));
    AgentSession::new(
        agent,
        store,
        conversation.id,
        namespace(),
        ContextPolicy::new(6)
            .and_then(|p| p.with_summary_batch(4))
            .expect("policy"),
    )
    .with_summary_agent(Agent::new(summarizer), MaxPasses::new(16).expect("passes"))
}

/// What a caller is told, without the ids that differ between runs.
fn told(what: &str, result: &Result<Outcome, Error>) -> String {
    match result {
        Ok(o) => format!(
            "{what}: ok {:?}, {} turns, {} calls, {:?}, version {}, replayed {}, {} messages",
            o.final_text,
            o.turns,
            o.tool_calls,
            o.usage,
            o.conversation_version,
            o.replayed,
            o.messages.len()
        ),
        Err(e) => format!("{what}: {}", error_kind(e)),
    }
}

fn error_kind(error: &Error) -> String {
    match error {
        Error::BudgetExceeded {
            revision,
            kind,
            used,
            limit,
            ..
        } => format!("budget exceeded ({kind}, {used} of {limit}) at revision {revision}"),
        Error::RequestAbandoned { .. } => "request abandoned".into(),
        other => format!("unexpected error: {other}"),
    }
}

/// A flow over every kind of write: a request straight through; one stopped
/// by its turn budget and resumed with the default policy (its stop must
/// have been settled durably); one stopped and recovered after its owner's
/// exit; one stopped, abandoned and refused; summaries of older entries
/// before each request's first turn. Returns what the callers were told.
async fn flow(session: &AgentSession, conversation: &ConversationPlan) -> Vec<String> {
    let [r0, r1, r2, r3] = &conversation.requests[..] else {
        panic!("the flow needs four requests");
    };
    let one_turn = || {
        RunContext::default().with_budget(Budget {
            max_turns: Some(1),
            ..Budget::default()
        })
    };
    let mut told_callers = Vec::new();
    let done = session.run(r0.id, &r0.input, RunContext::default()).await;
    told_callers.push(told("run r0", &done));

    let stopped = session.run(r1.id, &r1.input, one_turn()).await;
    told_callers.push(told("run r1 (one turn)", &stopped));
    if let Some((run, revision)) = stopped.as_ref().err().and_then(Error::stopped_run) {
        let resumed = session
            .resume_run(run, more_turns(), revision, ResumePolicy::RejectAmbiguous)
            .await;
        told_callers.push(told("resume r1", &resumed));
    }

    let stopped = session.run(r2.id, &r2.input, one_turn()).await;
    told_callers.push(told("run r2 (one turn)", &stopped));
    if let Some((_, revision)) = stopped.as_ref().err().and_then(Error::stopped_run) {
        let recovered = session
            .recover_after_owner_exit(
                r2.id,
                &r2.input,
                more_turns(),
                revision,
                ResumePolicy::RetryInterruptedTurn,
            )
            .await;
        told_callers.push(told("recover r2", &recovered));
    }

    let stopped = session.run(r3.id, &r3.input, one_turn()).await;
    told_callers.push(told("run r3 (one turn)", &stopped));
    if let Some((_, revision)) = stopped.as_ref().err().and_then(Error::stopped_run) {
        let abandoned = session.abandon(r3.id, revision).await;
        told_callers.push(match abandoned {
            Ok(revision) => format!("abandon r3: ok, revision {revision}"),
            Err(e) => format!("abandon r3: {}", error_kind(&e)),
        });
    }
    let refused = session.run(r3.id, &r3.input, RunContext::default()).await;
    told_callers.push(told("run r3 again", &refused));
    told_callers
}

/// Everything the flow left in its schema, without the ids and times that
/// differ between runs: rows per table, the admission, the transcript, each
/// request's outcome, runs, checkpoints and journal, the summary.
async fn state(store: &dyn Store, pool: &PgPool, conversation: &ConversationPlan) -> Vec<String> {
    let mut facts: Vec<String> = durability::row_counts(pool)
        .await
        .into_iter()
        .map(|(table, n)| format!("{table}: {n} rows"))
        .collect();
    let admission = store.admission(conversation.id).await.expect("admission");
    facts.push(format!(
        "admission: revision {}, held {}",
        admission.revision,
        admission.active.is_some()
    ));
    let header = store
        .conversation(&namespace(), conversation.id)
        .await
        .expect("conversation");
    facts.push(format!("version {}", header.version));
    for (seq, request, message) in checks::transcript_of(store, conversation.id).await {
        facts.push(format!("transcript {seq}: {request} {message:?}"));
    }
    for request in &conversation.requests {
        let Some(record) = store.request(request.id).await.expect("request") else {
            facts.push(format!("request {}: none", request.index));
            continue;
        };
        let outcome = record.outcome.map(|o| {
            format!(
                "{:?} {} turns {} calls v{} {}..{}",
                o.usage, o.turns, o.tool_calls, o.conversation_version, o.first_seq, o.end_seq
            )
        });
        facts.push(format!(
            "request {}: {:?}, outcome {outcome:?}",
            request.index, record.status
        ));
        let runs: Vec<uuid::Uuid> = sqlx::query_scalar(
            "SELECT run_id FROM all_runs WHERE request_id = $1 ORDER BY started_at, run_id",
        )
        .bind(request.id.as_uuid())
        .fetch_all(pool)
        .await
        .expect("runs");
        for (i, run) in runs.into_iter().enumerate() {
            let run = turnstile::RunId::from_uuid(run).expect("run id");
            let record = store.run(run).await.expect("run").expect("listed run");
            facts.push(format!(
                "request {} run {i}: {:?}, resumed {}, error {}",
                request.index,
                record.status,
                record.resumed_from.is_some(),
                record.error.is_some()
            ));
            for c in store.checkpoints(run).await.expect("checkpoints") {
                facts.push(format!(
                    "request {} run {i} turn {}: {:?} {:?} calls {} messages {} reports {}",
                    request.index,
                    c.turn,
                    c.phase,
                    c.usage,
                    c.tool_calls_count,
                    c.message_count,
                    c.verification_reports.len()
                ));
            }
        }
        for turn in 1..=request.turns.len() as u32 {
            for entry in store.journal(request.id, turn).await.expect("journal") {
                facts.push(format!(
                    "request {} turn {turn} call {}: {} {:?} {:?} {:?}",
                    request.index,
                    entry.call_id,
                    entry.name,
                    entry.status,
                    entry.arguments,
                    entry.result
                ));
            }
        }
    }
    if let Some(s) = store
        .latest_summary(conversation.id)
        .await
        .expect("summary")
    {
        facts.push(format!(
            "summary {}..={} of v{}: {:?} {:?}",
            s.from_seq, s.through_seq, s.made_from_version, s.content, s.usage
        ));
    }
    facts
}

/// One run of the flow in a fresh schema through the proxy, with the
/// acknowledgement of write `target` (1-based; 0: none) cut.
struct FlowRun {
    told: Vec<String>,
    state: Vec<String>,
    effects: BTreeMap<String, usize>,
    ops: Vec<&'static str>,
    cut: Option<(&'static str, Vec<String>)>,
    retries: u64,
}

async fn run_flow(
    url_via_proxy: &str,
    url: &str,
    cutter: &Arc<AckCutter>,
    conversation: &ConversationPlan,
    dir: &Path,
    (fault, target): (Fault, usize),
    retries: &durability::Retries,
) -> FlowRun {
    let schema = format!("f{target}");
    let store = PostgresStore::connect_with(options(url_via_proxy, &schema))
        .await
        .expect("connect through the proxy");
    let pool = durability::inspect_pool(url, &schema);
    let hook = Arc::new(ArmHook {
        cutter: cutter.clone(),
        fault,
        target,
        writes: AtomicUsize::new(0),
        ops: Mutex::new(Vec::new()),
        cut_during_target: Mutex::new(None),
        cuts_before: AtomicUsize::new(0),
    });
    let hooked: Arc<dyn Store> = Arc::new(Hooked {
        inner: Arc::new(store.clone()),
        hook: hook.clone(),
    });
    let log = dir.join(format!("effects-{target}.log"));
    let session = flow_session(conversation, hooked, &log);
    let retries_before = retries.count();
    let told = flow(&session, conversation).await;
    let retries = retries.count() - retries_before;
    let state = state(&store, &pool, conversation).await;
    pool.close().await;
    store.close().await;
    let ops = hook.ops.lock().expect("ops").clone();
    let cut = hook.cut_during_target.lock().expect("cut").clone();
    FlowRun {
        told,
        state,
        effects: checks::effects_in(&log).into_iter().collect(),
        ops,
        cut,
        retries,
    }
}

#[tokio::test]
async fn a_step_whose_acknowledgement_is_lost_after_its_commit_is_applied_exactly_once() {
    sweep(Fault::AckLost).await;
}

#[tokio::test]
async fn a_step_whose_request_never_reached_the_server_is_applied_exactly_once() {
    sweep(Fault::NotSent).await;
}

/// Runs the flow once without a fault, then once per write with that
/// write meeting `fault`, each in a fresh schema: every run must tell the
/// callers the same, leave the same database and run the same tools.
async fn sweep(fault: Fault) {
    let name = match fault {
        Fault::AckLost => "ack loss",
        Fault::NotSent => "not sent",
    };
    let started = Instant::now();
    let (retries, _counting) = durability::count_retries_here();
    let server = Server::shared();
    let url = server.fresh_database();
    let port: u16 = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split(['/', '?']).next())
        .and_then(|authority| authority.rsplit(':').next())
        .and_then(|port| port.parse().ok())
        .expect("the server's port in its URL");
    let admin = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .expect("an admin connection");
    let cutter = AckCutter::start(port, admin.clone()).await;
    let via_proxy = durability::url_via(&url, cutter.port);
    let tmp = tempfile::tempdir().expect("temp dir");
    let plan = Plan::new(SEED + 2, 4);
    let conversation = &plan.conversations[0];

    let clean = run_flow(
        &via_proxy,
        &url,
        &cutter,
        conversation,
        tmp.path(),
        (fault, 0),
        &retries,
    )
    .await;
    assert_eq!(clean.retries, 0, "the flow without a fault retried");
    assert!(cutter.cuts().is_empty());
    for line in &clean.told {
        println!("{name}: the flow: {line}");
    }
    assert!(
        clean.told.iter().all(|t| !t.contains("unexpected")),
        "the flow itself failed: {:#?}",
        clean.told
    );
    let mut by_op: BTreeMap<&str, (usize, BTreeMap<String, usize>)> = BTreeMap::new();
    for target in 1..=clean.ops.len() {
        let faulty = run_flow(
            &via_proxy,
            &url,
            &cutter,
            conversation,
            tmp.path(),
            (fault, target),
            &retries,
        )
        .await;
        let op = clean.ops[target - 1];
        let at = format!("write {target} ({op}), {fault:?}");
        assert_eq!(
            faulty.ops[..target],
            clean.ops[..target],
            "{at}: the writes before"
        );
        let (cut_op, tags) = faulty.cut.clone().unwrap_or((op, Vec::new()));
        assert_eq!(cut_op, op);
        assert_eq!(
            tags.len(),
            1,
            "{at}: the proxy hit {} requests during the write (want 1)",
            tags.len()
        );
        assert!(faulty.retries >= 1, "{at}: the store did not retry");
        assert_eq!(
            faulty.told, clean.told,
            "{at}: the callers were told otherwise"
        );
        assert_eq!(faulty.state, clean.state, "{at}: the database differs");
        assert_eq!(
            faulty.effects, clean.effects,
            "{at}: tools ran a different number of times"
        );
        let entry = by_op.entry(op).or_default();
        entry.0 += 1;
        *entry.1.entry(tags[0].clone()).or_default() += 1;
    }
    for (op, (n, tags)) in &by_op {
        println!("{name}: {op}: {n} writes, each applied once; faults {tags:?}");
    }
    println!(
        "{name}: {} writes of the flow, each meeting the fault once; {} store retries; {:.1} s",
        clean.ops.len(),
        retries.count(),
        started.elapsed().as_secs_f64()
    );
    for op in [
        "claim",
        "record_model_response",
        "record_tool_result",
        "finish_turn",
        "commit",
        "fail_run",
        "claim_recovery",
        "begin_turn",
        "abandon",
        "record_summary_pass",
        "commit_summary",
    ] {
        assert!(by_op.contains_key(op), "the flow never wrote {op}");
    }
    admin.close().await;
}

/// A failed abandon must stay failed on the store's retry: an abandon
/// whose first attempt never reached the server (its connection dropped),
/// aimed at a request that another caller already abandoned, must be
/// refused as its attempt without the fault is (`NotActive`), not reported
/// as a successful abandon at a revision someone else won.
///
/// A retry that only asked "is the request abandoned?" could not tell its
/// own lost acknowledgement from another caller's abandon: two abandoners
/// at one revision could both be told they won it. The store's retry
/// recognizes its own abandon by the call's token.
#[tokio::test]
async fn a_retried_abandon_does_not_claim_another_callers_abandon() {
    let (retries, _counting) = durability::count_retries_here();
    let server = Server::shared();
    let url = server.fresh_database();
    let port: u16 = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split(['/', '?']).next())
        .and_then(|authority| authority.rsplit(':').next())
        .and_then(|port| port.parse().ok())
        .expect("the server's port in its URL");
    let admin = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .expect("an admin connection");
    let cutter = AckCutter::start(port, admin.clone()).await;
    let direct = PostgresStore::connect_with(options(&url, "abandon"))
        .await
        .expect("connect");
    let proxied =
        PostgresStore::connect_with(options(&durability::url_via(&url, cutter.port), "abandon"))
            .await
            .expect("connect through the proxy");

    // A request held at revision 1, abandoned by one caller (revision 2).
    let conversation = turnstile::ConversationId::new();
    direct
        .ensure_conversation(&namespace(), conversation)
        .await
        .expect("conversation");
    let request = turnstile::RequestId::new();
    let claim = turnstile::store::NewRequest {
        conversation_id: conversation,
        request_id: request,
        input_sha256: turnstile::store::InputHash::of("abandon me"),
        input: turnstile::Message::user("abandon me"),
        expected_revision: turnstile::Revision(0),
        expected_created_at: None,
        run_id: turnstile::RunId::new(),
        agent_fingerprint: "fingerprint".into(),
        first_turn: None,
        deadline_at: None,
        budget: Default::default(),
    };
    let fence = match direct.claim(&claim).await.expect("claim") {
        turnstile::store::ClaimOutcome::Admitted(fence) => fence,
        other => panic!("not admitted: {other:?}"),
    };
    let won = direct
        .abandon(conversation, request, fence.revision)
        .await
        .expect("the first abandon");
    assert_eq!(won, turnstile::Revision(fence.revision.0 + 1));

    // Another caller, a step late, aims at the same revision: refused.
    let late = proxied.abandon(conversation, request, fence.revision).await;
    assert!(
        matches!(late, Err(Error::NotActive { .. })),
        "without a fault: {late:?}"
    );

    // The same, with its first attempt lost on the way to the server.
    cutter.drop_next.store(true, Ordering::SeqCst);
    let before = retries.count();
    let late = proxied.abandon(conversation, request, fence.revision).await;
    assert_eq!(cutter.dropped.load(Ordering::SeqCst), 1, "the fault missed");
    assert!(
        retries.count() > before,
        "the store did not retry: {late:?}"
    );
    assert!(
        matches!(late, Err(Error::NotActive { .. })),
        "a late abandon whose first attempt was lost was answered {late:?}: revision {} was \
         won by the first abandon, not by this caller",
        won
    );
    proxied.close().await;
    direct.close().await;
    admin.close().await;
}

/// The approval steps meet both halves of the ambiguity: a stop for
/// approval and a decision that committed without their acknowledgement
/// are answered as applied (the stop's calls, the decision's revision, not
/// `NoPendingApproval`), and a decision whose first attempt never reached
/// the server, aimed at a revision another decision won, is refused as it
/// would be without the fault.
#[tokio::test]
async fn approval_steps_whose_acknowledgement_is_lost_answer_as_applied() {
    use turnstile::store::{ApprovalDecision, ApprovalStatus, ToolResult, Verdict};
    use turnstile::{CheckpointPhase, LoopCheckpoint, Message};
    use turnstile_conformance::support::{admit, checkpoint, new_conversation, tool_call};

    let (retries, _counting) = durability::count_retries_here();
    let server = Server::shared();
    let url = server.fresh_database();
    let port: u16 = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split(['/', '?']).next())
        .and_then(|authority| authority.rsplit(':').next())
        .and_then(|port| port.parse().ok())
        .expect("the server's port in its URL");
    let admin = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .expect("an admin connection");
    let cutter = AckCutter::start(port, admin.clone()).await;
    let direct = PostgresStore::connect_with(options(&url, "approvals"))
        .await
        .expect("connect");
    let proxied = PostgresStore::connect_with(options(
        &durability::url_via(&url, cutter.port),
        "approvals",
    ))
    .await
    .expect("connect through the proxy");

    // A run whose turn 1 asked for two calls, one answered.
    let conversation = new_conversation(&direct).await.expect("conversation");
    let fence = admit(&direct, conversation, "hello").await.expect("admit");
    let mut start = checkpoint(fence.run_id, 0, CheckpointPhase::TurnInFlight, 1);
    start.turn = 1;
    direct.begin_turn(&fence, &start).await.expect("begin turn");
    let assistant = Message::assistant_with_calls(
        "calling",
        vec![tool_call("gated", "{}"), tool_call("free", "{}")],
    );
    let answered = checkpoint(fence.run_id, 1, CheckpointPhase::ToolsInFlight, 1);
    direct
        .record_model_response(&fence, &answered, &assistant)
        .await
        .expect("model response");
    let result = ToolResult {
        content: "free result".into(),
        is_error: false,
    };
    direct
        .record_tool_result(&fence, 1, "free", &result)
        .await
        .expect("tool result");
    let settled = LoopCheckpoint {
        phase: CheckpointPhase::ToolsPending,
        ..answered
    };

    // The stop, its COMMIT's acknowledgement withheld.
    cutter.armed.store(true, Ordering::SeqCst);
    let before = retries.count();
    let pending = proxied
        .await_approval(&fence, &settled, &["gated".to_owned()], "awaiting")
        .await
        .expect("a stop whose acknowledgement was lost");
    assert_eq!(cutter.cuts().len(), 1, "the fault missed");
    assert!(retries.count() > before, "the store did not retry");
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].call_id, "gated");
    assert_eq!(pending[0].revision, fence.revision);
    assert_eq!(
        direct
            .pending_approvals(Some(conversation))
            .await
            .expect("pending"),
        pending
    );

    // The decision, its acknowledgement withheld: the revision it won.
    let decision = |revision, reason: &str| ApprovalDecision {
        conversation_id: conversation,
        request_id: fence.request_id,
        call_id: "gated".into(),
        expected_revision: revision,
        verdict: Verdict::Reject {
            reason: reason.into(),
        },
    };
    cutter.armed.store(true, Ordering::SeqCst);
    let before = retries.count();
    let won = proxied
        .decide_approval(&decision(fence.revision, "no"))
        .await
        .expect("a decision whose acknowledgement was lost");
    assert_eq!(cutter.cuts().len(), 2, "the fault missed");
    assert!(retries.count() > before, "the store did not retry");
    assert_eq!(won, turnstile::Revision(fence.revision.0 + 1));
    let rows = direct
        .approvals(fence.request_id, 1)
        .await
        .expect("approvals");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].status, ApprovalStatus::Rejected);
    assert_eq!(rows[0].reason.as_deref(), Some("no"));
    assert_eq!(
        direct
            .admission(conversation)
            .await
            .expect("admission")
            .revision,
        won
    );

    // A late decision at the revision just won, its first attempt lost on
    // the way: refused as without the fault.
    cutter.drop_next.store(true, Ordering::SeqCst);
    let before = retries.count();
    let late = proxied
        .decide_approval(&decision(fence.revision, "late"))
        .await;
    assert_eq!(cutter.dropped.load(Ordering::SeqCst), 1, "the fault missed");
    assert!(
        retries.count() > before,
        "the store did not retry: {late:?}"
    );
    assert!(
        matches!(late, Err(Error::Conflict { .. })),
        "a late decision whose first attempt was lost was answered {late:?}"
    );
    assert_eq!(
        direct
            .approvals(fence.request_id, 1)
            .await
            .expect("approvals")[0]
            .reason
            .as_deref(),
        Some("no")
    );
    proxied.close().await;
    direct.close().await;
    admin.close().await;
}
