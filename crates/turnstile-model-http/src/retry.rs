//! Trying an exchange again after a rate limit (429), an overload (529, or
//! an error the server reports in its answer), another server error, or a
//! stream that failed before any of its text was shown: after the server's
//! `retry-after`, or a doubling backoff, within [`RetryPolicy`] and never
//! past the run's deadline. A model call has no side effects, so sending it
//! again is safe; only its cost repeats. A server that cannot be reached
//! is not retried: it is mostly one that is not running, and the run stops
//! saying so at once.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::StatusCode;
use tokio::time::Instant;

use turnstile_core::agent::TextDeltas;
use turnstile_core::ModelError;

use crate::retryable_status;

/// How a call answered 408, 429 (rate limited), 529 (overloaded) or
/// another 5xx, or whose stream failed before showing any text, is tried
/// again: after the server's `retry-after`, or a backoff doubling from
/// [`RetryPolicy::backoff`], never past the run's deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt. Default 4; 0 never retries.
    pub max_retries: u32,
    /// The first wait when the server names none. Default 1 s.
    pub backoff: Duration,
    /// The longest single wait: a `retry-after` above it is not waited for
    /// and the call fails (retryable). Default 60 s.
    pub max_wait: Duration,
}

impl RetryPolicy {
    /// Every failure is final.
    pub const NEVER: RetryPolicy = RetryPolicy {
        max_retries: 0,
        backoff: Duration::ZERO,
        max_wait: Duration::ZERO,
    };
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 4,
            backoff: Duration::from_secs(1),
            max_wait: Duration::from_secs(60),
        }
    }
}

/// How an attempt failed.
pub enum Failure {
    /// Worth sending again, after `wait` when the server named one.
    Retry {
        error: ModelError,
        wait: Option<Duration>,
    },
    /// Final.
    Stop(ModelError),
}

impl Failure {
    /// A non-2xx answer with `status`: sent again when the status may pass
    /// ([`retryable_status`]), after `wait` when the server named one.
    pub fn of_status(status: StatusCode, error: ModelError, wait: Option<Duration>) -> Self {
        match retryable_status(status) {
            true => Failure::Retry { error, wait },
            false => Failure::Stop(error),
        }
    }

    /// An answer that failed as it was read: sent again when the failure
    /// may pass and none of its text was shown.
    pub fn of_read(error: ModelError, shown: &ShownText<'_>) -> Self {
        match error.retryable && !shown.any() {
            true => Failure::Retry { error, wait: None },
            false => Failure::Stop(error),
        }
    }
}

/// The caller's text deltas of one attempt, and whether any was shown:
/// after that, sending the call again would show its text twice.
pub struct ShownText<'a> {
    caller: Option<TextDeltas<'a>>,
    shown: AtomicBool,
}

impl<'a> ShownText<'a> {
    /// Nothing shown yet of an attempt whose text goes to `caller`.
    pub fn new(caller: Option<TextDeltas<'a>>) -> Self {
        Self {
            caller,
            shown: AtomicBool::new(false),
        }
    }

    /// Shows `text` to the caller, if it has a callback.
    pub fn show(&self, text: &str) {
        self.shown.store(true, Ordering::Relaxed);
        if let Some(caller) = self.caller {
            caller(text);
        }
    }

    /// Whether any text was shown.
    pub fn any(&self) -> bool {
        self.shown.load(Ordering::Relaxed)
    }
}

/// Runs `attempt` until it succeeds, fails for good, or `policy` or the
/// deadline says stop; `endpoint` names the server in the debug log.
pub async fn with_retries<T, F, Fut>(
    policy: RetryPolicy,
    deadline: Option<Instant>,
    endpoint: &str,
    mut attempt: F,
) -> Result<T, ModelError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Failure>>,
{
    let mut tried = 0;
    loop {
        let (error, asked) = match attempt().await {
            Ok(value) => return Ok(value),
            Err(Failure::Stop(error)) => return Err(error),
            Err(Failure::Retry { error, wait }) => (error, wait),
        };
        let wait = asked.unwrap_or_else(|| backoff(&policy, tried));
        let give_up = |why: String| {
            let mut error = error.clone();
            error
                .message
                .push_str(&format!("; {why}; resume the run later"));
            Err(error)
        };
        if tried >= policy.max_retries {
            // With no retries allowed the failure is as it came.
            return match tried {
                0 => Err(error),
                _ => give_up(format!("gave up after {} attempts", tried + 1)),
            };
        }
        if wait > policy.max_wait {
            return give_up(format!(
                "the server asks to wait {} s, more than the {} s the retry policy waits",
                wait.as_secs(),
                policy.max_wait.as_secs()
            ));
        }
        let past_deadline = deadline.is_some_and(|at| {
            Instant::now()
                .checked_add(wait)
                .is_none_or(|then| then >= at)
        });
        if past_deadline {
            return give_up(format!(
                "not retried: waiting {:.1} s would pass the run's deadline",
                wait.as_secs_f64()
            ));
        }
        tracing::debug!(
            attempt = tried,
            wait_ms = wait.as_millis() as u64,
            status = error.status,
            endpoint,
            "model call retried"
        );
        tokio::time::sleep(wait).await;
        tried += 1;
    }
}

/// The wait before retry `attempt` (from 0) when the server names none.
fn backoff(policy: &RetryPolicy, attempt: u32) -> Duration {
    policy
        .backoff
        .saturating_mul(1 << attempt.min(16))
        .min(policy.max_wait)
}

/// The server's `retry-after`, in seconds (an HTTP date is not used: the
/// backoff applies).
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    let seconds: f64 = value.parse().ok()?;
    (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds.min(1e9)))
}

#[cfg(test)]
mod tests {
    use reqwest::header::HeaderValue;

    use super::*;

    #[test]
    fn retry_after_is_read_in_seconds() {
        let mut headers = HeaderMap::new();
        for (value, expected) in [
            ("3", Some(Duration::from_secs(3))),
            (" 0.5 ", Some(Duration::from_millis(500))),
            ("-1", None),
            ("NaN", None),
            ("Wed, 21 Oct 2026 07:28:00 GMT", None),
        ] {
            headers.insert(RETRY_AFTER, HeaderValue::from_static(value));
            assert_eq!(retry_after(&headers), expected, "{value}");
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_longest_wait() {
        let policy = RetryPolicy::default();
        let waits: Vec<u64> = (0..8).map(|n| backoff(&policy, n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60]);
    }
}
