//! The floors `turnstile bench` measures the store against, in the same
//! run on the same kind of database: bare commits through a plain sqlx
//! connection, with no store around them. Plain runtime SQL: this is the
//! yardstick, not the store. The command turns the samples into its
//! report; here is only what touches the database.

pub mod postgres;
pub mod sqlite;

use std::time::Duration;

/// A floor that could not be measured, in words (never a password).
#[derive(Debug)]
pub struct BaselineError(String);

impl BaselineError {
    fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

impl std::fmt::Display for BaselineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BaselineError {}

/// Timed commits: each one's latency, and the wall time of them all.
#[derive(Debug)]
pub struct Commits {
    /// One per commit, in the order they finished.
    pub latencies: Vec<Duration>,
    /// From the first commit's start to the last one's end.
    pub wall: Duration,
}
