//! The server crashes in the middle of runs: a cluster of this test's own
//! (fsync on) is stopped with `pg_ctl stop -m immediate` while eight
//! conversations run their requests, left down for a seeded while, and
//! started again (crash recovery), several times.
//!
//! Half of the conversations use a patient store (the default 30 s to get
//! a connection): a step in flight when the server dies is retried inside
//! the store and rides through the outage, and its caller never sees an
//! error. The other half use a hasty store (300 ms to get a connection):
//! its steps fail while the server is down, the run stops with a store
//! error and the admission stays held; once the server is back, the driver
//! finds the request active and recovers it (`recover_after_owner_exit`,
//! `RetryInterruptedTurn`), or finds it completed (a commit that made it
//! although its caller got an error).
//!
//! What must hold:
//! - nothing acknowledged is lost: after every restart, every claim, model
//!   answer, tool result, finished turn and commit a caller was told had
//!   succeeded is in the database;
//! - the patient conversations never see an error, and need no recovery:
//!   each request has exactly one run;
//! - no journaled tool call starts again (each tool reads the journal
//!   before its effect);
//! - in the end every request is completed exactly once: each conversation
//!   holds exactly what a crash-free run of the same plan commits on
//!   SQLite, every message once, every call answered once, every journaled
//!   call once, every request replays, and the consistency rules hold.
//!
//! `TURNSTILE_SERVER_KILLS` (default 4) and `TURNSTILE_TORTURE_SEED` choose
//! the number of crashes and the seed.
#![cfg(unix)]

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use durability::ToolWatch;
use sqlx::PgPool;
use turnstile::store::RequestStatus;
use turnstile::{
    AgentSession, ContextPolicy, Error, PostgresOptions, PostgresStore, RequestId, ResumePolicy,
    RunContext, RunId, Store,
};
use turnstile_test_postgres::Server;
use turnstile_testkit::postgres::durability;
use turnstile_testkit::torture::hooked::{Call, Hook, Hooked};
use turnstile_testkit::torture::{checks, namespace, ConversationPlan, Plan, Rng};

const DEFAULT_KILLS: u64 = 4;
const DEFAULT_SEED: u64 = 0x7365_7276_6572;
const REQUESTS: usize = 8;
const SCHEMA: &str = "crash";
/// The conversations of the plan on the patient store; the rest use the
/// hasty one.
const PATIENT: usize = 4;

fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Err(_) => default,
        Ok(text) => {
            let text = text.trim();
            match text.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => text.parse(),
            }
            .unwrap_or_else(|e| panic!("{name}={text:?} is not a number: {e}"))
        }
    }
}

/// A write a caller was told had succeeded.
#[derive(Clone, Debug)]
struct Acked {
    op: &'static str,
    request: RequestId,
    run: Option<RunId>,
    turn: Option<u32>,
    call_id: Option<String>,
}

/// Watches one store: steps in flight, steps that rode through an outage
/// (entered before a crash, succeeded after it), failed steps, and every
/// acknowledged write.
#[derive(Default)]
struct Watch {
    /// Crashes so far: a step's token is the epoch it entered in.
    epoch: Arc<AtomicU64>,
    in_flight: AtomicI64,
    rode_through: AtomicU64,
    failed: AtomicU64,
    acked: Mutex<Vec<Acked>>,
}

#[turnstile::async_trait]
impl Hook for Watch {
    async fn enter(&self, call: &Call) -> u64 {
        if call.write {
            self.in_flight.fetch_add(1, Ordering::SeqCst);
        }
        self.epoch.load(Ordering::SeqCst)
    }

    fn leave(&self, call: &Call, token: u64, ok: bool) {
        if !call.write {
            return;
        }
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        if !ok {
            self.failed.fetch_add(1, Ordering::SeqCst);
            return;
        }
        if self.epoch.load(Ordering::SeqCst) != token {
            self.rode_through.fetch_add(1, Ordering::SeqCst);
        }
        if let Some(request) = call.request {
            self.acked.lock().expect("acked").push(Acked {
                op: call.op,
                request,
                run: call.run,
                turn: call.turn,
                call_id: call.call_id.clone(),
            });
        }
    }
}

/// What the drivers of one store saw.
#[derive(Default)]
struct Seen {
    /// Errors that reached a caller, by kind.
    errors: Mutex<BTreeMap<String, u64>>,
    /// Errors of kinds this scenario does not allow (must stay empty).
    unexpected: Mutex<Vec<String>>,
    recoveries: AtomicU64,
    /// Requests whose caller got an error although they had committed.
    committed_despite_an_error: AtomicU64,
}

impl Seen {
    fn error(&self, what: &str, error: &Error) {
        match error {
            Error::Store(e) => {
                let kind = if e.is_busy() {
                    "store error (busy: no connection in time)"
                } else {
                    "store error"
                };
                *self
                    .errors
                    .lock()
                    .expect("errors")
                    .entry(kind.into())
                    .or_default() += 1;
            }
            other => self
                .unexpected
                .lock()
                .expect("unexpected")
                .push(format!("{what}: {other}")),
        }
    }

    fn error_count(&self) -> u64 {
        self.errors.lock().expect("errors").values().sum()
    }
}

fn options(url: &str, acquire: Duration) -> PostgresOptions {
    PostgresOptions {
        schema: Some(SCHEMA.into()),
        pool_size: 6,
        acquire_timeout: acquire,
        ..PostgresOptions::new(url)
    }
}

/// Runs a conversation's requests to the end whatever fails: a request is
/// run, or recovered when a failed run left it active, until it is
/// completed.
async fn drive(
    store: Arc<dyn Store>,
    session: AgentSession,
    conversation: ConversationPlan,
    seen: Arc<Seen>,
    committed: Arc<AtomicUsize>,
) {
    let pause = || tokio::time::sleep(Duration::from_millis(100));
    for request in &conversation.requests {
        let what = format!(
            "conversation {} request {}",
            conversation.index, request.index
        );
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut failed = false;
        loop {
            assert!(Instant::now() < deadline, "{what}: not done in 120 s");
            let status = match store.request(request.id).await {
                Ok(record) => record.map(|r| r.status),
                Err(e) => {
                    seen.error(&format!("{what}: request"), &e);
                    pause().await;
                    continue;
                }
            };
            let result = match status {
                Some(RequestStatus::Completed) => {
                    if failed {
                        seen.committed_despite_an_error
                            .fetch_add(1, Ordering::SeqCst);
                    }
                    break;
                }
                Some(RequestStatus::Abandoned) => panic!("{what} was abandoned"),
                None => {
                    session
                        .run(request.id, &request.input, RunContext::default())
                        .await
                }
                Some(RequestStatus::Active) => {
                    let admission = match store.admission(conversation.id).await {
                        Ok(admission) => admission,
                        Err(e) => {
                            seen.error(&format!("{what}: admission"), &e);
                            pause().await;
                            continue;
                        }
                    };
                    seen.recoveries.fetch_add(1, Ordering::SeqCst);
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
            };
            match result {
                Ok(outcome) => {
                    assert!(!outcome.replayed, "{what}: replayed before it committed");
                    break;
                }
                Err(e) => {
                    failed = true;
                    seen.error(&what, &e);
                    pause().await;
                }
            }
        }
        committed.fetch_add(1, Ordering::SeqCst);
    }
}

/// Every acknowledged write is in the database.
async fn assert_acked_durable(pool: &PgPool, acked: &[Acked], at: &str) -> usize {
    for write in acked {
        let request = write.request.as_uuid();
        let turn = write.turn.map(i64::from);
        let found: bool =
            match write.op {
                "claim" => {
                    sqlx::query_scalar(
                        "SELECT EXISTS (SELECT 1 FROM requests WHERE request_id = $1)",
                    )
                    .bind(request)
                    .fetch_one(pool)
                    .await
                }
                "commit" => {
                    sqlx::query_scalar(
                        "SELECT EXISTS (SELECT 1 FROM requests WHERE request_id = $1
                     AND status = 'completed')",
                    )
                    .bind(request)
                    .fetch_one(pool)
                    .await
                }
                "record_tool_result" => sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM tool_calls WHERE request_id = $1 AND turn = $2
                     AND call_id = $3 AND status IN ('completed', 'failed'))",
                )
                .bind(request)
                .bind(turn)
                .bind(write.call_id.as_deref().map(str::as_bytes))
                .fetch_one(pool)
                .await,
                "record_model_response" => sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM all_checkpoints WHERE run_id = $1 AND turn = $2
                     AND phase NOT IN ('turn_in_flight', 'model_pending'))",
                )
                .bind(write.run.map(|r| r.as_uuid()))
                .bind(turn)
                .fetch_one(pool)
                .await,
                "finish_turn" => sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM all_checkpoints WHERE run_id = $1 AND turn = $2
                     AND phase = 'ready')",
                )
                .bind(write.run.map(|r| r.as_uuid()))
                .bind(turn)
                .fetch_one(pool)
                .await,
                _ => Ok(true),
            }
            .unwrap_or_else(|e| panic!("{at}: reading back {write:?}: {e}"));
        assert!(found, "{at}: an acknowledged write was lost: {write:?}");
    }
    acked.len()
}

#[tokio::test]
async fn server_crashes_mid_run_lose_nothing_acknowledged_and_every_request_completes_once() {
    let started = Instant::now();
    let kills = env_number("TURNSTILE_SERVER_KILLS", DEFAULT_KILLS);
    let seed = env_number("TURNSTILE_TORTURE_SEED", DEFAULT_SEED);
    let (retries, _counting) = durability::count_retries_here();
    let server = Arc::new(Server::start_own());
    let url = server.fresh_database();
    let tmp = tempfile::tempdir().expect("temp dir");
    let log: PathBuf = tmp.path().join("effects.log");
    let plan = Plan::new(seed, REQUESTS);
    let total = plan.requests().count();

    let patient = PostgresStore::connect_with(options(&url, Duration::from_secs(30)))
        .await
        .expect("connect the patient store");
    let hasty = PostgresStore::connect_with(options(&url, Duration::from_millis(300)))
        .await
        .expect("connect the hasty store");
    // The tools read the journal through a patient store of their own.
    let journal: Arc<dyn Store> = Arc::new(
        PostgresStore::connect_with(options(&url, Duration::from_secs(30)))
            .await
            .expect("connect the tools' store"),
    );
    let pool = durability::inspect_pool(&url, SCHEMA);
    let epoch = Arc::new(AtomicU64::new(0));
    let watches = [
        Arc::new(Watch {
            epoch: epoch.clone(),
            ..Watch::default()
        }),
        Arc::new(Watch {
            epoch: epoch.clone(),
            ..Watch::default()
        }),
    ];
    let seen = [Arc::new(Seen::default()), Arc::new(Seen::default())];
    let stores: [Arc<dyn Store>; 2] = [
        Arc::new(Hooked {
            inner: Arc::new(patient.clone()),
            hook: watches[0].clone(),
        }),
        Arc::new(Hooked {
            inner: Arc::new(hasty.clone()),
            hook: watches[1].clone(),
        }),
    ];
    let tools = Arc::new(ToolWatch::default());
    let committed = Arc::new(AtomicUsize::new(0));
    let drivers: Vec<_> = plan
        .conversations
        .iter()
        .map(|conversation| {
            let which = usize::from(conversation.index >= PATIENT);
            let store = stores[which].clone();
            let (agent, _) = durability::checked_agent(
                conversation,
                &log,
                true,
                journal.clone(),
                tools.clone(),
                None,
            );
            let session = AgentSession::new(
                agent,
                store.clone(),
                conversation.id,
                namespace(),
                ContextPolicy::default(),
            );
            tokio::spawn(drive(
                store,
                session,
                conversation.clone(),
                seen[which].clone(),
                committed.clone(),
            ))
        })
        .collect();

    // The crashes, spread over the work: crash k once (k+1)/(kills+1) of
    // the requests are committed, a seeded moment later.
    let mut rng = Rng::derive(seed, &[0x6b69_6c6c]);
    let mut in_flight_at_kills = Vec::new();
    let mut outages = Vec::new();
    let mut acked_checked = 0;
    for k in 0..kills {
        let threshold = total * (k as usize + 1) / (kills as usize + 1);
        while committed.load(Ordering::SeqCst) < threshold {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.range(0, 30))).await;
        // Crash while a patient write is in flight, when one comes within a
        // second (the patient conversations may be done by now), so that
        // riding through an outage is seen and not left to chance.
        let waiting = Instant::now();
        while watches[0].in_flight.load(Ordering::SeqCst) == 0
            && waiting.elapsed() < Duration::from_secs(1)
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        in_flight_at_kills.push(
            watches
                .iter()
                .map(|w| w.in_flight.load(Ordering::SeqCst))
                .sum::<i64>(),
        );
        epoch.fetch_add(1, Ordering::SeqCst);
        let down = Instant::now();
        let stopping = server.clone();
        tokio::task::spawn_blocking(move || stopping.stop_immediate())
            .await
            .expect("stop the server");
        tokio::time::sleep(Duration::from_millis(rng.range(100, 1_500))).await;
        let restarting = server.clone();
        tokio::task::spawn_blocking(move || restarting.restart())
            .await
            .expect("restart the server");
        outages.push(down.elapsed());
        // Nothing acknowledged before (or since) the crash is lost.
        let acked: Vec<Acked> = watches
            .iter()
            .flat_map(|w| w.acked.lock().expect("acked").clone())
            .collect();
        acked_checked =
            assert_acked_durable(&pool, &acked, &format!("after crash {}", k + 1)).await;
    }
    let crashes_done = started.elapsed();
    for driver in drivers {
        driver.await.expect("a driver panicked");
    }

    // The end: everything committed once, as the crash-free run commits it.
    let store: Arc<dyn Store> = Arc::new(patient.clone());
    let mut conn = pool.acquire().await.expect("inspection connection");
    let violations = durability::consistency_violations(&mut conn).await;
    drop(conn);
    assert!(violations.is_empty(), "inconsistent: {violations:#?}");
    let mut runs_per_request: BTreeMap<RequestId, i64> = BTreeMap::new();
    for (_, request) in plan.requests() {
        let runs: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM all_runs WHERE request_id = $1")
            .bind(request.id.as_uuid())
            .fetch_one(&pool)
            .await
            .expect("count runs");
        runs_per_request.insert(request.id, runs);
    }
    let recovered: HashSet<RequestId> = runs_per_request
        .iter()
        .filter(|(_, &n)| n > 1)
        .map(|(&id, _)| id)
        .collect();
    let reference = durability::reference_run(&plan, &tmp.path().join("reference.log")).await;
    let journaled = checks::assert_plan_committed(store, &plan, &reference, &recovered, &log).await;
    let effects = checks::effects_in(&log);

    let say = |name: &str, value: &dyn std::fmt::Display| {
        println!("server crash: {name}: {value}");
    };
    say("seed", &seed);
    say("server crashes (pg_ctl stop -m immediate)", &kills);
    say(
        "  outages (stop to accepting again)",
        &format!("{outages:?}"),
    );
    say(
        "  store steps in flight at each crash",
        &format!("{in_flight_at_kills:?}"),
    );
    say(
        "acknowledged writes read back after the last restart",
        &acked_checked,
    );
    for (name, i) in [("patient", 0), ("hasty", 1)] {
        say(
            &format!("{name} store: steps that rode through an outage"),
            &watches[i].rode_through.load(Ordering::SeqCst),
        );
        say(
            &format!("{name} store: failed steps"),
            &watches[i].failed.load(Ordering::SeqCst),
        );
        say(
            &format!("{name} store: errors callers got"),
            &format!("{:?}", seen[i].errors.lock().expect("errors")),
        );
        say(
            &format!("{name} store: recoveries"),
            &seen[i].recoveries.load(Ordering::SeqCst),
        );
        say(
            &format!("{name} store: commits whose caller got an error"),
            &seen[i].committed_despite_an_error.load(Ordering::SeqCst),
        );
    }
    say("requests", &total);
    say("  with more than one run", &recovered.len());
    say("tool calls journaled", &journaled);
    say(
        "tool executions (re-runs of unjournaled calls included)",
        &tools.executions.load(Ordering::SeqCst),
    );
    say("store retries (its tracing)", &retries.count());
    for (cause, n) in retries.causes(6) {
        say("  retried after", &format!("{n} x {cause}"));
    }
    say(
        "elapsed (crashes / total)",
        &format!(
            "{:.1} s / {:.1} s",
            crashes_done.as_secs_f64(),
            started.elapsed().as_secs_f64()
        ),
    );

    for s in &seen {
        let unexpected = s.unexpected.lock().expect("unexpected");
        assert!(
            unexpected.is_empty(),
            "errors other than store errors reached callers: {unexpected:#?}"
        );
    }
    let reruns = tools
        .reruns_of_journaled_calls
        .lock()
        .expect("reruns")
        .clone();
    assert!(reruns.is_empty(), "journaled calls ran again: {reruns:#?}");
    // The patient store rode through every crash: no error, no recovery.
    assert_eq!(
        seen[0].error_count(),
        0,
        "the patient store's callers got errors: {:?}",
        seen[0].errors.lock().expect("errors")
    );
    for conversation in &plan.conversations[..PATIENT] {
        for request in &conversation.requests {
            assert_eq!(
                runs_per_request[&request.id], 1,
                "a patient request needed a recovery"
            );
        }
    }
    assert!(
        watches[0].rode_through.load(Ordering::SeqCst) > 0,
        "no step of the patient store was in flight across a crash"
    );
    // The hasty store failed, and its requests were recovered.
    assert!(
        seen[1].error_count() > 0,
        "the hasty store never failed: the crashes missed"
    );
    assert!(
        seen[1].recoveries.load(Ordering::SeqCst) > 0,
        "no hasty request was recovered"
    );
    // A call ran more than once only in a request that was recovered.
    for (key, &n) in &effects {
        if n > 1 {
            let request: RequestId = key
                .split('/')
                .next()
                .and_then(|r| r.parse().ok())
                .expect("a key starts with its request id");
            assert!(
                recovered.contains(&request),
                "{key} ran {n} times in a request that was never recovered"
            );
        }
    }
    assert!(in_flight_at_kills.iter().sum::<i64>() > 0);
    pool.close().await;
    patient.close().await;
    hasty.close().await;
}
