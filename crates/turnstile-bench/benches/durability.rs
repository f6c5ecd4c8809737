//! Criterion benchmarks of turnstile's durable steps, in both durability
//! modes, on temp-file WAL databases. Each group that is compared with the
//! bare-insert floor measures that floor itself, in the same run.
//!
//! ```sh
//! cargo bench --bench durability                 # everything, a few minutes
//! cargo bench --bench durability -- 'step/'      # one group
//! ```
//!
//! Results and the targets they are held to: docs/performance.md.

use turnstile_bench as support;

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use turnstile::{RequestId, RunContext, SqliteStore, Store};

use support::{
    admitted, agent, open_store, run_request, runtime, seeded_conversation, session, temp_dir,
    text, BareInsert, BareInsertConn, TurnWriter, MESSAGE_BYTES, MODES,
};

/// The commit floor and the write paths measured against it: one turn with
/// one tool call through the `Store` trait, an admission claimed and
/// released, a one-turn request through `AgentSession::run`.
fn step(c: &mut Criterion) {
    let rt = runtime();
    let dir = temp_dir();
    let mut group = c.benchmark_group("step");
    // One empty round trip to a connection's worker thread (`ping`): what
    // every statement, BEGIN, COMMIT and pool hand-over costs at least.
    let conn = tokio::sync::Mutex::new(rt.block_on(BareInsertConn::open(
        &dir.path().join("round-trip.db"),
        turnstile::Durability::Normal,
    )));
    group.bench_function("baseline/round_trip", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let conn = &conn;
            async move {
                let mut conn = conn.lock().await;
                let start = Instant::now();
                for _ in 0..iters {
                    conn.ping().await;
                }
                start.elapsed()
            }
        })
    });
    for (durability, mode) in MODES {
        bare_commits(&mut group, &rt, dir.path(), durability, mode);

        let store = rt.block_on(open_store(
            &dir.path().join(format!("store-{mode}.db")),
            durability,
        ));
        let store: &dyn Store = &store;
        // Per turn: record_model_response, record_tool_result, finish_turn
        // with the next write-ahead (3 commits). Each sample continues a new
        // request.
        group.bench_function(BenchmarkId::new("turn/write", mode), |b| {
            b.to_async(&rt).iter_custom(|iters| async move {
                let mut writer = TurnWriter::new(admitted(store).await);
                let start = Instant::now();
                for _ in 0..iters {
                    writer.tool_turn(store).await;
                }
                start.elapsed()
            })
        });

        // Store::claim then Store::abandon at known revisions (2 commits).
        group.bench_function(BenchmarkId::new("admission/claim_release", mode), |b| {
            b.to_async(&rt).iter_custom(|iters| async move {
                let fence = admitted(store).await;
                let mut revision = store
                    .abandon(fence.conversation_id, fence.request_id, fence.revision)
                    .await
                    .expect("abandon");
                let input = text("user", MESSAGE_BYTES);
                let start = Instant::now();
                for _ in 0..iters {
                    let request_id = RequestId::new();
                    let claim = turnstile::store::NewRequest {
                        conversation_id: fence.conversation_id,
                        request_id,
                        input_sha256: turnstile::store::InputHash::of(&input),
                        input: turnstile::Message::user(input.clone()),
                        expected_revision: revision,
                        expected_created_at: None,
                        run_id: turnstile::RunId::first_of(request_id),
                        agent_fingerprint: "bench".into(),
                        first_turn: None,
                        deadline_at: None,
                        budget: Default::default(),
                    };
                    let turnstile::store::ClaimOutcome::Admitted(held) =
                        store.claim(&claim).await.expect("claim")
                    else {
                        panic!("fresh request id already known");
                    };
                    revision = store
                        .abandon(held.conversation_id, held.request_id, held.revision)
                        .await
                        .expect("abandon");
                }
                start.elapsed()
            })
        });

        // A request answered in one turn, end to end through AgentSession:
        // reads, the claim (with the write-ahead), the commit.
        let store: Arc<dyn Store> = Arc::new(rt.block_on(open_store(
            &dir.path().join(format!("session-{mode}.db")),
            durability,
        )));
        group.bench_function(BenchmarkId::new("request/one_turn", mode), |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let store = store.clone();
                async move {
                    let session = session(agent(1), store);
                    let input = text("user", MESSAGE_BYTES);
                    run_request(&session, &input).await;
                    let start = Instant::now();
                    for _ in 0..iters {
                        run_request(&session, &input).await;
                    }
                    start.elapsed()
                }
            })
        });
    }
    group.finish();
}

/// What a resume and a new request read: the latest checkpoint of the
/// stopped run and the transcript window (50), for conversations of 100,
/// 1,000 and 10,000 committed messages; and the replay of a completed
/// request.
fn read(c: &mut Criterion) {
    let rt = runtime();
    let dir = temp_dir();
    let mut group = c.benchmark_group("read");
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(3));
    for messages in [100, 1_000, 10_000] {
        let path = dir.path().join(format!("conversation-{messages}.db"));
        // Seeded once, quickly; reads do not depend on `synchronous`, but
        // each mode reads through a store opened with its own options.
        let (conversation, fence) = rt.block_on(async {
            let seeder: Arc<dyn Store> =
                Arc::new(open_store(&path, turnstile::Durability::Normal).await);
            seeded_conversation(seeder, messages).await
        });
        for (durability, mode) in MODES {
            let store = rt.block_on(open_store(&path, durability));
            let store = &store;
            let id = format!("{mode}/{messages}");
            group.bench_function(BenchmarkId::new("resume/latest_checkpoint", &id), |b| {
                b.to_async(&rt).iter(|| async move {
                    black_box(
                        store
                            .latest_checkpoint(fence.run_id)
                            .await
                            .expect("checkpoint"),
                    )
                })
            });
            group.bench_function(BenchmarkId::new("context/window_load", &id), |b| {
                b.to_async(&rt).iter(|| async move {
                    black_box(
                        store
                            .transcript_window(conversation, 50)
                            .await
                            .expect("window"),
                    )
                })
            });
            group.bench_function(BenchmarkId::new("resume/checkpoint_and_window", &id), |b| {
                // Read at once, as a resumed run reads them.
                b.to_async(&rt).iter(|| async move {
                    let (checkpoint, window) = tokio::join!(
                        store.latest_checkpoint(fence.run_id),
                        store.transcript_window(conversation, 50)
                    );
                    black_box((checkpoint.expect("checkpoint"), window.expect("window")))
                })
            });
        }
    }

    for (durability, mode) in MODES {
        let store: Arc<dyn Store> = Arc::new(rt.block_on(open_store(
            &dir.path().join(format!("replay-{mode}.db")),
            durability,
        )));
        let session = session(agent(2), store);
        let input = text("user", MESSAGE_BYTES);
        let request = RequestId::new();
        rt.block_on(async {
            for _ in 0..24 {
                run_request(&session, &input).await;
            }
            session
                .run(request, &input, RunContext::default())
                .await
                .expect("request");
        });
        let (session, input) = (&session, input.as_str());
        group.bench_function(BenchmarkId::new("replay/completed_request", mode), |b| {
            b.to_async(&rt).iter(|| async move {
                let outcome = session
                    .run(request, input, RunContext::default())
                    .await
                    .expect("replay");
                assert!(outcome.replayed);
                black_box(outcome)
            })
        });
    }
    group.finish();
}

/// Turns per second of 1, 8 and 64 sessions in one process sharing one
/// store, each running 2-turn requests (a tool call, then the answer) with a
/// zero-latency scripted model; and the commit floor of the same run.
fn concurrency(c: &mut Criterion) {
    let rt = runtime();
    let dir = temp_dir();
    let mut group = c.benchmark_group("concurrency");
    group.sampling_mode(SamplingMode::Flat);
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(6));
    for (durability, mode) in MODES {
        group.throughput(Throughput::Elements(1));
        bare_commits(&mut group, &rt, dir.path(), durability, mode);

        for sessions in [1usize, 8, 64] {
            let store: Arc<dyn Store> = Arc::new(rt.block_on(open_store(
                &dir.path().join(format!("sessions-{mode}-{sessions}.db")),
                durability,
            )));
            let input = Arc::new(text("user", MESSAGE_BYTES));
            // Each conversation exists before the clock starts.
            let all: Vec<Arc<turnstile::AgentSession>> = (0..sessions)
                .map(|_| Arc::new(session(agent(2), store.clone())))
                .collect();
            rt.block_on(async {
                for s in &all {
                    run_request(s, &input).await;
                }
            });
            // One element is one turn: each iteration every session runs one
            // 2-turn request.
            group.throughput(Throughput::Elements(2 * sessions as u64));
            group.bench_function(
                BenchmarkId::new("turns", format!("{mode}/{sessions}")),
                |b| {
                    b.to_async(&rt).iter_custom(|iters| {
                        let all = all.clone();
                        let input = input.clone();
                        async move {
                            let start = Instant::now();
                            let tasks: Vec<_> = all
                                .into_iter()
                                .map(|s| {
                                    let input = input.clone();
                                    tokio::spawn(async move {
                                        for _ in 0..iters {
                                            run_request(&s, &input).await;
                                        }
                                    })
                                })
                                .collect();
                            for task in tasks {
                                task.await.expect("session task");
                            }
                            start.elapsed()
                        }
                    })
                },
            );
        }
    }
    group.finish();
}

/// A test harness: 100 sessions × one 10-turn request each (1,000 turns)
/// per iteration on `SqliteStore::in_memory()`, all concurrent.
fn harness(c: &mut Criterion) {
    const SESSIONS: usize = 100;
    const TURNS: usize = 10;
    let rt = runtime();
    let mut group = c.benchmark_group("harness");
    group.sampling_mode(SamplingMode::Flat);
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(10));
    let bare = rt.block_on(BareInsert::in_memory());
    group.throughput(Throughput::Elements(1));
    group.bench_function("baseline/bare_insert_commit/in_memory", |b| {
        b.to_async(&rt).iter(|| bare.insert_commit())
    });
    group.throughput(Throughput::Elements((SESSIONS * TURNS) as u64));
    let input = Arc::new(text("user", MESSAGE_BYTES));
    group.bench_function(
        BenchmarkId::new("in_memory", format!("{SESSIONS}x{TURNS}")),
        |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let input = input.clone();
                async move {
                    let store: Arc<dyn Store> =
                        Arc::new(SqliteStore::in_memory().await.expect("in-memory store"));
                    let mut elapsed = Duration::ZERO;
                    for _ in 0..iters {
                        let sessions: Vec<_> = (0..SESSIONS)
                            .map(|_| session(agent(TURNS), store.clone()))
                            .collect();
                        let start = Instant::now();
                        let tasks: Vec<_> = sessions
                            .into_iter()
                            .map(|s| {
                                let input = input.clone();
                                tokio::spawn(async move { run_request(&s, &input).await })
                            })
                            .collect();
                        for task in tasks {
                            task.await.expect("session task");
                        }
                        elapsed += start.elapsed();
                    }
                    elapsed
                }
            })
        },
    );
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .without_plots()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .sample_size(20)
}

/// The floors of one durable step, measured in the group that compares
/// against them: a single-row INSERT transaction through a one-connection
/// pool, and on a bare connection (the store's file writer is one).
fn bare_commits(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    rt: &tokio::runtime::Runtime,
    dir: &std::path::Path,
    durability: turnstile::Durability,
    mode: &str,
) {
    let bare = rt.block_on(BareInsert::open(
        &dir.join(format!("bare-{mode}.db")),
        durability,
    ));
    group.bench_function(BenchmarkId::new("baseline/bare_insert_commit", mode), |b| {
        b.to_async(rt).iter(|| bare.insert_commit())
    });
    let conn = tokio::sync::Mutex::new(rt.block_on(BareInsertConn::open(
        &dir.join(format!("bare-conn-{mode}.db")),
        durability,
    )));
    group.bench_function(
        BenchmarkId::new("baseline/bare_insert_commit_no_pool", mode),
        |b| {
            b.to_async(rt).iter_custom(|iters| {
                let conn = &conn;
                async move {
                    let mut conn = conn.lock().await;
                    let start = Instant::now();
                    for _ in 0..iters {
                        conn.insert_commit().await;
                    }
                    start.elapsed()
                }
            })
        },
    );
}

criterion_group! {
    name = benches;
    config = config();
    targets = step, read, concurrency, harness
}
criterion_main!(benches);
