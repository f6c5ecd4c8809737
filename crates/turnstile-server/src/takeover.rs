//! Several servers on one database: each run holds a lease on its
//! admission, renewed while it drives; a server that dies (killed, frozen,
//! its machine gone) stops renewing, and once the lease expired another
//! server (or this one, restarted) takes the request over from its last
//! checkpoint with one compare-and-swap. A follower of the event log sees
//! the takeover as `run_started`, and every step once.

use tokio::sync::watch;
use turnstile_core::agent::RunContext;
use turnstile_core::checkpoint::CheckpointPhase;
use turnstile_core::session::{AgentSession, ResumePolicy};
use turnstile_core::store::ExpiredLease;
use turnstile_core::Error;

use crate::live::LiveText;
use crate::Server;

/// Expired leases taken over per look.
const PER_LOOK: u32 = 16;

/// Looks for expired leases every renewal interval until `closing` turns
/// true, and takes each request over in a task of the server's runs.
pub(crate) async fn take_over_expired(server: Server, mut closing: watch::Receiver<bool>) {
    let Some(policy) = server.lease else {
        return;
    };
    loop {
        tokio::select! {
            _ = closing.wait_for(|closed| *closed) => return,
            () = tokio::time::sleep(policy.renew_every()) => {}
        }
        let expired = match server.store.expired_leases(PER_LOOK).await {
            Ok(expired) => expired,
            Err(error) => {
                tracing::warn!(%error, "could not list expired leases; looking again later");
                continue;
            }
        };
        for lease in expired {
            let session = server.session(lease.namespace.clone(), lease.conversation_id);
            server
                .runs
                .spawn(take_over(session, server.live.clone(), lease));
        }
    }
}

async fn take_over(session: AgentSession, live: LiveText, lease: ExpiredLease) {
    let resume = |policy| {
        let run =
            session.resume_stream(lease.run_id, RunContext::default(), lease.revision, policy);
        live.drive(lease.conversation_id, lease.request_id, run)
    };
    let mut result = resume(ResumePolicy::RejectAmbiguous).await;
    // A turn whose model call was in flight is asked again: a model call
    // has no effect beyond its cost. A tool call in doubt is not run again
    // unless its tool settles it; the request waits for an operator.
    if let Err(Error::AmbiguousCheckpoint { .. }) = result {
        if model_call_in_doubt(&session, &lease).await {
            result = resume(ResumePolicy::RetryInterruptedTurn).await;
        }
    }
    let request_id = lease.request_id;
    match result {
        Ok(Some(outcome)) => {
            tracing::info!(%request_id, run_id = %outcome.run_id, "took over a request whose lease expired");
        }
        Ok(None) => {
            tracing::warn!(%request_id, "a takeover's event stream ended without its outcome");
        }
        // Another server (or the owner's own commit) got there first.
        Err(Error::Conflict { .. } | Error::Busy { .. } | Error::NotActive { .. }) => {}
        Err(error) => {
            tracing::warn!(%error, %request_id, "a request whose lease expired was not taken over");
        }
    }
}

/// Whether the run's last checkpoint is a turn's write-ahead: at most its
/// model call happened after it.
async fn model_call_in_doubt(session: &AgentSession, lease: &ExpiredLease) -> bool {
    matches!(
        session.store().latest_checkpoint(lease.run_id).await,
        Ok(Some(checkpoint)) if checkpoint.phase == CheckpointPhase::TurnInFlight
    )
}
