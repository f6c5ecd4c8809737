//! Transient failures are retried inside the store, with bounded backoff:
//! a serialization failure or deadlock, a server shutting down
//! (`admin_shutdown`, a restart), a connection reset or refused. None reaches
//! a caller as such unless every attempt fails.
//!
//! A failure can come after the server applied the step: a connection
//! dropped after `COMMIT` was sent leaves it ambiguous. Every step is
//! therefore safe to run again: its writes are idempotent, and a step whose
//! own effect would refuse it a second time (a claim, a commit, a tool
//! result) first re-reads whether it was applied when it runs as a retry
//! (`retry: bool` below), and answers as the first attempt would have.

use std::time::Duration;

use turnstile_core::Error;

/// Attempts of one step, the first included.
pub(crate) const ATTEMPTS: u32 = 8;

/// Whether a failed attempt may be tried again.
pub(crate) fn retryable(error: &Error) -> bool {
    let Error::Store(store) = error else {
        return false;
    };
    let Some(cause) =
        std::error::Error::source(store).and_then(|source| source.downcast_ref::<sqlx::Error>())
    else {
        return false;
    };
    match cause {
        sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(_) => super::codec::sqlstate(cause).is_some_and(|state| {
            // serialization_failure, deadlock_detected; admin_shutdown,
            // crash_shutdown, cannot_connect_now; connection exceptions.
            matches!(
                state.as_str(),
                "40001" | "40P01" | "57P01" | "57P02" | "57P03"
            ) || state.starts_with("08")
        }),
        _ => false,
    }
}

/// Waits before attempt `attempt` (1-based retries): 20 ms doubling to at
/// most 1 s, each wait drawn between half and all of it so that contending
/// callers spread out. Eight attempts wait 1.6–3.2 s in all: enough for a
/// server restart without crash recovery; a longer outage reaches the
/// caller as a store error.
pub(crate) async fn backoff(attempt: u32) {
    let base = 20u64.saturating_mul(1 << attempt.min(6)).min(1_000);
    let jitter = (uuid::Uuid::new_v4().as_u128() % u128::from(base / 2 + 1)) as u64;
    tokio::time::sleep(Duration::from_millis(base / 2 + jitter)).await;
}

/// Runs `$attempt` (an expression of a future, re-evaluated per attempt,
/// with `$retry` true from the second) until it succeeds, fails for good,
/// or runs out of attempts.
macro_rules! retrying {
    (|$retry:ident| $attempt:expr) => {{
        let mut attempt = 0u32;
        loop {
            let $retry = attempt > 0;
            match $attempt.await {
                Err(e) if attempt + 1 < $crate::retry::ATTEMPTS && $crate::retry::retryable(&e) => {
                    attempt += 1;
                    tracing::debug!(error = %e, attempt, "retrying a store step");
                    $crate::retry::backoff(attempt).await;
                }
                result => break result,
            }
        }
    }};
}

/// One step as one transaction on a pooled connection, retried:
/// `$body` is an expression of a future over `$conn: &mut PgConnection`.
macro_rules! transaction {
    ($store:expr, |$conn:ident, $retry:ident| $body:expr) => {
        $crate::retry::retrying!(|$retry| async {
            let mut pooled = $crate::retry::acquire(&$store.pool, $retry).await?;
            let result = async {
                use sqlx::Connection;
                let mut tx = pooled.begin().await.map_err($crate::codec::db("begin"))?;
                let value = {
                    let $conn: &mut sqlx::PgConnection = &mut tx;
                    $body.await?
                };
                tx.commit().await.map_err($crate::codec::db("commit"))?;
                Ok::<_, turnstile_core::Error>(value)
            }
            .await;
            $crate::retry::settle(&mut pooled, &result);
            result
        })
    };
}

/// A step on a pooled connection without a transaction, retried: one
/// statement (which commits on its own, one round trip instead of three),
/// or reads that need no common snapshot.
macro_rules! autocommit {
    ($store:expr, |$conn:ident, $retry:ident| $body:expr) => {
        $crate::retry::retrying!(|$retry| async {
            let mut pooled = $crate::retry::acquire(&$store.pool, $retry).await?;
            let result = {
                let $conn: &mut sqlx::PgConnection = &mut pooled;
                $body.await
            };
            $crate::retry::settle(&mut pooled, &result);
            result
        })
    };
}

/// How long a retry's ping of a pooled connection may take.
const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// A pooled connection. For a retry it is pinged first, and one that
/// fails the ping is closed and another taken: whatever ended the failed
/// attempt's connection (a restart, a terminator) has likely ended the idle
/// ones too, and a retry that drew them one by one would spend its attempts
/// on connections known to be dead. The pool's own ping is skipped on the
/// first attempt (`test_before_acquire(false)`), so this costs a round trip
/// only after a failure.
pub(crate) async fn acquire(
    pool: &sqlx::PgPool,
    retry: bool,
) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>, Error> {
    use sqlx::Connection;
    let acquire = || async {
        pool.acquire().await.map_err(|e| {
            // The pool waits out a refused connection until its timeout:
            // with room for another connection, that wait was for a server
            // that did not answer, not for a connection another task held.
            let not_connected = matches!(e, sqlx::Error::PoolTimedOut)
                && pool.size() < pool.options().get_max_connections();
            let error = super::codec::db("acquire connection")(e);
            match not_connected {
                true => super::codec::unreachable(error),
                false => error,
            }
        })
    };
    if !retry {
        return acquire().await;
    }
    // Every pooled connection may be dead, plus one newly opened. A ping
    // that hangs (a half-open connection) counts as dead.
    for _ in 0..=pool.size() {
        let mut pooled = acquire().await?;
        match tokio::time::timeout(PING_TIMEOUT, pooled.ping()).await {
            Ok(Ok(())) => return Ok(pooled),
            _ => pooled.close_on_drop(),
        }
    }
    acquire().await
}

/// A connection whose step failed in a way worth retrying (reset,
/// terminated, server shutting down) is closed, not given back: the retry
/// takes another.
pub(crate) fn settle<T>(
    pooled: &mut sqlx::pool::PoolConnection<sqlx::Postgres>,
    result: &Result<T, Error>,
) {
    if result.as_ref().is_err_and(retryable) {
        pooled.close_on_drop();
    }
}

pub(crate) use {autocommit, retrying, transaction};
