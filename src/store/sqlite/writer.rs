//! Group commit. Every durable step of a run goes to one writer task, which
//! commits the steps that are waiting together in one transaction: under
//! concurrency many sessions share one commit (one fsync) instead of taking
//! turns for the write lock. Each step still runs its own fence, inside its
//! own savepoint, so a fenced or failing step is rolled back alone; a caller
//! is answered only once the transaction holding its step has committed.
//!
//! A step that finds the writer idle and nobody queued runs at once, on the
//! caller's task, in a plain transaction: a single session pays nothing for
//! the batching (no hand-off to the writer task, no savepoint).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures_core::future::BoxFuture;
use sqlx::pool::PoolConnection;
use sqlx::{Connection, Sqlite, SqliteConnection, SqlitePool};
use tokio::sync::{mpsc, oneshot};

use super::codec::db;
use crate::error::StoreError;
use crate::Error;

/// The most steps one transaction takes, so one batch cannot hold the write
/// lock (and the callers behind it) for long.
const MAX_BATCH: usize = 256;

/// Answers a caller once its step's transaction has ended.
type Reply = Box<dyn FnOnce(Result<(), Error>) + Send>;

/// What a job is given: the connection to run on, or the error that kept
/// it from running.
enum Attempt<'c> {
    Run(&'c mut SqliteConnection),
    Fail(Error),
}

/// A step with its result type erased: `Ok` holds the reply to send once
/// the transaction commits; `Err` means the step failed (or never ran) and
/// its caller has been answered.
type Job = Box<dyn for<'c> FnOnce(Attempt<'c>) -> BoxFuture<'c, Result<Reply, ()>> + Send>;

/// The handle through which the store's writes reach the writer task. The
/// task ends when the last handle is dropped.
#[derive(Clone, Debug)]
pub(super) struct GroupWriter {
    jobs: mpsc::UnboundedSender<Job>,
    /// Steps sent to the writer task and not yet taken by it.
    queued: Arc<AtomicUsize>,
    pool: SqlitePool,
}

impl GroupWriter {
    /// Starts the writer task on the current Tokio runtime; it takes the
    /// pool's connection for each batch, so writes that bypass it (prune,
    /// migrations) still exclude it.
    pub(super) fn spawn(pool: SqlitePool) -> Self {
        let (jobs, queue) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        tokio::spawn(run(pool.clone(), queue, queued.clone()));
        Self { jobs, queued, pool }
    }

    /// Runs `step` in the next group transaction and returns its result once
    /// that transaction has committed. The step runs inside a transaction it
    /// must not end itself.
    pub(super) async fn write<T, F>(&self, step: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut SqliteConnection) -> BoxFuture<'c, Result<T, Error>>
            + Send
            + 'static,
    {
        // Nobody to group with: run it here, as its own transaction.
        if self.queued.load(Ordering::Acquire) == 0 {
            if let Some(mut conn) = self.pool.try_acquire() {
                let mut tx = conn
                    .begin_with("BEGIN IMMEDIATE")
                    .await
                    .map_err(db("begin write transaction"))?;
                let value = step(&mut tx).await?;
                tx.commit().await.map_err(db("commit"))?;
                return Ok(value);
            }
        }
        let (answer, answered) = oneshot::channel::<Result<T, Error>>();
        let job: Job = Box::new(move |attempt| {
            Box::pin(async move {
                let ran = match attempt {
                    Attempt::Run(conn) => step(conn).await,
                    Attempt::Fail(e) => Err(e),
                };
                match ran {
                    Ok(value) => Ok(Box::new(move |committed: Result<(), Error>| {
                        let _ = answer.send(committed.map(|()| value));
                    }) as Reply),
                    Err(e) => {
                        let _ = answer.send(Err(e));
                        Err(())
                    }
                }
            })
        });
        self.queued.fetch_add(1, Ordering::AcqRel);
        if self.jobs.send(job).is_err() {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(writer_gone());
        }
        answered.await.map_err(|_| writer_gone())?
    }
}

async fn run(pool: SqlitePool, mut queue: mpsc::UnboundedReceiver<Job>, queued: Arc<AtomicUsize>) {
    while let Some(first) = queue.recv().await {
        let mut batch = VecDeque::from([first]);
        // The connection first, then the batch: steps that queued while
        // the connection was busy join this transaction.
        let conn = pool.acquire().await.map_err(db("acquire writer"));
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => batch.push_back(job),
                Err(_) => break,
            }
        }
        queued.fetch_sub(batch.len(), Ordering::AcqRel);
        match conn {
            Ok(conn) => commit_batch(&pool, conn, batch).await,
            Err(e) => fail_all(batch, &e).await,
        }
    }
}

/// Commits a batch; a transaction that breaks mid-batch is answered with
/// its error and the steps it had not reached go on in a new one. The
/// connection goes back to the pool after a broken transaction, so a
/// connection that it left in a bad state is repaired or replaced (the
/// pool's release check, in `open.rs`).
async fn commit_batch(
    pool: &SqlitePool,
    mut conn: PoolConnection<Sqlite>,
    mut batch: VecDeque<Job>,
) {
    loop {
        let broken = one_transaction(&mut conn, &mut batch).await;
        if batch.is_empty() {
            return;
        }
        if let Err(e) = broken {
            tracing::warn!(error = %e, "group transaction failed");
        }
        drop(conn);
        conn = match pool.acquire().await.map_err(db("acquire writer")) {
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
    let isolated = batch.len() > 1;
    let mut applied: Vec<Reply> = Vec::with_capacity(batch.len());
    while let Some(job) = batch.pop_front() {
        if !isolated {
            match job(Attempt::Run(&mut tx)).await {
                Ok(reply) => applied.push(reply),
                Err(()) => {
                    return tx.rollback().await.map_err(db("roll back failed step"));
                }
            }
            continue;
        }
        // One statement per step: savepoints of one name stack up, `ROLLBACK
        // TO` undoes only the latest (this step's), and the commit releases
        // them all; a RELEASE per step would be a round trip for nothing.
        if let Err(e) = sqlx::query("SAVEPOINT step")
            .execute(&mut *tx)
            .await
            .map_err(db("savepoint"))
        {
            batch.push_front(job);
            answer_all(applied, &e);
            return Err(e);
        }
        let ended = match job(Attempt::Run(&mut tx)).await {
            Ok(reply) => {
                applied.push(reply);
                Ok(())
            }
            Err(()) => sqlx::query("ROLLBACK TO step")
                .execute(&mut *tx)
                .await
                .map(drop)
                .map_err(db("roll back to savepoint")),
        };
        // A step whose error made SQLite end the whole transaction (a full
        // disk, say) takes the steps before it down with it.
        if let Err(e) = ended {
            answer_all(applied, &e);
            return Err(e);
        }
    }
    let committed = tx.commit().await.map_err(db("commit"));
    match committed {
        Ok(()) => {
            tracing::trace!(steps = applied.len(), "group transaction committed");
            for reply in applied {
                reply(Ok(()));
            }
            Ok(())
        }
        Err(e) => {
            answer_all(applied, &e);
            Err(e)
        }
    }
}

/// Answers steps that cannot be committed with a copy of the error.
fn answer_all(applied: Vec<Reply>, error: &Error) {
    for reply in applied {
        reply(Err(copy_of(error)));
    }
}

/// Answers steps that never ran.
async fn fail_all(batch: VecDeque<Job>, error: &Error) {
    for job in batch {
        let _ = job(Attempt::Fail(copy_of(error))).await;
    }
}

/// One error, answered to several callers (`Error` does not clone: its
/// source is a boxed error).
fn copy_of(error: &Error) -> Error {
    match error {
        Error::Store(e) => Error::Store(e.replicate()),
        other => Error::Store(StoreError::new(other.to_string(), None)),
    }
}

fn writer_gone() -> Error {
    Error::Store(StoreError::new(
        "the store's writer stopped before answering",
        None,
    ))
}
