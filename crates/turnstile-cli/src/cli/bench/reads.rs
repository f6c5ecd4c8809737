//! The read latencies, timed one at a time after the workload on the
//! sampled committed requests: the latest checkpoint of the committing run
//! (what a resume reads first), and a replay (the same request id and input
//! again, answered from the database with no model work).

use std::sync::Arc;
use std::time::Instant;

use super::report::WorkloadParams;
use super::stats::Latency;
use super::text::{self, Role};
use super::workload::{self, Committed};
use crate::cli::exit::CliError;
use turnstile::agent::RunContext;
use turnstile::checkpoint::CheckpointPhase;
use turnstile::store::Store;

/// `Store::latest_checkpoint` of each sampled run, which must be the
/// `completed` checkpoint its commit wrote.
pub(super) async fn latest_checkpoints(
    store: &dyn Store,
    samples: &[Committed],
) -> Result<Latency, CliError> {
    let mut latencies = Vec::with_capacity(samples.len());
    for sample in samples {
        let started = Instant::now();
        let checkpoint = store.latest_checkpoint(sample.run_id).await?;
        latencies.push(started.elapsed());
        if checkpoint.map(|c| c.phase) != Some(CheckpointPhase::Completed) {
            return Err(CliError::Failed(format!(
                "run {} has no completed checkpoint",
                sample.run_id
            )));
        }
    }
    Ok(Latency::of(latencies))
}

/// `AgentSession::run` of each sampled request again, which must replay the
/// answer it committed.
pub(super) async fn replays(
    store: &Arc<dyn Store>,
    samples: &[Committed],
    params: &WorkloadParams,
) -> Result<Latency, CliError> {
    let namespace = workload::namespace()?;
    let bytes = params.message_bytes as usize;
    let mut latencies = Vec::with_capacity(samples.len());
    for sample in samples {
        let input = workload::input(
            sample.conversation,
            sample.turn,
            bytes,
            params.image_bytes as usize,
        )?;
        let answer = text::message(sample.conversation, sample.turn, Role::Assistant, bytes);
        let session = workload::session(store, sample.conversation_id, &namespace, answer.clone());
        let started = Instant::now();
        let outcome = session
            .run(sample.request_id, input, RunContext::default())
            .await?;
        latencies.push(started.elapsed());
        if !outcome.replayed || outcome.final_text != answer {
            return Err(CliError::Failed(format!(
                "request {} was not replayed with its stored answer",
                sample.request_id
            )));
        }
    }
    Ok(Latency::of(latencies))
}
