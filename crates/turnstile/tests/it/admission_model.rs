//! A property test of the admission state machine: random sequences of
//! session operations run against the real store (in-memory SQLite) and
//! against a small reference model written here; after every step both must
//! agree on what the caller got (outcome or error, with its ids and
//! revisions) and on the admission (idle or held, by which request and run,
//! at which revision, with which latest checkpoint), the conversation
//! version and the status of the requests the step touched.
//!
//! Operations: a request run (new id, replay of a completed id, an id reused
//! with another input, an active or abandoned id), a run that "crashes" at a
//! random step (its future is dropped while the model or a tool blocks, or it
//! stops on a model failure, its turn budget or a cancellation, leaving the
//! admission held), `resume_run` and `recover_after_owner_exit` with a right
//! or wrong revision under either policy (and crashing again), `abandon`,
//! several new requests racing for the conversation, several recoverers
//! racing for one request, and a request id reused in another conversation.
//!
//! The agent is fixed: turn 1 asks for one tool call, turn 2 answers. A
//! failure prints the shrunk operation sequence (`PROPTEST_RNG_SEED` pins the
//! generator).
//!
//! `a_resumed_tool_round_that_dies_mid_tool_is_refused_as_ambiguous` is the
//! regression test of a bug this model found (a resumed pending tool round
//! ran its tool without marking the turn in flight).

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use turnstile::agent::{ModelRequest, ModelResponse};
use turnstile::store::RequestStatus;
use turnstile::{
    Agent, AgentSession, Budget, CheckpointPhase, ContextPolicy, ConversationId, Error, Message,
    Model, ModelError, Namespace, Outcome, RequestId, ResumePolicy, Revision, RunContext, RunId,
    SqliteStore, Store, Tool, ToolCall, ToolContext, ToolError, ToolSpec, Usage,
};

/// Sequences run; each is at most [`MAX_OPS`] operations long.
const CASES: u32 = 1_000;
const MAX_OPS: usize = 20;
/// A step that takes longer than this is hung.
const STEP_DEADLINE: Duration = Duration::from_secs(20);

#[test]
fn admission_state_machine_matches_the_reference_model() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // One store for every case; each case has conversations of its own.
    let store: Arc<dyn Store> = Arc::new(
        runtime
            .block_on(SqliteStore::in_memory())
            .expect("in-memory store"),
    );
    let config = Config {
        cases: CASES,
        // Nothing is written next to the sources; the seed reproduces.
        failure_persistence: None,
        max_shrink_iters: 2_048,
        ..Config::default()
    };
    let started = Instant::now();
    let steps = AtomicUsize::new(0);
    let seen = std::sync::Mutex::new(BTreeMap::new());
    let mut runner = TestRunner::new(config);
    let result = runner.run(&vec(op(), 1..=MAX_OPS), |ops| {
        steps.fetch_add(ops.len(), Ordering::Relaxed);
        runtime
            .block_on(check(store.clone(), &ops, &seen))
            .map_err(TestCaseError::fail)
    });
    match result {
        Ok(()) => {
            let seen = seen.into_inner().expect("tally");
            println!(
                "admission model: {CASES} sequences, {} steps, agreed in {:?}; callers got {seen:?}",
                steps.load(Ordering::Relaxed),
                started.elapsed()
            );
            // The generator reaches every answer the model knows.
            for kind in OBS_KINDS {
                assert!(seen.contains_key(kind), "no step ever answered {kind}");
            }
        }
        Err(TestError::Fail(reason, ops)) => {
            panic!("{reason}\n\nminimal failing sequence:\n{ops:#?}")
        }
        Err(e) => panic!("{e}"),
    }
}

// ---------------------------------------------------------------------------
// Operations

/// Which request an operation names.
#[derive(Clone, Copy, Debug)]
enum Who {
    /// An id never used before: a new request for `Run`, unknown otherwise.
    New,
    /// The request holding the admission (else the latest admitted one).
    Holder,
    /// One of the ids used so far (index modulo their number).
    Known(u8),
}

/// Which run `Resume` names.
#[derive(Clone, Copy, Debug)]
enum WhichRun {
    /// The run holding the admission (else the latest run).
    Holder,
    /// One of the runs so far (index modulo their number).
    Known(u8),
    /// A run id that does not exist.
    Unknown,
}

/// The input given with a request id.
#[derive(Clone, Copy, Debug)]
enum Input {
    /// `input {n}`: what the id is (or will be) bound to, unless it was first
    /// admitted with the other one.
    Same,
    /// `other input {n}`.
    Other,
}

/// The expected revision an operation states.
#[derive(Clone, Copy, Debug)]
enum Rev {
    Current,
    /// One behind (one ahead at revision 0).
    Stale,
    Ahead,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Policy {
    RejectAmbiguous,
    RetryInterruptedTurn,
}

/// How the run an operation starts (if any) goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Behavior {
    /// Runs to its commit.
    Complete,
    /// Its next model call blocks and the run's future is dropped (a crash).
    CrashInModel,
    /// Its next tool call blocks and the run's future is dropped (a crash).
    CrashInTool,
    /// Its next model call fails (`Error::Model`).
    ModelFails,
    /// Its budget is one turn (`Error::BudgetExceeded` at turn 2).
    OneTurnBudget,
    /// Its budget has no tool calls (`Error::BudgetExceeded` at its tool
    /// round, before the tool).
    NoToolBudget,
    /// Cancelled before it starts (`Error::Cancelled`).
    Cancelled,
}

#[derive(Clone, Debug)]
enum Op {
    /// `run` (new id, replay, reused id).
    Run {
        who: Who,
        input: Input,
        behavior: Behavior,
    },
    /// `resume_run`.
    Resume {
        run: WhichRun,
        rev: Rev,
        policy: Policy,
        behavior: Behavior,
    },
    /// `recover_after_owner_exit`.
    Recover {
        who: Who,
        input: Input,
        rev: Rev,
        policy: Policy,
        behavior: Behavior,
    },
    /// `abandon`.
    Abandon { who: Who, rev: Rev },
    /// New requests run at once; every model call blocks, so a winner holds
    /// the admission until it is dropped.
    ConcurrentRuns { callers: u8 },
    /// Recoverers of the holder at once; every model call blocks.
    ConcurrentRecover {
        rev: Rev,
        policy: Policy,
        callers: u8,
    },
    /// `run` of an admitted id in another conversation.
    RunElsewhere { who: u8 },
}

/// The request a run names: often a new one.
fn who() -> impl Strategy<Value = Who> {
    prop_oneof![
        3 => Just(Who::New),
        2 => Just(Who::Holder),
        2 => any::<u8>().prop_map(Who::Known),
    ]
}

/// The request a recovery or an abandon names: mostly an existing one.
fn target() -> impl Strategy<Value = Who> {
    prop_oneof![
        1 => Just(Who::New),
        5 => Just(Who::Holder),
        3 => any::<u8>().prop_map(Who::Known),
    ]
}

fn input() -> impl Strategy<Value = Input> {
    prop_oneof![5 => Just(Input::Same), 1 => Just(Input::Other)]
}

fn rev() -> impl Strategy<Value = Rev> {
    prop_oneof![6 => Just(Rev::Current), 1 => Just(Rev::Stale), 1 => Just(Rev::Ahead)]
}

fn policy() -> impl Strategy<Value = Policy> {
    prop_oneof![
        Just(Policy::RejectAmbiguous),
        Just(Policy::RetryInterruptedTurn)
    ]
}

fn behavior() -> impl Strategy<Value = Behavior> {
    prop_oneof![
        3 => Just(Behavior::Complete),
        2 => Just(Behavior::CrashInModel),
        2 => Just(Behavior::CrashInTool),
        1 => Just(Behavior::ModelFails),
        1 => Just(Behavior::OneTurnBudget),
        1 => Just(Behavior::NoToolBudget),
        1 => Just(Behavior::Cancelled),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (who(), input(), behavior())
            .prop_map(|(who, input, behavior)| Op::Run { who, input, behavior }),
        2 => (
            prop_oneof![
                3 => Just(WhichRun::Holder),
                2 => any::<u8>().prop_map(WhichRun::Known),
                1 => Just(WhichRun::Unknown),
            ],
            rev(),
            policy(),
            behavior(),
        )
            .prop_map(|(run, rev, policy, behavior)| Op::Resume { run, rev, policy, behavior }),
        3 => (target(), input(), rev(), policy(), behavior()).prop_map(
            |(who, input, rev, policy, behavior)| Op::Recover { who, input, rev, policy, behavior }
        ),
        2 => (target(), rev()).prop_map(|(who, rev)| Op::Abandon { who, rev }),
        1 => (2u8..=4).prop_map(|callers| Op::ConcurrentRuns { callers }),
        1 => (rev(), policy(), 2u8..=4)
            .prop_map(|(rev, policy, callers)| Op::ConcurrentRecover { rev, policy, callers }),
        1 => any::<u8>().prop_map(|who| Op::RunElsewhere { who }),
    ]
}

// ---------------------------------------------------------------------------
// The reference model

/// The latest checkpoint of the run holding the admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Progress {
    /// No checkpoint: the run is at the request's start.
    Start,
    /// `TurnInFlight` at this turn (ambiguous).
    InFlight(u32),
    /// `ModelPending` at this turn.
    Pending(u32),
    /// `ToolsInFlight` at turn 1, a tool maybe running (ambiguous).
    ToolsInFlight,
    /// `ToolsPending` at turn 1.
    ToolsPending,
    /// `Ready` after turn 1.
    Ready,
}

impl Progress {
    /// The turn a `RejectAmbiguous` recovery refuses, if any.
    fn ambiguous_turn(self) -> Option<u32> {
        match self {
            Progress::InFlight(turn) => Some(turn),
            Progress::ToolsInFlight => Some(1),
            _ => None,
        }
    }

    /// The checkpoint row this stands for: (phase, turn).
    fn row(self) -> Option<(CheckpointPhase, u32)> {
        match self {
            Progress::Start => None,
            Progress::InFlight(t) => Some((CheckpointPhase::TurnInFlight, t)),
            Progress::Pending(t) => Some((CheckpointPhase::ModelPending, t)),
            Progress::ToolsInFlight => Some((CheckpointPhase::ToolsInFlight, 1)),
            Progress::ToolsPending => Some((CheckpointPhase::ToolsPending, 1)),
            Progress::Ready => Some((CheckpointPhase::Ready, 1)),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StopKind {
    Model,
    Budget,
    Cancelled,
}

/// How a run ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Committed,
    Crashed,
    Stopped(StopKind),
}

/// Where a run that continues from `p` ends with `behavior`, and the
/// latest checkpoint it leaves. The turn protocol: a new request's claim
/// saves turn 1's `TurnInFlight` with it; the model step checks
/// cancellation, calls the model (marking a `ModelPending` turn in flight
/// again first) and records `ToolsInFlight` or commits; the tool
/// step checks its budget, then cancellation before the tool, and saves
/// `Ready` together with the next turn's `TurnInFlight` when the turn budget
/// and cancellation let it start (else the next turn stops on them). A stop
/// the loop chooses settles an in-flight checkpoint to pending, unless a
/// tool was running, or the run took over a tool round already in flight
/// (its call may have had an unjournaled effect) and stopped before it ran
/// that call again.
fn simulate(mut p: Progress, behavior: Behavior) -> (End, Progress) {
    let inherited_tool_round = p == Progress::ToolsInFlight;
    let stopped_tool_round = |p: Progress| match p {
        Progress::ToolsInFlight if inherited_tool_round => Progress::ToolsInFlight,
        _ => Progress::ToolsPending,
    };
    loop {
        match p {
            // Turn 1's write-ahead (with the claim, for a fresh run), unless
            // the run is cancelled before it may start: then nothing.
            Progress::Start => {
                if behavior == Behavior::Cancelled {
                    return (End::Stopped(StopKind::Cancelled), p);
                }
                p = Progress::InFlight(1);
            }
            // The next turn's write-ahead (shared with the `Ready` commit
            // when it may start).
            Progress::Ready => {
                if behavior == Behavior::OneTurnBudget {
                    return (End::Stopped(StopKind::Budget), p);
                }
                if behavior == Behavior::Cancelled {
                    return (End::Stopped(StopKind::Cancelled), p);
                }
                p = Progress::InFlight(2);
            }
            // The model step checks the turn limit first (a resumed run's
            // budget may be lower than the one that wrote the write-ahead).
            Progress::InFlight(turn) | Progress::Pending(turn)
                if behavior == Behavior::OneTurnBudget && turn > 1 =>
            {
                return (End::Stopped(StopKind::Budget), Progress::Pending(turn))
            }
            Progress::InFlight(turn) | Progress::Pending(turn) => match behavior {
                Behavior::Cancelled => {
                    return (End::Stopped(StopKind::Cancelled), Progress::Pending(turn))
                }
                // A pending turn is marked in flight again before the call.
                Behavior::CrashInModel => return (End::Crashed, Progress::InFlight(turn)),
                Behavior::ModelFails => {
                    return (End::Stopped(StopKind::Model), Progress::Pending(turn))
                }
                _ if turn == 1 => p = Progress::ToolsInFlight,
                _ => return (End::Committed, p),
            },
            Progress::ToolsInFlight | Progress::ToolsPending => match behavior {
                Behavior::NoToolBudget => {
                    return (End::Stopped(StopKind::Budget), stopped_tool_round(p))
                }
                Behavior::Cancelled => {
                    return (End::Stopped(StopKind::Cancelled), stopped_tool_round(p))
                }
                // A pending tool round is marked in flight again before its
                // tool runs (the bug
                // `a_resumed_tool_round_that_dies_mid_tool_is_refused_as_ambiguous`
                // found).
                Behavior::CrashInTool => return (End::Crashed, Progress::ToolsInFlight),
                _ => p = Progress::Ready,
            },
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Status {
    /// The id was handed out but never admitted: the store has no row.
    Unused,
    Active,
    /// Committed by this run, producing this conversation version.
    Completed {
        run: usize,
        version: u64,
    },
    Abandoned,
}

#[derive(Clone, Debug)]
struct RequestState {
    status: Status,
    /// The input it was admitted with.
    bound: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Holder {
    request: usize,
    run: usize,
    progress: Progress,
}

/// The admission state machine of one conversation, in tokens: requests and
/// runs are numbered in the order they appear.
#[derive(Clone, Debug, Default)]
struct Reference {
    revision: u64,
    holder: Option<Holder>,
    requests: Vec<RequestState>,
    /// The request of each run.
    runs: Vec<usize>,
    /// Committed requests.
    version: u64,
}

/// An id as a token: `#n`, or `?` for an id the test never handed out.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Tok(Option<usize>);

impl fmt::Debug for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(n) => write!(f, "#{n}"),
            None => f.write_str("?"),
        }
    }
}

fn tok(n: usize) -> Tok {
    Tok(Some(n))
}

/// What a caller got, in tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Obs {
    Committed {
        run: Tok,
        version: u64,
    },
    Replayed {
        run: Tok,
        version: u64,
    },
    /// The run blocked and its future was dropped.
    Crashed,
    Stopped {
        kind: StopKind,
        run: Tok,
        revision: u64,
    },
    /// `abandon` released the admission at this revision.
    Released {
        revision: u64,
    },
    Busy {
        holder: Tok,
        revision: u64,
    },
    Conflict {
        expected: u64,
        actual: u64,
    },
    Ambiguous {
        run: Tok,
        turn: u32,
    },
    NotActive {
        request: Tok,
    },
    Mismatch {
        request: Tok,
    },
    Abandoned {
        request: Tok,
    },
    NotFound,
    Other(String),
}

impl Obs {
    /// The variant, with the kind of a stop.
    fn kind(&self) -> &'static str {
        match self {
            Obs::Committed { .. } => "Committed",
            Obs::Replayed { .. } => "Replayed",
            Obs::Crashed => "Crashed",
            Obs::Stopped {
                kind: StopKind::Model,
                ..
            } => "Stopped(Model)",
            Obs::Stopped {
                kind: StopKind::Budget,
                ..
            } => "Stopped(Budget)",
            Obs::Stopped {
                kind: StopKind::Cancelled,
                ..
            } => "Stopped(Cancelled)",
            Obs::Released { .. } => "Released",
            Obs::Busy { .. } => "Busy",
            Obs::Conflict { .. } => "Conflict",
            Obs::Ambiguous { .. } => "Ambiguous",
            Obs::NotActive { .. } => "NotActive",
            Obs::Mismatch { .. } => "Mismatch",
            Obs::Abandoned { .. } => "Abandoned",
            Obs::NotFound => "NotFound",
            Obs::Other(_) => "Other",
        }
    }
}

/// Every answer but `Other` (which the model never predicts).
const OBS_KINDS: [&str; 14] = [
    "Committed",
    "Replayed",
    "Crashed",
    "Stopped(Model)",
    "Stopped(Budget)",
    "Stopped(Cancelled)",
    "Released",
    "Busy",
    "Conflict",
    "Ambiguous",
    "NotActive",
    "Mismatch",
    "Abandoned",
    "NotFound",
];

/// An operation with its choices made against the model's state.
#[derive(Clone, Debug)]
enum Step {
    Run {
        request: usize,
        input: String,
        behavior: Behavior,
    },
    Resume {
        run: Option<usize>,
        expected: u64,
        policy: Policy,
        behavior: Behavior,
    },
    Recover {
        request: Option<usize>,
        input: String,
        expected: u64,
        policy: Policy,
        behavior: Behavior,
        callers: usize,
    },
    Abandon {
        request: Option<usize>,
        expected: u64,
    },
    ConcurrentRuns {
        requests: Vec<usize>,
    },
    RunElsewhere {
        request: usize,
    },
    Nothing,
}

fn input_text(request: usize, input: Input) -> String {
    match input {
        Input::Same => format!("input {request}"),
        Input::Other => format!("other input {request}"),
    }
}

impl Reference {
    fn new_request(&mut self) -> usize {
        self.requests.push(RequestState {
            status: Status::Unused,
            bound: None,
        });
        self.requests.len() - 1
    }

    fn expected(&self, rev: Rev) -> u64 {
        match rev {
            Rev::Current => self.revision,
            Rev::Stale if self.revision > 0 => self.revision - 1,
            Rev::Stale | Rev::Ahead => self.revision + 1,
        }
    }

    /// The latest request that was ever admitted.
    fn latest_admitted(&self) -> Option<usize> {
        self.requests
            .iter()
            .rposition(|r| r.status != Status::Unused)
    }

    /// A request named by `who` among the existing ones; `None` is an id
    /// the store never saw.
    fn existing(&self, who: Who) -> Option<usize> {
        match who {
            Who::New => None,
            Who::Holder => self
                .holder
                .map(|h| h.request)
                .or_else(|| self.latest_admitted()),
            Who::Known(_) if self.requests.is_empty() => None,
            Who::Known(i) => Some(usize::from(i) % self.requests.len()),
        }
    }

    fn resolve(&mut self, op: &Op) -> Step {
        match *op {
            Op::Run {
                who,
                input,
                behavior,
            } => {
                let request = match self.existing(who) {
                    Some(r) => r,
                    None => self.new_request(),
                };
                Step::Run {
                    request,
                    input: input_text(request, input),
                    behavior,
                }
            }
            Op::Resume {
                run,
                rev,
                policy,
                behavior,
            } => {
                let run = match run {
                    WhichRun::Holder => self
                        .holder
                        .map(|h| h.run)
                        .or(self.runs.len().checked_sub(1)),
                    WhichRun::Known(_) if self.runs.is_empty() => None,
                    WhichRun::Known(i) => Some(usize::from(i) % self.runs.len()),
                    WhichRun::Unknown => None,
                };
                Step::Resume {
                    run,
                    expected: self.expected(rev),
                    policy,
                    behavior,
                }
            }
            Op::Recover {
                who,
                input,
                rev,
                policy,
                behavior,
            } => {
                let request = self.existing(who);
                Step::Recover {
                    request,
                    input: input_text(request.unwrap_or(usize::MAX), input),
                    expected: self.expected(rev),
                    policy,
                    behavior,
                    callers: 1,
                }
            }
            Op::Abandon { who, rev } => Step::Abandon {
                request: self.existing(who),
                expected: self.expected(rev),
            },
            Op::ConcurrentRuns { callers } => Step::ConcurrentRuns {
                requests: (0..callers).map(|_| self.new_request()).collect(),
            },
            Op::ConcurrentRecover {
                rev,
                policy,
                callers,
            } => {
                let request = self.existing(Who::Holder);
                let input = request
                    .and_then(|r| self.requests[r].bound.clone())
                    .unwrap_or_else(|| input_text(usize::MAX, Input::Same));
                Step::Recover {
                    request,
                    input,
                    expected: self.expected(rev),
                    policy,
                    behavior: Behavior::CrashInModel,
                    callers: usize::from(callers),
                }
            }
            Op::RunElsewhere { who } => {
                let admitted: Vec<usize> = (0..self.requests.len())
                    .filter(|&r| self.requests[r].status != Status::Unused)
                    .collect();
                match admitted.len() {
                    0 => Step::Nothing,
                    n => Step::RunElsewhere {
                        request: admitted[usize::from(who) % n],
                    },
                }
            }
        }
    }

    /// A run of `request` that just won the admission at `self.revision`,
    /// continuing from `from`.
    fn drive(&mut self, request: usize, from: Progress, behavior: Behavior) -> Obs {
        self.runs.push(request);
        let run = self.runs.len() - 1;
        let (end, progress) = simulate(from, behavior);
        match end {
            End::Committed => {
                self.revision += 1;
                self.version += 1;
                self.holder = None;
                self.requests[request].status = Status::Completed {
                    run,
                    version: self.version,
                };
                Obs::Committed {
                    run: tok(run),
                    version: self.version,
                }
            }
            End::Crashed | End::Stopped(_) => {
                self.holder = Some(Holder {
                    request,
                    run,
                    progress,
                });
                match end {
                    End::Stopped(kind) => Obs::Stopped {
                        kind,
                        run: tok(run),
                        revision: self.revision,
                    },
                    _ => Obs::Crashed,
                }
            }
        }
    }

    /// A known request with `input`, before any admission check: the
    /// binding, then replay or refusal by status. `None`: it is active.
    fn known(&self, request: usize, input: &str) -> Option<Obs> {
        let state = &self.requests[request];
        if state.bound.as_deref() != Some(input) {
            return Some(Obs::Mismatch {
                request: tok(request),
            });
        }
        match state.status {
            Status::Completed { run, version } => Some(Obs::Replayed {
                run: tok(run),
                version,
            }),
            Status::Abandoned => Some(Obs::Abandoned {
                request: tok(request),
            }),
            Status::Active => None,
            Status::Unused => unreachable!("an unused request has no binding"),
        }
    }

    /// Applies a step (other than the concurrent ones) and says what its
    /// caller gets.
    fn apply(&mut self, step: &Step) -> Obs {
        match step {
            Step::Run {
                request,
                input,
                behavior,
            } => {
                let request = *request;
                if self.requests[request].status != Status::Unused {
                    return match self.known(request, input) {
                        Some(obs) => obs,
                        None => Obs::Busy {
                            holder: tok(request),
                            revision: self.revision,
                        },
                    };
                }
                if let Some(h) = self.holder {
                    return Obs::Busy {
                        holder: tok(h.request),
                        revision: self.revision,
                    };
                }
                self.revision += 1;
                self.requests[request] = RequestState {
                    status: Status::Active,
                    bound: Some(input.clone()),
                };
                // The claim saves turn 1's write-ahead with it.
                self.drive(request, Progress::Start, *behavior)
            }
            Step::Resume {
                run,
                expected,
                policy,
                behavior,
            } => {
                let Some(run) = *run else {
                    return Obs::NotFound;
                };
                let request = self.runs[run];
                match self.requests[request].status.clone() {
                    Status::Completed { run, version } => {
                        return Obs::Replayed {
                            run: tok(run),
                            version,
                        }
                    }
                    Status::Abandoned => {
                        return Obs::Abandoned {
                            request: tok(request),
                        }
                    }
                    _ => {}
                }
                self.take_over(request, Some(run), *expected, *policy, *behavior)
            }
            Step::Recover {
                request,
                input,
                expected,
                policy,
                behavior,
                ..
            } => {
                let Some(request) = *request else {
                    return Obs::NotFound;
                };
                if self.requests[request].status == Status::Unused {
                    return Obs::NotFound;
                }
                if let Some(obs) = self.known(request, input) {
                    return obs;
                }
                self.take_over(request, None, *expected, *policy, *behavior)
            }
            Step::Abandon { request, expected } => {
                let Some(request) = *request else {
                    return Obs::NotFound;
                };
                if self.requests[request].status == Status::Unused {
                    return Obs::NotFound;
                }
                match self.holder {
                    Some(h) if h.request == request && self.revision == *expected => {
                        self.revision += 1;
                        self.holder = None;
                        self.requests[request].status = Status::Abandoned;
                        Obs::Released {
                            revision: self.revision,
                        }
                    }
                    None => Obs::NotActive {
                        request: tok(request),
                    },
                    Some(h) if h.request != request || self.revision == *expected => Obs::Busy {
                        holder: tok(h.request),
                        revision: self.revision,
                    },
                    Some(_) => Obs::Conflict {
                        expected: *expected,
                        actual: self.revision,
                    },
                }
            }
            Step::RunElsewhere { request } => Obs::Mismatch {
                request: tok(*request),
            },
            Step::ConcurrentRuns { .. } | Step::Nothing => {
                unreachable!("not a single call")
            }
        }
    }

    /// Recovery of the active `request`: the checks before the
    /// compare-and-swap, the swap, then the new run.
    fn take_over(
        &mut self,
        request: usize,
        from_run: Option<usize>,
        expected: u64,
        policy: Policy,
        behavior: Behavior,
    ) -> Obs {
        let holder = self.holder.expect("an active request holds the admission");
        assert_eq!(holder.request, request, "the active request is the holder");
        if expected != self.revision {
            return Obs::Conflict {
                expected,
                actual: self.revision,
            };
        }
        if from_run.is_some_and(|run| run != holder.run) {
            return Obs::Busy {
                holder: tok(request),
                revision: self.revision,
            };
        }
        // Stopped between turns with its turn budget spent, the request is
        // refused before anything is written: the run would stop at once.
        if behavior == Behavior::OneTurnBudget && holder.progress == Progress::Ready {
            return Obs::Stopped {
                kind: StopKind::Budget,
                run: tok(holder.run),
                revision: self.revision,
            };
        }
        if policy == Policy::RejectAmbiguous {
            if let Some(turn) = holder.progress.ambiguous_turn() {
                return Obs::Ambiguous {
                    run: tok(holder.run),
                    turn,
                };
            }
        }
        self.revision += 1;
        self.drive(request, holder.progress, behavior)
    }
}

// ---------------------------------------------------------------------------
// The real side

/// Switches the test flips before each step, read by the model and the tool.
#[derive(Default)]
struct Switches {
    block_model: AtomicBool,
    fail_model: AtomicBool,
    block_tool: AtomicBool,
    /// Calls that blocked (and never return).
    blocked: AtomicUsize,
    /// Executions of the tool, ever.
    tool_runs: AtomicUsize,
    entered: Notify,
}

impl Switches {
    async fn block(&self) {
        self.blocked.fetch_add(1, Ordering::SeqCst);
        self.entered.notify_one();
        std::future::pending::<()>().await;
    }

    fn reset(&self) {
        self.block_model.store(false, Ordering::SeqCst);
        self.fail_model.store(false, Ordering::SeqCst);
        self.block_tool.store(false, Ordering::SeqCst);
        self.blocked.store(0, Ordering::SeqCst);
    }
}

/// Turn 1 (no assistant message yet in the request) asks for the `work`
/// tool; turn 2 answers `done`.
struct SwitchedModel(Arc<Switches>);

#[turnstile::async_trait]
impl Model for SwitchedModel {
    fn name(&self) -> &str {
        "switched"
    }

    async fn respond(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        if self.0.fail_model.swap(false, Ordering::SeqCst) {
            return Err(ModelError::fatal("injected model failure"));
        }
        if self.0.block_model.load(Ordering::SeqCst) {
            self.0.block().await;
        }
        let answered = request
            .messages
            .iter()
            .rev()
            .take_while(|m| !matches!(m, Message::User { .. }))
            .any(|m| matches!(m, Message::Assistant { .. }));
        let usage = Usage {
            input_tokens: 1,
            output_tokens: 1,
            ..Usage::default()
        };
        Ok(if answered {
            ModelResponse {
                content: "done".into(),
                tool_calls: Vec::new(),
                provider_metadata: None,
                usage,
            }
        } else {
            ModelResponse {
                content: "working".into(),
                tool_calls: vec![ToolCall::new("w1", "work", json!({}))],
                provider_metadata: None,
                usage,
            }
        })
    }
}

struct WorkTool(Arc<Switches>);

#[turnstile::async_trait]
impl Tool for WorkTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "work".into(),
            description: "does the work".into(),
            parameters: json!({ "type": "object" }),
        }
    }

    async fn call(
        &self,
        _arguments: Value,
        _context: ToolContext,
    ) -> Result<turnstile::Content, ToolError> {
        self.0.tool_runs.fetch_add(1, Ordering::SeqCst);
        if self.0.block_tool.load(Ordering::SeqCst) {
            self.0.block().await;
        }
        Ok("worked".into())
    }
}

fn ns() -> Namespace {
    Namespace::new("model").expect("valid namespace")
}

/// What one real call returned.
enum Real {
    Run(Result<Outcome, Error>),
    Abandon(Result<Revision, Error>),
    Crashed,
}

struct Harness {
    store: Arc<dyn Store>,
    switches: Arc<Switches>,
    session: Arc<AgentSession>,
    elsewhere: Arc<AgentSession>,
    conversation: ConversationId,
    other_conversation: ConversationId,
    /// Real ids of the model's request and run tokens.
    request_ids: Vec<RequestId>,
    run_ids: Vec<Option<RunId>>,
}

impl Harness {
    async fn new(store: Arc<dyn Store>) -> Result<Harness, String> {
        let switches = Arc::new(Switches::default());
        let agent = Agent::new(Arc::new(SwitchedModel(switches.clone())))
            .with_tool(Arc::new(WorkTool(switches.clone())));
        let conversation = ConversationId::new();
        let other_conversation = ConversationId::new();
        store
            .ensure_conversation(&ns(), conversation)
            .await
            .map_err(|e| format!("create conversation: {e}"))?;
        let session = |c| {
            Arc::new(AgentSession::new(
                agent.clone(),
                store.clone(),
                c,
                ns(),
                ContextPolicy::default(),
            ))
        };
        Ok(Harness {
            session: session(conversation),
            elsewhere: session(other_conversation),
            store,
            switches,
            conversation,
            other_conversation,
            request_ids: Vec::new(),
            run_ids: Vec::new(),
        })
    }

    fn request_id(&self, request: Option<usize>) -> RequestId {
        request.map_or_else(RequestId::new, |r| self.request_ids[r])
    }

    /// Sets the switches and the context for `behavior`. Every run sets
    /// each limit the behaviours use, so that the one a request stored (and
    /// a continuing run would keep) never decides: the model judges each
    /// step by its own behaviour.
    fn arm(&self, behavior: Behavior) -> RunContext {
        self.switches.reset();
        let mut ctx = RunContext::default().with_budget(Budget {
            max_turns: Some(u32::MAX),
            max_tool_calls: Some(u64::MAX),
            ..Budget::default()
        });
        match behavior {
            Behavior::Complete => {}
            Behavior::CrashInModel => self.switches.block_model.store(true, Ordering::SeqCst),
            Behavior::CrashInTool => self.switches.block_tool.store(true, Ordering::SeqCst),
            Behavior::ModelFails => self.switches.fail_model.store(true, Ordering::SeqCst),
            Behavior::OneTurnBudget => {
                ctx.budget.max_turns = Some(1);
            }
            Behavior::NoToolBudget => {
                ctx.budget.max_tool_calls = Some(0);
            }
            Behavior::Cancelled => {
                let cancel = CancellationToken::new();
                cancel.cancel();
                ctx = ctx.with_cancel(cancel);
            }
        }
        ctx
    }

    /// Runs a call; if it blocks in the model or a tool, drops it there.
    async fn crashable(
        &self,
        call: impl Future<Output = Result<Outcome, Error>>,
    ) -> Result<Real, String> {
        let mut call = pin!(call);
        let raced = tokio::time::timeout(STEP_DEADLINE, async {
            tokio::select! {
                biased;
                result = &mut call => Real::Run(result),
                () = self.blocked() => Real::Crashed,
            }
        })
        .await;
        raced.map_err(|_| "a call neither returned nor blocked".to_owned())
    }

    /// Returns once a model or tool call of this step blocks. (A wake-up
    /// left over from an earlier step is not taken for one.)
    async fn blocked(&self) {
        while self.switches.blocked.load(Ordering::SeqCst) == 0 {
            self.block_or_a_while().await;
        }
    }

    /// Starts `calls` at once; those that block in the model or a tool are
    /// dropped (aborted) once every other call has returned.
    async fn concurrently<F>(&self, calls: Vec<F>) -> Result<Vec<Real>, String>
    where
        F: Future<Output = Result<Outcome, Error>> + Send + 'static,
    {
        let (done, mut returned) = tokio::sync::mpsc::unbounded_channel();
        let tasks: Vec<_> = calls
            .into_iter()
            .enumerate()
            .map(|(i, call)| {
                let done = done.clone();
                tokio::spawn(async move {
                    let _ = done.send((i, call.await));
                })
            })
            .collect();
        let mut results: Vec<Option<Real>> = tasks.iter().map(|_| None).collect();
        let mut answered = 0;
        let deadline = tokio::time::Instant::now() + STEP_DEADLINE;
        while answered + self.switches.blocked.load(Ordering::SeqCst) < tasks.len() {
            let woken = tokio::time::timeout_at(deadline, async {
                tokio::select! {
                    Some((i, result)) = returned.recv() => Some((i, result)),
                    () = self.block_or_a_while() => None,
                }
            });
            match woken.await {
                Ok(Some((i, result))) => {
                    results[i] = Some(Real::Run(result));
                    answered += 1;
                }
                Ok(None) => {}
                Err(_) => return Err("concurrent calls neither returned nor blocked".into()),
            }
        }
        let mut reals = Vec::new();
        for (task, result) in tasks.into_iter().zip(results) {
            reals.push(match result {
                Some(real) => real,
                None => {
                    task.abort();
                    let _ = task.await;
                    Real::Crashed
                }
            });
        }
        Ok(reals)
    }

    /// Returns when a call blocks, or after a few milliseconds (a wake-up
    /// may be spent already).
    async fn block_or_a_while(&self) {
        let wake = self.switches.entered.notified();
        let _ = tokio::time::timeout(Duration::from_millis(5), wake).await;
    }

    async fn execute(&self, step: &Step) -> Result<Vec<Real>, String> {
        Ok(match step {
            Step::Run {
                request,
                input,
                behavior,
            } => {
                let ctx = self.arm(*behavior);
                let id = self.request_ids[*request];
                vec![self.crashable(self.session.run(id, input, ctx)).await?]
            }
            Step::Resume {
                run,
                expected,
                policy,
                behavior,
            } => {
                let ctx = self.arm(*behavior);
                let run_id = run.and_then(|r| self.run_ids[r]).unwrap_or_else(RunId::new);
                vec![
                    self.crashable(self.session.resume_run(
                        run_id,
                        ctx,
                        Revision(*expected),
                        policy.real(),
                    ))
                    .await?,
                ]
            }
            Step::Recover {
                request,
                input,
                expected,
                policy,
                behavior,
                callers: 1,
            } => {
                let ctx = self.arm(*behavior);
                let id = self.request_id(*request);
                vec![
                    self.crashable(self.session.recover_after_owner_exit(
                        id,
                        input,
                        ctx,
                        Revision(*expected),
                        policy.real(),
                    ))
                    .await?,
                ]
            }
            Step::Recover {
                request,
                input,
                expected,
                policy,
                behavior,
                callers,
            } => {
                let id = self.request_id(*request);
                let armed = self.arm(*behavior);
                let calls = (0..*callers)
                    .map(|_| {
                        let ctx = armed.clone();
                        let (session, input) = (self.session.clone(), input.clone());
                        let (expected, policy) = (Revision(*expected), policy.real());
                        async move {
                            session
                                .recover_after_owner_exit(id, &input, ctx, expected, policy)
                                .await
                        }
                    })
                    .collect::<Vec<_>>();
                self.concurrently(calls).await?
            }
            Step::Abandon { request, expected } => {
                let id = self.request_id(*request);
                vec![Real::Abandon(
                    self.session.abandon(id, Revision(*expected)).await,
                )]
            }
            Step::ConcurrentRuns { requests } => {
                self.arm(Behavior::CrashInModel);
                let calls = requests
                    .iter()
                    .map(|&r| {
                        let (session, id) = (self.session.clone(), self.request_ids[r]);
                        let input = input_text(r, Input::Same);
                        async move { session.run(id, &input, RunContext::default()).await }
                    })
                    .collect::<Vec<_>>();
                self.concurrently(calls).await?
            }
            Step::RunElsewhere { request } => {
                let id = self.request_ids[*request];
                let input = input_text(*request, Input::Same);
                vec![Real::Run(
                    self.elsewhere.run(id, &input, RunContext::default()).await,
                )]
            }
            Step::Nothing => Vec::new(),
        })
    }

    fn run_tok(&self, id: RunId) -> Tok {
        Tok(self.run_ids.iter().position(|r| *r == Some(id)))
    }

    fn request_tok(&self, id: RequestId) -> Tok {
        Tok(self.request_ids.iter().position(|r| *r == id))
    }

    /// A run id the test has not seen yet, if `real` carries one.
    fn new_run_in(&self, real: &Real) -> Option<RunId> {
        let id = match real {
            Real::Run(Ok(outcome)) => Some(outcome.run_id),
            Real::Run(Err(e)) => e.stopped_run().map(|(run, _)| run),
            _ => None,
        }?;
        (self.run_tok(id).0.is_none()).then_some(id)
    }

    fn observe(&self, real: &Real) -> Obs {
        match real {
            Real::Crashed => Obs::Crashed,
            Real::Abandon(Ok(revision)) => Obs::Released {
                revision: revision.0,
            },
            Real::Abandon(Err(e)) | Real::Run(Err(e)) => self.observe_error(e),
            Real::Run(Ok(outcome)) => {
                let shape = (
                    outcome.turns,
                    outcome.tool_calls,
                    outcome.final_text.as_str(),
                    outcome.messages.len(),
                );
                if shape != (2, 1, "done", 4) {
                    return Obs::Other(format!("an outcome of another shape: {outcome:?}"));
                }
                let (run, version) = (self.run_tok(outcome.run_id), outcome.conversation_version);
                if outcome.replayed {
                    Obs::Replayed { run, version }
                } else {
                    Obs::Committed { run, version }
                }
            }
        }
    }

    fn observe_error(&self, e: &Error) -> Obs {
        let stopped = |kind, run_id: &RunId, revision: &Revision| Obs::Stopped {
            kind,
            run: self.run_tok(*run_id),
            revision: revision.0,
        };
        match e {
            Error::Busy {
                conversation_id,
                request_id,
                revision,
            } if *conversation_id == self.conversation => Obs::Busy {
                holder: self.request_tok(*request_id),
                revision: revision.0,
            },
            Error::Conflict {
                conversation_id,
                expected,
                actual,
            } if *conversation_id == self.conversation => Obs::Conflict {
                expected: expected.0,
                actual: actual.0,
            },
            Error::AmbiguousCheckpoint { run_id, turn } => Obs::Ambiguous {
                run: self.run_tok(*run_id),
                turn: *turn,
            },
            Error::NotActive { request_id } => Obs::NotActive {
                request: self.request_tok(*request_id),
            },
            Error::RequestMismatch { request_id, .. } => Obs::Mismatch {
                request: self.request_tok(*request_id),
            },
            Error::RequestAbandoned { request_id } => Obs::Abandoned {
                request: self.request_tok(*request_id),
            },
            Error::NotFound { .. } => Obs::NotFound,
            Error::Model {
                run_id, revision, ..
            } => stopped(StopKind::Model, run_id, revision),
            Error::BudgetExceeded {
                run_id, revision, ..
            } => stopped(StopKind::Budget, run_id, revision),
            Error::Cancelled { run_id, revision } => stopped(StopKind::Cancelled, run_id, revision),
            e => Obs::Other(format!("{e:?}")),
        }
    }

    /// The admission, the holder's latest checkpoint and the conversation
    /// version, as the model sees them.
    async fn state(&self) -> Result<Snapshot, String> {
        let admission = self
            .store
            .admission(self.conversation)
            .await
            .map_err(|e| format!("read admission: {e}"))?;
        let holder = match admission.active {
            None => None,
            Some(active) => {
                let latest = self
                    .store
                    .latest_checkpoint(active.run_id)
                    .await
                    .map_err(|e| format!("read checkpoint: {e}"))?;
                Some(HeldBy {
                    request: self.request_tok(active.request_id),
                    run: self.run_tok(active.run_id),
                    checkpoint: latest.map(|c| (c.phase, c.turn)),
                })
            }
        };
        let version = self
            .store
            .conversation(&ns(), self.conversation)
            .await
            .map_err(|e| format!("read conversation: {e}"))?
            .version;
        Ok(Snapshot {
            revision: admission.revision.0,
            holder,
            version,
        })
    }

    async fn status(&self, request: usize) -> Result<Option<RequestStatus>, String> {
        Ok(self
            .store
            .request(self.request_ids[request])
            .await
            .map_err(|e| format!("read request: {e}"))?
            .map(|r| r.status))
    }
}

impl Policy {
    fn real(self) -> ResumePolicy {
        match self {
            Policy::RejectAmbiguous => ResumePolicy::RejectAmbiguous,
            Policy::RetryInterruptedTurn => ResumePolicy::RetryInterruptedTurn,
        }
    }
}

/// What the state checks compare after every step.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    revision: u64,
    holder: Option<HeldBy>,
    /// The conversation version: committed requests.
    version: u64,
}

#[derive(Debug, PartialEq, Eq)]
struct HeldBy {
    request: Tok,
    run: Tok,
    /// The holder run's latest checkpoint: phase and turn.
    checkpoint: Option<(CheckpointPhase, u32)>,
}

fn model_state(model: &Reference) -> Snapshot {
    Snapshot {
        revision: model.revision,
        holder: model.holder.map(|h| HeldBy {
            request: tok(h.request),
            run: tok(h.run),
            checkpoint: h.progress.row(),
        }),
        version: model.version,
    }
}

fn real_status(status: &Status) -> Option<RequestStatus> {
    match status {
        Status::Unused => None,
        Status::Active => Some(RequestStatus::Active),
        Status::Completed { .. } => Some(RequestStatus::Completed),
        Status::Abandoned => Some(RequestStatus::Abandoned),
    }
}

/// Runs `ops` against a fresh conversation and the model, comparing after
/// every step.
async fn check(
    store: Arc<dyn Store>,
    ops: &[Op],
    seen: &std::sync::Mutex<BTreeMap<&'static str, usize>>,
) -> Result<(), String> {
    let mut harness = Harness::new(store).await?;
    let mut model = Reference::default();
    for (index, op) in ops.iter().enumerate() {
        let step = model.resolve(op);
        while harness.request_ids.len() < model.requests.len() {
            harness.request_ids.push(RequestId::new());
        }
        let before = model.clone();
        let reals = harness.execute(&step).await?;
        let fail = |what: String| {
            format!("step {index} ({op:?} as {step:?}): {what}\nmodel before: {before:?}")
        };

        // What the callers should have got.
        let expected: Vec<Obs> = match &step {
            Step::ConcurrentRuns { requests } => {
                let winner = reals.iter().position(|r| matches!(r, Real::Crashed));
                match (model.holder, winner) {
                    (None, Some(w)) => {
                        let obs = model.apply(&Step::Run {
                            request: requests[w],
                            input: input_text(requests[w], Input::Same),
                            behavior: Behavior::CrashInModel,
                        });
                        let busy = Obs::Busy {
                            holder: tok(requests[w]),
                            revision: model.revision,
                        };
                        (0..requests.len())
                            .map(|i| if i == w { obs.clone() } else { busy.clone() })
                            .collect()
                    }
                    // Held: all refused. Idle with no winner: wrong anyway
                    // (one of them had to be admitted and block).
                    (holder, _) => {
                        let busy = Obs::Busy {
                            holder: Tok(holder.map(|h| h.request)),
                            revision: model.revision,
                        };
                        vec![busy; requests.len()]
                    }
                }
            }
            Step::Recover { callers, .. } if *callers > 1 => {
                let mut alone = model.clone();
                let obs = alone.apply(&step);
                if obs == Obs::Crashed {
                    // Exactly one wins the swap; the rest see its revision.
                    let winner = reals
                        .iter()
                        .position(|r| matches!(r, Real::Crashed))
                        .unwrap_or(0);
                    let expected_revision = model.revision;
                    model = alone;
                    (0..*callers)
                        .map(|i| {
                            if i == winner {
                                Obs::Crashed
                            } else {
                                Obs::Conflict {
                                    expected: expected_revision,
                                    actual: expected_revision + 1,
                                }
                            }
                        })
                        .collect()
                } else {
                    model = alone;
                    vec![obs; *callers]
                }
            }
            Step::Nothing => Vec::new(),
            step => vec![model.apply(step)],
        };

        // A run the model created gets the real id the call reports, or the
        // one now holding the admission.
        if model.runs.len() > harness.run_ids.len() {
            let mut id = reals.iter().find_map(|r| harness.new_run_in(r));
            if id.is_none() {
                let admission = harness
                    .store
                    .admission(harness.conversation)
                    .await
                    .map_err(|e| fail(format!("read admission: {e}")))?;
                id = admission
                    .active
                    .map(|a| a.run_id)
                    .filter(|&run| harness.run_tok(run).0.is_none());
            }
            harness.run_ids.push(id);
        }
        if model.runs.len() != harness.run_ids.len() {
            return Err(fail("more than one new run in one step".into()));
        }

        let observed: Vec<Obs> = reals.iter().map(|r| harness.observe(r)).collect();
        if observed != expected {
            return Err(fail(format!(
                "callers got\n  {observed:?}\nthe model says\n  {expected:?}"
            )));
        }
        {
            let mut seen = seen.lock().map_err(|_| "tally poisoned".to_owned())?;
            for obs in &observed {
                *seen.entry(obs.kind()).or_default() += 1;
            }
        }
        let real_state = harness.state().await.map_err(&fail)?;
        let wanted = model_state(&model);
        if real_state != wanted {
            return Err(fail(format!(
                "the store is at\n  {real_state:?}\nthe model says\n  {wanted:?}"
            )));
        }
        for request in step_requests(&step) {
            let status = harness.status(request).await.map_err(&fail)?;
            let wanted = real_status(&model.requests[request].status);
            if status != wanted {
                return Err(fail(format!(
                    "request #{request} is {status:?}, the model says {wanted:?}"
                )));
            }
        }
    }
    // Every request, and nothing written to the other conversation: a
    // request reused there was refused before any write.
    for request in 0..model.requests.len() {
        let status = harness.status(request).await?;
        let wanted = real_status(&model.requests[request].status);
        if status != wanted {
            return Err(format!(
                "at the end, request #{request} is {status:?}, the model says {wanted:?}"
            ));
        }
    }
    match harness
        .store
        .conversation(&ns(), harness.other_conversation)
        .await
    {
        Err(Error::NotFound { .. }) => Ok(()),
        other => Err(format!(
            "a refused request in another conversation wrote it: {other:?}"
        )),
    }
}

/// The requests a step names.
fn step_requests(step: &Step) -> Vec<usize> {
    match step {
        Step::Run { request, .. } | Step::RunElsewhere { request } => vec![*request],
        Step::Recover { request, .. } | Step::Abandon { request, .. } => {
            request.iter().copied().collect()
        }
        Step::ConcurrentRuns { requests } => requests.clone(),
        Step::Resume { .. } | Step::Nothing => Vec::new(),
    }
}

/// A context that lifts the request's stored tool-call limit.
fn any_tool_calls() -> RunContext {
    RunContext::default().with_budget(Budget {
        max_tool_calls: Some(u64::MAX),
        ..Budget::default()
    })
}

/// Regression (found by this model): a run resumed from a
/// `ToolsPending` checkpoint starts its tool without moving the checkpoint
/// back to `ToolsInFlight`. If it dies while the tool runs, the checkpoint
/// still says no tool started, so a recovery under the default
/// `RejectAmbiguous` policy is not refused and runs the tool again — the
/// silent repeat of an external effect the policy promises to prevent.
#[test]
fn a_resumed_tool_round_that_dies_mid_tool_is_refused_as_ambiguous() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::in_memory().await.expect("store"));
        let harness = Harness::new(store.clone()).await.expect("harness");
        let (session, request) = (harness.session.clone(), RequestId::new());

        // 1. The run stops before its tool runs (no tool-call budget): its
        //    turn is settled to `ToolsPending`; nothing is ambiguous.
        let no_tools = RunContext::default().with_budget(Budget {
            max_tool_calls: Some(0),
            ..Budget::default()
        });
        let stopped = session.run(request, "go", no_tools).await;
        let (run, revision) = match &stopped {
            Err(e @ Error::BudgetExceeded { .. }) => e.stopped_run().expect("stopped run"),
            other => panic!("expected a tool-call budget stop, got {other:?}"),
        };
        let settled = store.latest_checkpoint(run).await.unwrap().unwrap();
        assert_eq!(settled.phase, CheckpointPhase::ToolsPending);

        // 2. Resumed, the tool starts (its effect may happen) and the
        //    process dies inside it.
        harness.arm(Behavior::CrashInTool);
        let resumed = harness
            .crashable(session.resume_run(
                run,
                any_tool_calls(),
                revision,
                ResumePolicy::RejectAmbiguous,
            ))
            .await
            .expect("resume returned or blocked");
        assert!(matches!(resumed, Real::Crashed), "the tool did not block");
        harness.switches.reset();
        let admission = store.admission(harness.conversation).await.unwrap();
        let holder = admission.active.expect("still held");
        let latest = store
            .latest_checkpoint(holder.run_id)
            .await
            .unwrap()
            .unwrap();

        // 3. The default policy must refuse: the tool may have run.
        let recovered = session
            .recover_after_owner_exit(
                request,
                "go",
                any_tool_calls(),
                admission.revision,
                ResumePolicy::RejectAmbiguous,
            )
            .await;
        let tool_runs = harness.switches.tool_runs.load(Ordering::SeqCst);
        assert!(
            matches!(recovered, Err(Error::AmbiguousCheckpoint { .. })),
            "the dead run's checkpoint is {:?} at turn {}, and the default policy \
             recovered ({}), running the tool {tool_runs} times in all",
            latest.phase,
            latest.turn,
            match &recovered {
                Ok(outcome) => format!("committed {:?}", outcome.final_text),
                Err(e) => e.to_string(),
            }
        );
        assert_eq!(tool_runs, 1, "the tool ran again");
    });
}
