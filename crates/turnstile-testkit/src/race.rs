//! What the races of the facade's tests (SQLite) and the PostgreSQL
//! backend's share: two OS processes, many tokio tasks each, racing every kind
//! of ownership change on the same few conversations of one database —
//! fresh claims (through the `Store` trait and through
//! `AgentSession::stream`), recovery claims (`Store::claim_recovery` and
//! `AgentSession::recover_after_owner_exit`), abandons (both layers) and
//! commits of live owners, while the losers' owners keep writing.
//!
//! The second process is the test binary re-run to execute an ignored test
//! (named with [`worker_test!`](crate::worker_test)), told the database by
//! environment; it
//! races with [`race_in_worker`] and prints its results on stdout (`RACE …`
//! lines, [`report`]); the parent ([`race`]) merges them with its own.
//! What each test file adds: how the store is opened, how the worker is
//! told the database, what must never reach the worker's output, and the
//! rows read back from the database ([`Facts`]).
//!
//! What must hold ([`Outcome::assert_callers`],
//! [`Outcome::assert_conversations`]):
//! - every successful ownership change is reported with the revision it
//!   produced, and over both processes each revision of a conversation is
//!   won exactly once: the winners' revisions are exactly `1..=final`, the
//!   final revision read from the database;
//! - in revision order, the winners' changes follow the admission state
//!   machine (a fresh claim only from idle; recovery, commit and abandon only
//!   from held), and the final state matches the last winner;
//! - commits and abandons counted by the winners match the conversation
//!   version and the request rows in the database;
//! - every loser gets one of the typed errors its operation documents (Busy,
//!   Conflict, Fenced, NotActive, AmbiguousCheckpoint, RequestAbandoned, or a
//!   replay of a request completed in between); nothing else reaches a caller
//!   — in particular no store error (counted apart, by kind).
//!
//! [`a_recoverer_overtaken_before_reading_its_messages_is_fenced`] pins
//! down, with a store that pauses the loser, a bug in that last guarantee
//! whose window is too narrow for the race to hit reliably.
//!
//! The pausing store is the torture's [`Hooked`].

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::future::Future;
use std::io::{BufRead, BufReader, Read, Write};
use std::pin::pin;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::sync::{Barrier, Notify};
use turnstile::store::{ClaimOutcome, Fence, InputHash, NewRequest, RecoveryClaim};
use turnstile::{
    Agent, AgentSession, Budget, CheckpointPhase, ContextPolicy, ConversationId, Error, Event,
    LoopCheckpoint, Message, Namespace, RequestId, ResumePolicy, Revision, RunContext, RunId,
    ScriptedModel, ScriptedReply, Store, Tool, ToolCall, ToolContext, ToolError, ToolSpec, Usage,
};

use crate::process;
use crate::torture::hooked::{Call, Hook, Hooked};

pub type Failure = Box<dyn std::error::Error + Send + Sync>;
pub type TestResult = Result<(), Failure>;

/// Operations each task attempts.
const ROUNDS: usize = 60;
/// Conversations everyone races on.
const CONVERSATIONS: usize = 3;

const ENV_CONVERSATIONS: &str = "TURNSTILE_RACES_CONVERSATIONS";
/// How long the worker may take to start, or to finish its rounds.
const CHILD_DEADLINE: Duration = Duration::from_secs(240);

// ---------------------------------------------------------------------------
// The two processes
// ---------------------------------------------------------------------------

/// What both processes saw, once both are done.
pub struct Outcome {
    pub conversations: Vec<ConversationId>,
    pub parent: Tally,
    pub child: Tally,
    /// The worker's stdout.
    pub out: String,
}

/// The parent's side: creates the conversations on `store`, starts the
/// worker (the test named `worker`, told the database by `database`, an
/// environment variable and its value), starts `tasks` racing tasks here together with the worker's
/// `tasks`, and merges what both saw. The worker must finish, and none of
/// `forbidden` (lowercase) may reach its output.
pub async fn race(
    store: Arc<dyn Store>,
    worker: &str,
    tasks: usize,
    database: (&str, &OsStr),
    forbidden: &[&str],
) -> Result<Outcome, Failure> {
    let started = Instant::now();
    let conversations: Vec<ConversationId> =
        (0..CONVERSATIONS).map(|_| ConversationId::new()).collect();
    for &conversation in &conversations {
        store.ensure_conversation(&ns(), conversation).await?;
    }
    let listed = conversations
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");

    let mut worker = Worker::spawn(
        process::worker(worker)
            .env(database.0, database.1)
            .env(ENV_CONVERSATIONS, &listed),
    )?;
    worker.wait_for("RACE ready");

    // Both processes have their tasks ready: start them together.
    let racers = Racers::new(store, &conversations, 0, tasks);
    let start = Arc::new(Barrier::new(tasks + 1));
    let handles = racers.spawn(start.clone());
    worker.go()?;
    start.wait().await;
    let mut parent = Tally::default();
    for handle in handles {
        parent.merge(handle.await?);
    }
    let (out, err) = worker.finish();
    let child = Tally::parse(&out);
    assert!(
        out.contains("RACE done"),
        "the worker did not finish:\n{out}\n{err}"
    );
    for text in [&out, &err] {
        let lower = text.to_lowercase();
        for &wrong in forbidden {
            assert!(
                !lower.contains(wrong),
                "{wrong:?} reached the worker's output:\n{text}"
            );
        }
    }

    println!("races: both processes done in {:?}", started.elapsed());
    for (name, tally) in [("parent", &parent), ("worker", &child)] {
        println!("races: {name}: {}", tally.summary());
    }
    Ok(Outcome {
        conversations,
        parent,
        child,
        out,
    })
}

/// A conversation's rows, read back from the database once both processes
/// are done.
pub struct Facts {
    /// `admissions.revision`.
    pub revision: i64,
    /// `conversations.version`.
    pub version: i64,
    /// `requests` per status: (status, count).
    pub statuses: Vec<(String, i64)>,
}

impl Outcome {
    /// No store error and nothing outside the documented errors reached a
    /// caller, and the race really happened in both processes.
    pub fn assert_callers(&self) {
        for (name, tally) in [("parent", &self.parent), ("worker", &self.child)] {
            assert!(
                tally.store_errors.is_empty(),
                "{name}: store errors reached callers: {:?}",
                tally.store_errors
            );
        }
        for (name, tally) in [("parent", &self.parent), ("worker", &self.child)] {
            assert!(
                tally.unexpected.is_empty(),
                "{name}: callers got errors outside the documented ones:\n{:#?}",
                tally.unexpected
            );
            // The race really happened in both processes.
            assert!(!tally.wins.is_empty(), "{name} never won");
            assert!(tally.lost.values().sum::<usize>() > 0, "{name} never lost");
        }
    }

    /// Per conversation, the winners against the database (`facts` reads
    /// a conversation's rows) and `store`: each revision won exactly once,
    /// the state machine followed, the commits and abandons counted.
    pub async fn assert_conversations<F, Fut, E>(&self, store: &dyn Store, facts: F) -> TestResult
    where
        F: Fn(ConversationId) -> Fut,
        Fut: Future<Output = Result<Facts, E>>,
        E: Into<Failure>,
    {
        for (index, &conversation) in self.conversations.iter().enumerate() {
            let mut wins: Vec<(u64, Change)> = self
                .parent
                .wins
                .iter()
                .chain(&self.child.wins)
                .filter(|w| w.conversation == index)
                .map(|w| (w.revision, w.change))
                .collect();
            wins.sort_unstable_by_key(|w| w.0);

            let facts = facts(conversation).await.map_err(Into::into)?;
            let final_revision = u64::try_from(facts.revision)?;
            let revisions: Vec<u64> = wins.iter().map(|w| w.0).collect();
            let repeats: Vec<u64> = revisions
                .windows(2)
                .filter(|p| p[0] == p[1])
                .map(|p| p[0])
                .collect();
            assert!(
                repeats.is_empty(),
                "conversation {index}: revisions won more than once: {repeats:?}"
            );
            let missing: Vec<u64> = (1..=final_revision)
                .filter(|r| revisions.binary_search(r).is_err())
                .collect();
            let beyond: Vec<u64> = revisions
                .iter()
                .copied()
                .filter(|&r| r == 0 || r > final_revision)
                .collect();
            assert!(
                missing.is_empty() && beyond.is_empty(),
                "conversation {index}: the winners' revisions must be exactly \
                 1..={final_revision}: nobody won {missing:?}, and {beyond:?} are not \
                 revisions of the database"
            );

            // In revision order, the changes follow the state machine.
            let mut held = false;
            for &(revision, change) in &wins {
                assert_eq!(
                    change.needs_held(),
                    held,
                    "conversation {index}: {change:?} won revision {revision} while the \
                     admission was {}",
                    if held { "held" } else { "idle" }
                );
                held = change.leaves_held();
            }
            let admission = store.admission(conversation).await?;
            assert_eq!(admission.revision, Revision(final_revision));
            assert_eq!(
                admission.active.is_some(),
                held,
                "conversation {index}: the last winner says held={held}, the database disagrees"
            );

            let commits = wins.iter().filter(|w| w.1.is_commit()).count();
            let abandons = wins.iter().filter(|w| w.1.is_abandon()).count();
            assert_eq!(
                usize::try_from(facts.version)?,
                commits,
                "conversation {index}"
            );
            let count = |status: &str| {
                facts
                    .statuses
                    .iter()
                    .find(|s| s.0 == status)
                    .map_or(0, |s| usize::try_from(s.1).unwrap_or(usize::MAX))
            };
            assert_eq!(count("completed"), commits, "conversation {index}");
            assert_eq!(count("abandoned"), abandons, "conversation {index}");
            assert_eq!(count("active"), usize::from(held), "conversation {index}");
            println!(
                "races: conversation {index}: final revision {final_revision}, {commits} commits, \
                 {abandons} abandons, held at the end: {held}"
            );
        }
        Ok(())
    }
}

/// The worker's side: `tasks` racing tasks on `store`, on the conversations
/// the parent named, started when the parent says go; what they saw.
pub async fn race_in_worker(store: Arc<dyn Store>, tasks: usize) -> Result<Tally, Failure> {
    let conversations = std::env::var(ENV_CONVERSATIONS)?
        .split(',')
        .map(str::parse)
        .collect::<Result<Vec<ConversationId>, _>>()?;
    let racers = Racers::new(store, &conversations, 1, tasks);
    let start = Arc::new(Barrier::new(tasks + 1));
    let handles = racers.spawn(start.clone());
    println!("RACE ready");
    let go = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).map(|_| line)
    })
    .await??;
    assert_eq!(go.trim_end(), "go");
    start.wait().await;
    let mut tally = Tally::default();
    for handle in handles {
        tally.merge(handle.await?);
    }
    Ok(tally)
}

/// The worker's report to the parent: the tally, `extra` lines (`RACE …`
/// lines the parent reads itself), and `RACE done`.
pub fn report(tally: &Tally, extra: &[String]) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    tally.print(&mut out)?;
    for line in extra {
        writeln!(out, "{line}")?;
    }
    writeln!(out, "RACE done")
}

// ---------------------------------------------------------------------------
// The racers
// ---------------------------------------------------------------------------

pub fn ns() -> Namespace {
    Namespace::new("races").expect("valid namespace")
}

/// The input a request was admitted with, derivable from its id by anyone
/// who wants to recover it.
fn input_of(request_id: RequestId) -> String {
    format!("race input {request_id}")
}

/// An ownership change, as its winner reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    /// `Store::claim` admitted a new request.
    Claim,
    /// `Store::claim_recovery` moved the admission to a new run.
    Recover,
    /// `Store::abandon` released it.
    Abandon,
    /// `Store::commit` of a live owner released it.
    Commit,
    /// `AgentSession::stream` admitted a new request (`RunStarted`).
    RunClaim,
    /// … and committed it (`ConversationCommitted`).
    RunCommit,
    /// `recover_after_owner_exit` claimed the request …
    SessionRecover,
    /// … and committed it.
    SessionRecoverCommit,
    /// `AgentSession::abandon` released it.
    SessionAbandon,
}

const CHANGES: [Change; 9] = [
    Change::Claim,
    Change::Recover,
    Change::Abandon,
    Change::Commit,
    Change::RunClaim,
    Change::RunCommit,
    Change::SessionRecover,
    Change::SessionRecoverCommit,
    Change::SessionAbandon,
];

impl Change {
    fn name(self) -> String {
        format!("{self:?}")
    }

    fn parse(s: &str) -> Option<Change> {
        CHANGES.into_iter().find(|c| c.name() == s)
    }

    /// Only a fresh claim starts from an idle admission.
    fn needs_held(self) -> bool {
        !matches!(self, Change::Claim | Change::RunClaim)
    }

    fn leaves_held(self) -> bool {
        !(self.is_commit() || self.is_abandon())
    }

    fn is_commit(self) -> bool {
        matches!(
            self,
            Change::Commit | Change::RunCommit | Change::SessionRecoverCommit
        )
    }

    fn is_abandon(self) -> bool {
        matches!(self, Change::Abandon | Change::SessionAbandon)
    }
}

#[derive(Clone, Copy, Debug)]
struct Win {
    conversation: usize,
    revision: u64,
    change: Change,
}

/// What one task (or process) saw.
#[derive(Default)]
pub struct Tally {
    wins: Vec<Win>,
    /// `operation: outcome` of every documented refusal, counted.
    lost: BTreeMap<String, usize>,
    /// Anything else a caller got: must stay empty.
    unexpected: Vec<String>,
    /// The store errors among them, by kind (`transient` for a
    /// serialization failure, a deadlock or a dropped connection the
    /// PostgreSQL store should have retried, `busy` for SQLite's "database
    /// is locked"): must stay empty.
    store_errors: BTreeMap<String, usize>,
}

impl Tally {
    fn win(&mut self, conversation: usize, revision: Revision, change: Change) {
        self.wins.push(Win {
            conversation,
            revision: revision.0,
            change,
        });
    }

    fn lost(&mut self, operation: &str, error: &Error) {
        *self
            .lost
            .entry(format!("{operation}: {}", kind(error)))
            .or_default() += 1;
    }

    fn replayed(&mut self, operation: &str) {
        *self
            .lost
            .entry(format!("{operation}: replayed"))
            .or_default() += 1;
    }

    fn unexpected(&mut self, operation: &str, what: impl std::fmt::Display) {
        self.unexpected.push(format!("{operation}: {what}"));
    }

    /// An error outside the documented ones; a store error is also counted
    /// by kind.
    fn unexpected_error(&mut self, operation: &str, error: Error) {
        if let Error::Store(e) = &error {
            let text = e.to_string().to_lowercase();
            let transient = [
                "deadlock",
                "could not serialize",
                "terminating connection",
                "error communicating",
                "connection reset",
            ]
            .iter()
            .any(|t| text.contains(t));
            let kind = match (transient, e.is_busy()) {
                (true, _) => "transient",
                (_, true) => "busy",
                _ => "other",
            };
            *self.store_errors.entry(kind.into()).or_default() += 1;
        }
        self.unexpected(operation, error);
    }

    pub fn merge(&mut self, other: Tally) {
        self.wins.extend(other.wins);
        for (k, v) in other.lost {
            *self.lost.entry(k).or_default() += v;
        }
        self.unexpected.extend(other.unexpected);
        for (k, v) in other.store_errors {
            *self.store_errors.entry(k).or_default() += v;
        }
    }

    /// Wins per change and refusals per operation, in words.
    pub fn summary(&self) -> String {
        let mut won: BTreeMap<String, usize> = BTreeMap::new();
        for w in &self.wins {
            *won.entry(w.change.name()).or_default() += 1;
        }
        format!(
            "won {} ({won:?}), lost {} ({:?}), unexpected {}, store errors {:?}",
            self.wins.len(),
            self.lost.values().sum::<usize>(),
            self.lost,
            self.unexpected.len(),
            self.store_errors
        )
    }

    pub fn print(&self, out: &mut impl Write) -> std::io::Result<()> {
        for w in &self.wins {
            writeln!(
                out,
                "RACE win {} {} {}",
                w.conversation,
                w.revision,
                w.change.name()
            )?;
        }
        for (k, v) in &self.lost {
            writeln!(out, "RACE lost {v} {k}")?;
        }
        for u in &self.unexpected {
            writeln!(out, "RACE unexpected {}", u.replace('\n', " "))?;
        }
        for (kind, n) in &self.store_errors {
            writeln!(out, "RACE store {n} {kind}")?;
        }
        Ok(())
    }

    /// Reads what [`Tally::print`] wrote; a malformed line is unexpected.
    pub fn parse(out: &str) -> Tally {
        let mut tally = Tally::default();
        for line in out.lines() {
            let Some(rest) = line.split_once("RACE ").map(|(_, r)| r) else {
                continue;
            };
            let fields: Vec<&str> = rest.splitn(4, ' ').collect();
            match fields.as_slice() {
                ["win", conversation, revision, change] => {
                    match (
                        conversation.parse(),
                        revision.parse(),
                        Change::parse(change),
                    ) {
                        (Ok(conversation), Ok(revision), Some(change)) => tally.wins.push(Win {
                            conversation,
                            revision,
                            change,
                        }),
                        _ => tally.unexpected("worker output", line),
                    }
                }
                ["lost", count, ..] => match (count.parse::<usize>(), rest.splitn(3, ' ').nth(2)) {
                    (Ok(count), Some(what)) => {
                        *tally.lost.entry(what.to_owned()).or_default() += count
                    }
                    _ => tally.unexpected("worker output", line),
                },
                ["unexpected", ..] => tally.unexpected.push(rest.to_owned()),
                ["store", count, kind] => match count.parse::<usize>() {
                    Ok(count) => {
                        *tally.store_errors.entry((*kind).to_owned()).or_default() += count
                    }
                    Err(_) => tally.unexpected("worker output", line),
                },
                ["ready"] | ["done"] | ["retries", _] => {}
                _ => tally.unexpected("worker output", line),
            }
        }
        tally
    }
}

/// The error's variant, for the tallies.
fn kind(error: &Error) -> &'static str {
    match error {
        Error::Busy { .. } => "Busy",
        Error::Conflict { .. } => "Conflict",
        Error::Fenced { .. } => "Fenced",
        Error::NotActive { .. } => "NotActive",
        Error::AmbiguousCheckpoint { .. } => "AmbiguousCheckpoint",
        Error::RequestAbandoned { .. } => "RequestAbandoned",
        _ => "other",
    }
}

/// One process's racers: a store, the conversations and a session per
/// conversation, all on the same agent.
#[derive(Clone)]
struct Racers {
    store: Arc<dyn Store>,
    conversations: Vec<ConversationId>,
    sessions: Vec<Arc<AgentSession>>,
    fingerprint: String,
    process: u64,
    tasks: usize,
}

impl Racers {
    fn new(
        store: Arc<dyn Store>,
        conversations: &[ConversationId],
        process: u64,
        tasks: usize,
    ) -> Racers {
        // One tool round, then the answer; the model takes a moment, so live
        // owners are overtaken by recoverers and abandoners mid-run.
        let model = Arc::new(ScriptedModel::new(vec![
            ScriptedReply::tool_calls(vec![ToolCall::new("n1", "noop", json!({}))])
                .with_delay(Duration::from_millis(1)),
            ScriptedReply::text("raced answer").with_delay(Duration::from_millis(1)),
        ]));
        let agent = Agent::new(model).with_tool(Arc::new(Noop));
        let sessions = conversations
            .iter()
            .map(|&c| {
                Arc::new(AgentSession::new(
                    agent.clone(),
                    store.clone(),
                    c,
                    ns(),
                    ContextPolicy::default(),
                ))
            })
            .collect();
        Racers {
            store,
            conversations: conversations.to_vec(),
            sessions,
            // Store-level claims bind the session agent's fingerprint, so the
            // session layer may recover them.
            fingerprint: agent.fingerprint(),
            process,
            tasks,
        }
    }

    fn spawn(&self, start: Arc<Barrier>) -> Vec<tokio::task::JoinHandle<Tally>> {
        (0..self.tasks)
            .map(|task| {
                let racers = self.clone();
                let start = start.clone();
                tokio::spawn(async move {
                    start.wait().await;
                    racers.race(task).await
                })
            })
            .collect()
    }

    async fn race(&self, task: usize) -> Tally {
        let mut rng = Rng::new(self.process * 1_000 + task as u64);
        let mut tally = Tally::default();
        // The request this task last saw holding each conversation, at which
        // revision, and in how many rounds in a row.
        let mut seen: Vec<Option<(RequestId, Revision, u32)>> = vec![None; CONVERSATIONS];
        for _ in 0..ROUNDS {
            // A moment between rounds lets live owners get on with their turns.
            tokio::time::sleep(Duration::from_micros(rng.below(3_000))).await;
            let c = rng.below(CONVERSATIONS as u64) as usize;
            let admission = match self.store.admission(self.conversations[c]).await {
                Ok(a) => a,
                Err(e) => {
                    tally.unexpected_error("admission", e);
                    continue;
                }
            };
            let holder = admission.active.as_ref().map(|a| (a.request_id, a.run_id));
            let before = seen[c];
            if let Some((request, _)) = holder {
                let rounds = match before {
                    Some((r, v, n)) if r == request && v == admission.revision => n + 1,
                    _ => 1,
                };
                seen[c] = Some((request, admission.revision, rounds));
            }
            // A holder looks stuck when this task saw it unchanged for a few
            // rounds; most takeovers wait for that, some do not.
            let stuck = seen[c].is_some_and(|s| holder.is_some() && s.2 > 2);
            let take_over = stuck || rng.below(6) == 0;
            // Idle: aim at the request last seen holding it, which moved on.
            let target = match holder {
                Some((request, _)) => take_over.then_some(request),
                None => before.map(|b| b.0),
            };
            // Now and then, a stale revision.
            let revision = match admission.revision.0 {
                r if r > 0 && rng.below(8) == 0 => Revision(r - 1),
                r => Revision(r),
            };
            match (rng.below(100), target) {
                // Claims of a held admission (Busy) only now and then: each
                // takes the write lock, and live owners need it too.
                (0..=29, _) if holder.is_none() || rng.below(4) == 0 => {
                    self.store_claim(c, revision, &mut rng, &mut tally).await
                }
                (30..=49, Some(request)) => {
                    // An idle admission has no run: aim at a made-up one.
                    let run = holder.map_or_else(RunId::new, |h| h.1);
                    self.store_recover(c, request, run, revision, &mut rng, &mut tally)
                        .await
                }
                (50..=61, Some(request)) => {
                    self.store_abandon(c, request, revision, &mut tally).await
                }
                (62..=79, _) => self.session_run(c, &mut tally).await,
                (80..=91, Some(request)) => {
                    self.session_recover(c, request, revision, &mut tally).await
                }
                (92.., Some(request)) => {
                    self.session_abandon(c, request, revision, &mut tally).await
                }
                // Waiting for the holder to finish.
                _ => {}
            }
        }
        tally
    }

    async fn store_claim(&self, c: usize, expected: Revision, rng: &mut Rng, tally: &mut Tally) {
        let request_id = RequestId::new();
        let input = input_of(request_id);
        let claim = NewRequest {
            conversation_id: self.conversations[c],
            request_id,
            input_sha256: InputHash::of(&input),
            input: Message::user(input),
            expected_revision: expected,
            expected_created_at: None,
            run_id: RunId::first_of(request_id),
            agent_fingerprint: self.fingerprint.clone(),
            // The owner writes its turn's write-ahead itself.
            first_turn: None,
            deadline_at: None,
            budget: Default::default(),
        };
        match self.store.claim(&claim).await {
            Ok(ClaimOutcome::Admitted(fence)) => {
                tally.win(c, fence.revision, Change::Claim);
                // A third of the owners "crash" holding the admission; the
                // rest run a turn and commit, unless overtaken.
                if rng.below(3) != 0 {
                    self.store_owner(c, fence, tally).await;
                }
            }
            Ok(ClaimOutcome::Existing(record)) => {
                tally.unexpected("claim", format!("a fresh id is known: {record:?}"))
            }
            Err(e @ (Error::Busy { .. } | Error::Conflict { .. })) => tally.lost("claim", &e),
            Err(e) => tally.unexpected_error("claim", e),
        }
    }

    /// A live owner of a fresh claim: write-ahead of turn 1, then the final
    /// answer. Overtaken, it must be fenced.
    async fn store_owner(&self, c: usize, fence: Fence, tally: &mut Tally) {
        let mut checkpoint = LoopCheckpoint {
            run_id: fence.run_id,
            turn: 1,
            phase: CheckpointPhase::TurnInFlight,
            usage: Usage::default(),
            tool_calls_count: 0,
            verification_reports: Vec::new(),
            message_count: 1,
            created_at: 0,
        };
        if let Err(e) = self.store.begin_turn(&fence, &checkpoint).await {
            return self.owner_error("begin_turn", &fence, e, tally);
        }
        tokio::task::yield_now().await;
        checkpoint.phase = CheckpointPhase::Completed;
        checkpoint.message_count = 2;
        let answer = Message::assistant("stored answer");
        match self.store.commit(&fence, &checkpoint, &answer).await {
            Ok(_) => tally.win(c, Revision(fence.revision.0 + 1), Change::Commit),
            Err(e) => self.owner_error("commit", &fence, e, tally),
        }
    }

    /// An overtaken owner's write must be refused as `Fenced`, naming it.
    fn owner_error(&self, operation: &str, fence: &Fence, e: Error, tally: &mut Tally) {
        match e {
            Error::Fenced { run_id, revision }
                if run_id == fence.run_id && revision == fence.revision =>
            {
                tally.lost(operation, &e)
            }
            e => tally.unexpected_error(operation, e),
        }
    }

    async fn store_recover(
        &self,
        c: usize,
        request_id: RequestId,
        from_run: RunId,
        expected: Revision,
        rng: &mut Rng,
        tally: &mut Tally,
    ) {
        let reject_in_flight = rng.below(2) == 0;
        let claim = RecoveryClaim {
            conversation_id: self.conversations[c],
            request_id,
            expected_revision: expected,
            from_run,
            new_run: RunId::new(),
            reject_in_flight,
            resolved: None,
            retry_model_call: false,
            agent_fingerprint: None,
            budget_change: None,
        };
        match self.store.claim_recovery(&claim).await {
            Ok(fence) => {
                tally.win(c, fence.revision, Change::Recover);
                // Half of the new owners record a failure (a fenced write);
                // all of them then "crash" holding the admission.
                if rng.below(2) == 0 {
                    if let Err(e) = self.store.fail_run(&fence, "racer stopped", None).await {
                        self.owner_error("fail_run", &fence, e, tally);
                    }
                }
            }
            Err(e @ (Error::Busy { .. } | Error::Conflict { .. } | Error::NotActive { .. })) => {
                tally.lost("claim_recovery", &e)
            }
            Err(e @ Error::AmbiguousCheckpoint { .. }) if reject_in_flight => {
                tally.lost("claim_recovery", &e)
            }
            Err(e) => tally.unexpected_error("claim_recovery", e),
        }
    }

    async fn store_abandon(
        &self,
        c: usize,
        request_id: RequestId,
        expected: Revision,
        tally: &mut Tally,
    ) {
        match self
            .store
            .abandon(self.conversations[c], request_id, expected)
            .await
        {
            Ok(revision) => tally.win(c, revision, Change::Abandon),
            Err(e @ (Error::Busy { .. } | Error::Conflict { .. } | Error::NotActive { .. })) => {
                tally.lost("abandon", &e)
            }
            Err(e) => tally.unexpected_error("abandon", e),
        }
    }

    /// A new request through the session, streamed: `RunStarted` carries the
    /// revision its claim won; the commit is the next one.
    async fn session_run(&self, c: usize, tally: &mut Tally) {
        let request_id = RequestId::new();
        let session = &self.sessions[c];
        let mut stream =
            pin!(session.stream(request_id, input_of(request_id), RunContext::default()));
        let mut claimed: Option<Revision> = None;
        while let Some(item) = stream.next().await {
            match (item, claimed) {
                (Ok(Event::RunStarted { revision, .. }), None) => {
                    tally.win(c, revision, Change::RunClaim);
                    claimed = Some(revision);
                }
                (Ok(Event::ConversationCommitted { outcome, .. }), Some(revision))
                    if outcome.request_id == request_id && !outcome.replayed =>
                {
                    tally.win(c, Revision(revision.0 + 1), Change::RunCommit)
                }
                (Ok(Event::RunStarted { .. } | Event::ConversationCommitted { .. }), _) => {
                    tally.unexpected("stream", "an event out of order")
                }
                (Ok(_), _) => {}
                (Err(e @ (Error::Busy { .. } | Error::Conflict { .. })), None) => {
                    tally.lost("stream", &e)
                }
                (Err(Error::Fenced { revision, .. }), Some(owned)) if revision == owned => {
                    *tally.lost.entry("stream: Fenced".into()).or_default() += 1
                }
                (Err(e), _) => tally.unexpected_error("stream", e),
            }
        }
    }

    /// `recover_after_owner_exit`: its claim is the compare-and-swap at
    /// `expected`, so a winner owns `expected + 1` and commits `expected + 2`.
    async fn session_recover(
        &self,
        c: usize,
        request_id: RequestId,
        expected: Revision,
        tally: &mut Tally,
    ) {
        let result = self.sessions[c]
            .recover_after_owner_exit(
                request_id,
                &input_of(request_id),
                RunContext::default(),
                expected,
                ResumePolicy::RetryInterruptedTurn,
            )
            .await;
        let claimed = Revision(expected.0 + 1);
        match result {
            Ok(outcome) if outcome.request_id != request_id => {
                tally.unexpected("recover", format!("another request's outcome: {outcome:?}"))
            }
            Ok(outcome) if outcome.replayed => tally.replayed("recover"),
            Ok(_) => {
                tally.win(c, claimed, Change::SessionRecover);
                tally.win(c, Revision(expected.0 + 2), Change::SessionRecoverCommit);
            }
            // Claimed, then overtaken before its commit.
            Err(e @ Error::Fenced { revision, .. }) if revision == claimed => {
                tally.win(c, claimed, Change::SessionRecover);
                tally.lost("recover", &e);
            }
            Err(
                e @ (Error::Busy { .. }
                | Error::Conflict { .. }
                | Error::NotActive { .. }
                | Error::RequestAbandoned { .. }),
            ) => tally.lost("recover", &e),
            Err(e) => tally.unexpected_error("recover", e),
        }
    }

    async fn session_abandon(
        &self,
        c: usize,
        request_id: RequestId,
        expected: Revision,
        tally: &mut Tally,
    ) {
        match self.sessions[c].abandon(request_id, expected).await {
            Ok(revision) => tally.win(c, revision, Change::SessionAbandon),
            Err(e @ (Error::Busy { .. } | Error::Conflict { .. } | Error::NotActive { .. })) => {
                tally.lost("session abandon", &e)
            }
            Err(e) => tally.unexpected_error("session abandon", e),
        }
    }
}

/// A tool with no effect.
struct Noop;

#[turnstile::async_trait]
impl Tool for Noop {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "noop".into(),
            description: "does nothing".into(),
            parameters: json!({ "type": "object" }),
        }
    }

    async fn call(
        &self,
        _arguments: Value,
        _context: ToolContext,
    ) -> Result<turnstile::Content, ToolError> {
        tokio::task::yield_now().await;
        Ok("done".into())
    }
}

/// xorshift64*, seeded by splitmix64: each task's choices are reproducible
/// (the interleaving is not).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

// ---------------------------------------------------------------------------
// The worker process
// ---------------------------------------------------------------------------

/// The second process: its stdout arrives line by line on a channel, so the
/// parent waits with a deadline instead of hanging on a stuck worker. It is
/// killed if the test fails before it exits.
struct Worker {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: String,
}

impl Worker {
    fn spawn(command: &mut Command) -> std::io::Result<Worker> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Worker {
            child,
            lines,
            seen: String::new(),
        })
    }

    /// Waits for a line ending with `wanted`; panics on deadline or exit.
    fn wait_for(&mut self, wanted: &str) {
        let deadline = Instant::now() + CHILD_DEADLINE;
        loop {
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) => {
                    let found = line.ends_with(wanted);
                    self.seen.push_str(&line);
                    self.seen.push('\n');
                    if found {
                        return;
                    }
                }
                Err(e) => {
                    let err = self.kill();
                    panic!("worker stopped or stalled ({e}):\n{}\n{err}", self.seen)
                }
            }
        }
    }

    fn go(&mut self) -> std::io::Result<()> {
        let mut stdin = self.child.stdin.take().expect("piped stdin");
        stdin.write_all(b"go\n")
    }

    /// Waits for the worker to exit successfully; its stdout and stderr.
    fn finish(mut self) -> (String, String) {
        let deadline = Instant::now() + CHILD_DEADLINE;
        loop {
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) => {
                    self.seen.push_str(&line);
                    self.seen.push('\n');
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let err = self.kill();
                    panic!("worker stalled:\n{}\n{err}", self.seen)
                }
            }
        }
        let status = self.child.wait().expect("wait for the worker");
        let err = self.stderr();
        assert!(
            status.success(),
            "worker failed ({status}):\n{}\n{err}",
            self.seen
        );
        (std::mem::take(&mut self.seen), err)
    }

    /// Kills the worker (this test's own child, by its handle); its stderr.
    fn kill(&mut self) -> String {
        self.child.kill().ok();
        self.child.wait().ok();
        self.stderr()
    }

    fn stderr(&mut self) -> String {
        let mut err = String::new();
        if let Some(mut stderr) = self.child.stderr.take() {
            stderr.read_to_string(&mut err).ok();
        }
        err
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

// ---------------------------------------------------------------------------
// A recoverer overtaken before it reads its messages
// ---------------------------------------------------------------------------

/// Regression (found by the SQLite suite): a recoverer overtaken right
/// after its claim — another recoverer takes the request over and commits
/// it before the first one has read the request's messages — got
/// `Error::Corrupt` ("expected N messages, found 0": the commit moved them
/// to the transcript) instead of `Error::Fenced`. The database was fine;
/// the loser was told it is damaged. The window is narrow, so a store
/// (`store`, wrapped) that pauses the loser there makes it certain.
pub async fn a_recoverer_overtaken_before_reading_its_messages_is_fenced(
    store: Arc<dyn Store>,
) -> TestResult {
    let pause = Arc::new(PauseHook {
        armed: AtomicBool::new(false),
        claimed: AtomicBool::new(false),
        paused: Notify::new(),
        resume: Notify::new(),
    });
    let pausing: Arc<dyn Store> = Arc::new(Hooked {
        inner: store.clone(),
        hook: pause.clone(),
    });
    let conversation = ConversationId::new();
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedReply::tool_calls(vec![ToolCall::new("n1", "noop", json!({}))]),
        ScriptedReply::text("answer"),
    ]));
    let agent = Agent::new(model).with_tool(Arc::new(Noop));
    let session = |store: Arc<dyn Store>| {
        Arc::new(AgentSession::new(
            agent.clone(),
            store,
            conversation,
            ns(),
            ContextPolicy::default(),
        ))
    };
    let (loser, winner) = (session(pausing.clone()), session(store.clone()));

    // A request stopped by its turn budget after turn 1: held at revision 1.
    let request = RequestId::new();
    let one_turn = RunContext::default().with_budget(Budget {
        max_turns: Some(1),
        ..Budget::default()
    });
    let stopped = winner.run(request, "go", one_turn).await;
    let (_, revision) = stopped
        .as_ref()
        .err()
        .and_then(Error::stopped_run)
        .ok_or_else(|| format!("expected a budget stop, got {stopped:?}"))?;

    // The loser claims (revision 2) and is paused before it reads the run.
    pause.armed.store(true, Ordering::SeqCst);
    let recovering = tokio::spawn(async move {
        loser
            .recover_after_owner_exit(
                request,
                "go",
                crate::session::more_turns(),
                revision,
                ResumePolicy::RetryInterruptedTurn,
            )
            .await
    });
    pause.paused.notified().await;
    let claimed = store.admission(conversation).await?.revision;
    assert_eq!(claimed, Revision(revision.0 + 1));

    // The winner takes it over at revision 2 and commits.
    let outcome = winner
        .recover_after_owner_exit(
            request,
            "go",
            crate::session::more_turns(),
            claimed,
            ResumePolicy::RetryInterruptedTurn,
        )
        .await?;
    assert!(!outcome.replayed);

    pause.resume.notify_one();
    match recovering.await? {
        Err(Error::Fenced { revision, .. }) if revision == claimed => Ok(()),
        other => panic!("the overtaken recoverer got {other:?}, not Fenced"),
    }
}

/// Once armed, pauses the next `latest_checkpoint` until resumed.
/// Pauses the first checkpoint read after an armed store's recovery claim
/// (the reads before the claim go on).
struct PauseHook {
    armed: AtomicBool,
    claimed: AtomicBool,
    paused: Notify,
    resume: Notify,
}

#[turnstile::async_trait]
impl Hook for PauseHook {
    async fn enter(&self, call: &Call) -> u64 {
        if call.op == "latest_checkpoint" && self.claimed.swap(false, Ordering::SeqCst) {
            self.paused.notify_one();
            self.resume.notified().await;
        }
        0
    }

    fn leave(&self, call: &Call, _token: u64, ok: bool) {
        if call.op == "claim_recovery" && ok && self.armed.swap(false, Ordering::SeqCst) {
            self.claimed.store(true, Ordering::SeqCst);
        }
    }
}
