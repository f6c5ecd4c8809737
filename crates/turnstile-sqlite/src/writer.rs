//! Group commit. Every durable step of a run goes to one writer task, which
//! commits the steps that are waiting together in one transaction: under
//! concurrency many sessions share one commit (one fsync) instead of taking
//! turns for the write lock. Each step still runs its own fence, and a
//! fenced or failing step is undone alone: a step that writes with one
//! statement ([`Isolation::Statement`], every step of a run's owner) is
//! undone by SQLite itself when that statement raises, so it needs no
//! savepoint; a step of several write statements runs inside a savepoint of
//! its own. Claims, turn writes, tool results and commits of one
//! transaction go as one statement per kind (`batch.rs`): a step that
//! statement skips, because it would be refused, then runs alone. Every
//! caller, the failed ones included, is answered only once the transaction
//! has ended: an error computed from a batch that then failed to commit
//! would describe something that never happened. In memory, where no
//! flush is shared, each kind's shared statement commits on its own and
//! its callers are answered at once: two round trips to SQLite's worker
//! thread fewer a batch (`BEGIN`, `COMMIT`).
//!
//! A step that finds the writer idle and nobody queued runs at once, on a
//! task of its own (a caller that pauses or drops its future never holds
//! the write lock): a one-statement step as that statement alone, with no
//! `BEGIN` or `COMMIT` around it, any other in a plain transaction.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures_core::future::BoxFuture;
use sqlx::{Connection, SqliteConnection};
use tokio::sync::{mpsc, oneshot};

use super::batch::{self, Applied, BatchKind};
use super::codec::db;
use super::write_connection::{Held, WriteConnection};
use turnstile_core::Error;

/// The most steps one transaction takes, so one batch cannot hold the write
/// lock (and the callers behind it) for long.
const MAX_BATCH: usize = 256;

/// Answers a caller once its step's transaction has ended: `None` if it
/// committed (the caller gets its step's own result), or the error that
/// ended it (the step's writes, if any, are undone).
type Reply = Box<dyn FnOnce(Option<Error>) + Send>;

/// How a step's failure is undone when the step shares its transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Isolation {
    /// The step writes with one statement, and refuses (an error that is
    /// not [`Error::Store`] or [`Error::Corrupt`], see [`is_refusal`]) only
    /// when nothing of it was written: its statement raised and SQLite
    /// undid that statement alone (or it never wrote at all), and the
    /// transaction goes on. No savepoint is taken. Any other error may have
    /// left anything: the whole transaction is rolled back, and the steps
    /// before it in the batch are told why.
    Statement,
    /// The step runs inside a savepoint of its own, rolled back if it fails.
    Savepoint,
}

/// Whether a step's error is a refusal: a typed answer about the state it
/// found (fenced, busy, a conflict, bad input...), not a failure of the
/// database or of its content.
fn is_refusal(error: &Error) -> bool {
    matches!(
        error,
        Error::Busy { .. }
            | Error::RequestMismatch { .. }
            | Error::RequestAbandoned { .. }
            | Error::NotActive { .. }
            | Error::NamespaceMismatch { .. }
            | Error::InvalidInput(_)
            | Error::NotFound { .. }
            | Error::AmbiguousCheckpoint { .. }
            | Error::Fenced { .. }
            | Error::Conflict { .. }
            | Error::NoPendingApproval { .. }
            | Error::Deleted { .. }
            | Error::VersionConflict { .. }
    )
}

/// How a step ended inside its transaction.
struct Ran {
    reply: Reply,
    /// When the step failed: a copy of its error, and whether nothing of
    /// the step is left in the transaction (a refusal of a
    /// [`Isolation::Statement`] step). Otherwise its savepoint, or the
    /// whole transaction, is rolled back, and if the transaction ends on it
    /// (a full disk, a step without a savepoint), the copy is what every
    /// other caller of the transaction is told.
    failed: Option<Failed>,
}

struct Failed {
    error: Error,
    undone: bool,
}

/// What a job is given: the connection to run on, what its row of a
/// shared statement returned, or the error that kept it from running.
enum Attempt<'c> {
    Run(&'c mut SqliteConnection),
    Applied(Applied),
    Fail(Error),
}

/// A step with its result type erased.
struct Job {
    isolation: Isolation,
    /// Its row for one statement with the other steps of its kind in the
    /// transaction; `None` once that was tried and the step runs alone.
    batch: Option<Batchable>,
    run: RunStep,
}

/// A step that can share one statement with the other steps of its kind.
pub(super) struct Batchable {
    pub(super) kind: BatchKind,
    /// Its row (a JSON object), built only when the step is batched.
    pub(super) row: Box<dyn Fn() -> Result<String, Error> + Send>,
}

type RunStep = Box<dyn for<'c> FnOnce(Attempt<'c>) -> BoxFuture<'c, Ran> + Send>;

/// The handle through which the store's writes reach the writer task. The
/// task ends when the last handle is dropped.
#[derive(Clone, Debug)]
pub(super) struct GroupWriter {
    jobs: mpsc::UnboundedSender<Job>,
    /// Steps sent to the writer task and not yet taken by it.
    queued: Arc<AtomicUsize>,
    writer: WriteConnection,
}

impl GroupWriter {
    /// Starts the writer task on the current Tokio runtime; it takes the
    /// write connection for each batch, so writes that bypass it (prune)
    /// still exclude it.
    pub(super) fn spawn(writer: WriteConnection) -> Self {
        let (jobs, queue) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        tokio::spawn(run(writer.clone(), queue, queued.clone()));
        Self {
            jobs,
            queued,
            writer,
        }
    }

    /// Runs `step` in the next group transaction and returns its result once
    /// that transaction has ended. The step runs inside a transaction it
    /// must not end itself; `isolation` says how its failure is undone.
    pub(super) async fn write<T, F>(&self, isolation: Isolation, step: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut SqliteConnection) -> BoxFuture<'c, Result<T, Error>>
            + Send
            + 'static,
    {
        self.submit(isolation, None, step, |_| Err(not_batched()))
            .await
    }

    /// Like [`GroupWriter::write`] for a one-statement step that may share
    /// its statement with other steps of its kind: `applied` answers it
    /// from what its row returned.
    pub(super) async fn write_batchable<T, F, A>(
        &self,
        batch: Batchable,
        step: F,
        applied: A,
    ) -> Result<T, Error>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut SqliteConnection) -> BoxFuture<'c, Result<T, Error>>
            + Send
            + 'static,
        A: FnOnce(Applied) -> Result<T, Error> + Send + 'static,
    {
        self.submit(Isolation::Statement, Some(batch), step, applied)
            .await
    }

    async fn submit<T, F, A>(
        &self,
        isolation: Isolation,
        batch: Option<Batchable>,
        step: F,
        applied: A,
    ) -> Result<T, Error>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut SqliteConnection) -> BoxFuture<'c, Result<T, Error>>
            + Send
            + 'static,
        A: FnOnce(Applied) -> Result<T, Error> + Send + 'static,
    {
        let (answer, answered) = oneshot::channel::<Result<T, Error>>();
        let run: RunStep = Box::new(move |attempt| {
            Box::pin(async move {
                let ran = match attempt {
                    Attempt::Run(conn) => step(conn).await,
                    Attempt::Applied(returned) => applied(returned),
                    Attempt::Fail(e) => Err(e),
                };
                match ran {
                    Ok(value) => Ran {
                        reply: Box::new(move |ended: Option<Error>| {
                            let _ = answer.send(ended.map_or(Ok(value), Err));
                        }),
                        failed: None,
                    },
                    Err(e) => Ran {
                        failed: Some(Failed {
                            error: copy_of(&e),
                            undone: isolation == Isolation::Statement && is_refusal(&e),
                        }),
                        reply: Box::new(move |ended: Option<Error>| {
                            let _ = answer.send(Err(ended.unwrap_or(e)));
                        }),
                    },
                }
            })
        });
        let job = Job {
            isolation,
            batch,
            run,
        };
        // Nobody to group with: a batch of one, at once, on a task of its
        // own; otherwise the writer task's next batch.
        let idle = match self.queued.load(Ordering::Acquire) {
            0 => self.writer.try_take(),
            _ => None,
        };
        if let Some(conn) = idle {
            tokio::spawn(commit_batch(
                self.writer.clone(),
                conn,
                VecDeque::from([job]),
            ));
        } else {
            self.queued.fetch_add(1, Ordering::AcqRel);
            if self.jobs.send(job).is_err() {
                self.queued.fetch_sub(1, Ordering::AcqRel);
                return Err(writer_gone());
            }
        }
        answered.await.map_err(|_| writer_gone())?
    }
}

async fn run(
    writer: WriteConnection,
    mut queue: mpsc::UnboundedReceiver<Job>,
    queued: Arc<AtomicUsize>,
) {
    while let Some(first) = queue.recv().await {
        let mut batch = VecDeque::from([first]);
        // The connection first, then the batch: steps that queued while
        // the connection was busy join this transaction.
        let conn = writer.take().await;
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => batch.push_back(job),
                Err(_) => break,
            }
        }
        queued.fetch_sub(batch.len(), Ordering::AcqRel);
        match conn {
            Ok(conn) => commit_batch(writer.clone(), conn, batch).await,
            Err(e) => fail_all(batch, &e).await,
        }
    }
}

/// Commits a batch; a transaction that breaks mid-batch is answered with
/// its error and the steps it had not reached go on in a new one, on a
/// connection repaired or replaced if the break left it in a bad state.
async fn commit_batch(writer: WriteConnection, mut conn: Held, mut batch: VecDeque<Job>) {
    if let Err(e) = writer.repair(&mut conn).await {
        return fail_all(batch, &e).await;
    }
    loop {
        if writer.is_in_memory() {
            // A failed statement wrote nothing and opened no transaction:
            // its steps run alone below, on the same connection.
            if let Err(e) = shared_statements_alone(&mut conn, &mut batch).await {
                tracing::warn!(error = %e, "shared statement failed");
            }
            if batch.is_empty() {
                return;
            }
        }
        let broken = one_transaction(&mut conn, &mut batch).await;
        if batch.is_empty() {
            return;
        }
        if let Err(e) = broken {
            tracing::warn!(error = %e, "group transaction failed");
        }
        drop(conn);
        conn = match writer.take().await {
            Ok(conn) => conn,
            Err(e) => return fail_all(batch, &e).await,
        };
    }
}

/// Runs steps from the front of `batch` in one transaction and answers
/// them. Returns early, with the steps not yet run left in `batch`, if the
/// transaction itself breaks.
async fn one_transaction(
    conn: &mut SqliteConnection,
    batch: &mut VecDeque<Job>,
) -> Result<(), Error> {
    if batch.len() == 1 && batch[0].isolation == Isolation::Statement {
        if let Some(job) = batch.pop_front() {
            autocommit(conn, job).await;
            return Ok(());
        }
    }
    let mut tx = match conn
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(db("begin write transaction"))
    {
        Ok(tx) => tx,
        Err(e) => {
            fail_all(std::mem::take(batch), &e).await;
            return Err(e);
        }
    };
    // Alone, a step needs no savepoint: its failure rolls back everything.
    let shared = batch.len() > 1;
    let mut ended: Vec<Reply> = Vec::with_capacity(batch.len());
    let mut failed = 0;
    if shared {
        if let Err(e) = run_batched(&mut tx, batch, &mut ended).await {
            drop(tx);
            answer_all(ended, Some(&e));
            return Err(e);
        }
    }
    while let Some(job) = batch.pop_front() {
        // Savepoints of one name stack up, `ROLLBACK TO` undoes only the
        // latest (this step's), and the commit releases them all; a RELEASE
        // per step would be a round trip for nothing.
        let savepoint = shared && job.isolation == Isolation::Savepoint;
        if savepoint {
            if let Err(e) = sqlx::query("SAVEPOINT step")
                .execute(&mut *tx)
                .await
                .map_err(db("savepoint"))
            {
                batch.push_front(job);
                answer_all(ended, Some(&e));
                return Err(e);
            }
        }
        let ran = (job.run)(Attempt::Run(&mut tx)).await;
        let Some(cause) = ran.failed else {
            ended.push(ran.reply);
            continue;
        };
        failed += 1;
        if !shared {
            // Alone: the transaction is the step's, and ends with it.
            drop(tx);
            (ran.reply)(None);
            return Ok(());
        }
        let undone = cause.undone
            || (savepoint
                && sqlx::query("ROLLBACK TO step")
                    .execute(&mut *tx)
                    .await
                    .is_ok());
        if !undone {
            // The step may have left writes that nothing can undo alone, or
            // SQLite ended the whole transaction on its error (a full disk,
            // say): the steps before it are undone with it, and their
            // callers learn why.
            drop(tx);
            (ran.reply)(None);
            answer_all(ended, Some(&cause.error));
            return Err(cause.error);
        }
        ended.push(ran.reply);
    }
    match tx.commit().await.map_err(db("commit")) {
        Ok(()) => {
            tracing::trace!(steps = ended.len(), failed, "group transaction committed");
            answer_all(ended, None);
            Ok(())
        }
        Err(e) => {
            answer_all(ended, Some(&e));
            Err(e)
        }
    }
}

/// Sends the steps of each kind that has several in `batch` as one
/// statement each ([`run_shared`]).
async fn run_batched(
    conn: &mut SqliteConnection,
    batch: &mut VecDeque<Job>,
    ended: &mut Vec<Reply>,
) -> Result<(), Error> {
    for kind in BatchKind::ALL {
        run_shared(conn, batch, kind, Commits::WithTransaction, ended).await?;
    }
    Ok(())
}

/// Sends the steps of each kind that has several in `batch` as one
/// statement each, outside any transaction: SQLite commits each statement
/// whole or undoes it whole, and its callers are answered as soon as it
/// has. What a statement skipped, and the steps that share none, stay in
/// `batch` for a transaction. For an in-memory database: a commit there
/// flushes nothing, so a transaction around the statements would cost two
/// round trips and save nothing.
async fn shared_statements_alone(
    conn: &mut SqliteConnection,
    batch: &mut VecDeque<Job>,
) -> Result<(), Error> {
    for kind in BatchKind::ALL {
        let mut ended = Vec::new();
        let written = run_shared(conn, batch, kind, Commits::WithStatement, &mut ended).await;
        if !ended.is_empty() {
            tracing::trace!(
                ?kind,
                steps = ended.len(),
                "shared statement committed on its own"
            );
        }
        answer_all(ended, None);
        written?;
    }
    Ok(())
}

/// When a shared statement's writes are committed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Commits {
    /// With the group transaction around it.
    WithTransaction,
    /// With the statement itself (no transaction is open).
    WithStatement,
}

/// Sends the steps of `kind` in `batch`, if there are several, as one
/// statement. An applied step's caller is answered into `ended`; a step
/// its statement skipped (a refusal) goes back to `batch` to run alone,
/// which names the refusal. If SQLite fails the statement, nothing of it
/// is written and its steps go back to run alone: after a refusal raised
/// inside it, in this transaction; after any other error, which may have
/// ended the transaction, in the next, and the error is returned for
/// `ended`. If what the statement returned cannot be read, its writes are
/// undone with the transaction when `commits` is
/// [`Commits::WithTransaction`]; committed with the statement, they are
/// not run again, and its callers are told the error.
async fn run_shared(
    conn: &mut SqliteConnection,
    batch: &mut VecDeque<Job>,
    kind: BatchKind,
    commits: Commits,
    ended: &mut Vec<Reply>,
) -> Result<(), Error> {
    let of_kind = batch
        .iter()
        .filter(|job| job.batch.as_ref().is_some_and(|b| b.kind == kind))
        .count();
    if of_kind < 2 {
        return Ok(());
    }
    let (mut group, rest): (VecDeque<Job>, VecDeque<Job>) = std::mem::take(batch)
        .into_iter()
        .partition(|job| job.batch.as_ref().is_some_and(|b| b.kind == kind));
    *batch = rest;
    let rows: Result<Vec<String>, Error> = group
        .iter()
        .filter_map(|job| job.batch.as_ref().map(|b| (b.row)()))
        .collect();
    let written = match rows {
        Ok(rows) => batch::write(conn, kind, &rows).await,
        Err(e) => Err(batch::Failed::Error(e)),
    };
    let mut returned = match written {
        Ok(returned) => returned,
        Err(batch::Failed::Unread(e)) if commits == Commits::WithStatement => {
            fail_all(group, &e).await;
            return Err(e);
        }
        Err(failed) => {
            batch.extend(group.into_iter().map(alone));
            match failed {
                batch::Failed::Refused => return Ok(()),
                batch::Failed::Error(e) | batch::Failed::Unread(e) => return Err(e),
            }
        }
    };
    tracing::trace!(
        ?kind,
        steps = group.len(),
        applied = returned.len(),
        "steps written in one statement"
    );
    returned.sort_by_key(|(step, _)| std::cmp::Reverse(*step));
    let mut step = 0;
    while let Some(job) = group.pop_front() {
        let applied = match returned.last() {
            Some((applied_step, _)) if *applied_step == step => returned.pop(),
            _ => None,
        };
        step += 1;
        let Some((_, applied)) = applied else {
            batch.push_back(alone(job));
            continue;
        };
        let ran = (job.run)(Attempt::Applied(applied)).await;
        if let Some(cause) = ran.failed {
            if commits == Commits::WithTransaction {
                // Written, then not understood (a corrupt row): the
                // transaction is rolled back with it, and the steps not
                // answered yet go on in the next.
                (ran.reply)(None);
                batch.extend(group.into_iter().map(alone));
                return Err(cause.error);
            }
            // Committed already, as the others' steps are: its caller is
            // told its own error, the others their results.
        }
        ended.push(ran.reply);
    }
    Ok(())
}

/// The job, to run as a statement of its own.
fn alone(job: Job) -> Job {
    Job { batch: None, ..job }
}

/// Runs a lone one-statement step with no `BEGIN` or `COMMIT`: two round
/// trips fewer. SQLite opens the transaction of a writing statement with
/// the write lock before the statement reads anything (waiting out the
/// busy timeout for it), which is what `BEGIN IMMEDIATE` gives, and ends
/// it, durably, before answering; a statement that raises is undone whole.
/// The step's follow-up reads, which explain a refusal, run after it on
/// the same connection, still held against this process's other writes.
async fn autocommit(conn: &mut SqliteConnection, job: Job) {
    let ran = (job.run)(Attempt::Run(conn)).await;
    if ran.failed.is_none() {
        tracing::trace!("step committed alone");
    }
    (ran.reply)(None);
}

/// Answers the callers of a transaction that ended: committed (`None`), or
/// with (a copy of) the error that ended it.
fn answer_all(ended: Vec<Reply>, error: Option<&Error>) {
    for reply in ended {
        reply(error.map(copy_of));
    }
}

/// Answers steps that never ran.
async fn fail_all(batch: VecDeque<Job>, error: &Error) {
    for job in batch {
        let ran = (job.run)(Attempt::Fail(copy_of(error))).await;
        (ran.reply)(None);
    }
}

/// One error, answered to several callers (`Error` does not clone: its
/// source is a boxed error).
fn copy_of(error: &Error) -> Error {
    match error {
        Error::Store(e) => Error::Store(e.replicate()),
        other => Error::Store(turnstile_core::StoreError::new(other.to_string(), None)),
    }
}

fn not_batched() -> Error {
    Error::Store(turnstile_core::StoreError::new(
        "a step that shares no statement was answered as one",
        None,
    ))
}

fn writer_gone() -> Error {
    Error::Store(turnstile_core::StoreError::new(
        "the store's writer stopped before answering",
        None,
    ))
}
