//! Several servers on one database: each run holds a lease on its
//! admission, renewed while it drives; a server that dies (killed, frozen,
//! its machine gone) stops renewing, and once the lease expired another
//! server (or this one, restarted) takes the request over from its last
//! checkpoint with one compare-and-swap. A follower of the event log sees
//! the takeover as `run_started`, and every step once.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use turnstile_core::agent::RunContext;
use turnstile_core::ids::{Revision, RunId};
use turnstile_core::session::{AgentSession, ResumePolicy};
use turnstile_core::store::ExpiredLease;
use turnstile_core::Error;

use crate::live::LiveEvents;
use crate::Server;

/// Expired leases taken over per look.
const PER_LOOK: u32 = 16;

/// How long a takeover refused for a reason that stays (a tool call in
/// doubt, another agent, a spent budget) is left to an operator before
/// this server tries it again.
const REFUSED_FOR: Duration = Duration::from_secs(300);

/// A lease as listed: the run that held it, at its revision.
type Lease = (RunId, Revision);

/// Looks for expired leases every renewal interval until `closing` turns
/// true, and takes each request over in a task of the server's runs; one
/// takeover per lease at a time.
pub(crate) async fn take_over_expired(server: Server, mut closing: watch::Receiver<bool>) {
    let Some(policy) = server.lease else {
        return;
    };
    let (report, mut reports) = mpsc::unbounded_channel();
    let mut under_way: HashSet<Lease> = HashSet::new();
    let mut refused: HashMap<Lease, Instant> = HashMap::new();
    loop {
        tokio::select! {
            _ = closing.wait_for(|closed| *closed) => return,
            () = tokio::time::sleep(policy.renew_every()) => {}
        }
        while let Ok((lease, taken)) = reports.try_recv() {
            under_way.remove(&lease);
            if let Taken::Refused = taken {
                refused.insert(lease, Instant::now());
            }
        }
        refused.retain(|_, at| at.elapsed() < REFUSED_FOR);
        // Past the ones skipped, which stay listed first (soonest expired).
        let skipped = u32::try_from(under_way.len() + refused.len()).unwrap_or(u32::MAX);
        let expired = match server
            .store
            .expired_leases(PER_LOOK.saturating_add(skipped))
            .await
        {
            Ok(expired) => expired,
            Err(error) => {
                tracing::warn!(%error, "could not list expired leases; looking again later");
                continue;
            }
        };
        for lease in expired {
            let key = (lease.run_id, lease.revision);
            if under_way.contains(&key) || refused.contains_key(&key) {
                continue;
            }
            under_way.insert(key);
            let session = server.session(lease.namespace.clone(), lease.conversation_id);
            let (live, report) = (server.live.clone(), report.clone());
            server.runs.spawn(async move {
                let taken = take_over(session, live, &lease).await;
                let _ = report.send((key, taken));
            });
        }
    }
}

/// How a takeover ended, told to the loop with its lease.
enum Taken {
    Ended,
    /// For a reason that stays: left to an operator for a while.
    Refused,
}

async fn take_over(session: AgentSession, live: LiveEvents, lease: &ExpiredLease) -> Taken {
    // A model call that was in flight is asked again; a tool call in doubt
    // runs again only when its tool settles it. Both judged in the claim's
    // own transaction, so an owner that wakes meanwhile cannot slip a tool
    // call in between.
    let run = session.resume_stream(
        lease.run_id,
        RunContext::default(),
        lease.revision,
        ResumePolicy::RetryModelCall,
    );
    let request_id = lease.request_id;
    match live.drive(lease.conversation_id, request_id, run).await {
        Ok(outcome) => {
            let run_id = outcome.map(|o| o.run_id.to_string()).unwrap_or_default();
            tracing::info!(%request_id, %run_id, "took over a request whose lease expired");
            Taken::Ended
        }
        // Another server (or the owner's own commit) got there first.
        Err(Error::Conflict { .. } | Error::Busy { .. } | Error::NotActive { .. }) => Taken::Ended,
        // Reasons that stay: an operator decides.
        Err(
            error @ (Error::AmbiguousCheckpoint { .. }
            | Error::ToolInDoubt { .. }
            | Error::ConfigurationMismatch { .. }
            | Error::BudgetExceeded { .. }
            | Error::SummaryPassLimitExceeded { .. }
            | Error::Corrupt { .. }),
        ) => {
            tracing::warn!(%error, %request_id, "a request whose lease expired waits for an operator");
            Taken::Refused
        }
        // Anything else (the database, the model) is tried again.
        Err(error) => {
            tracing::warn!(%error, %request_id, "a takeover failed; trying again later");
            Taken::Ended
        }
    }
}
