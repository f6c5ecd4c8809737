//! Latency percentiles, by the nearest-rank method: every figure is a
//! latency that was actually measured.

use std::time::Duration;

use serde::Serialize;

/// Percentiles of a set of latencies, in milliseconds.
#[derive(Clone, Copy, Debug, Serialize)]
pub(super) struct Latency {
    pub samples: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

impl Latency {
    pub(super) fn of(mut latencies: Vec<Duration>) -> Self {
        latencies.sort_unstable();
        let at = |p: f64| {
            // Nearest rank: the smallest value with at least p of the set at
            // or below it. The workload always has a sample; an empty set
            // reads as zero rather than failing.
            let rank = (p * latencies.len() as f64).ceil() as usize;
            let value = latencies.get(rank.saturating_sub(1)).copied();
            value.unwrap_or_default().as_secs_f64() * 1_000.0
        };
        Self {
            samples: latencies.len(),
            p50_ms: at(0.50),
            p99_ms: at(0.99),
        }
    }
}
