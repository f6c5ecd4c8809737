//! Several servers on one database: each run holds a lease on its
//! admission, renewed while it drives; a server that dies (killed, frozen,
//! its machine gone) stops renewing, and once the lease expired another
//! server (or this one, restarted) takes the request over from its last
//! checkpoint with one compare-and-swap. A follower of the event log sees
//! the takeover as `run_started`, and every step once.

use std::collections::HashSet;

use tokio::sync::{mpsc, watch};
use turnstile_core::agent::RunContext;
use turnstile_core::ids::{Revision, RunId};
use turnstile_core::session::{AgentSession, ResumePolicy};
use turnstile_core::store::ExpiredLease;
use turnstile_core::Error;

use crate::live::LiveText;
use crate::Server;

/// Expired leases taken over per look.
const PER_LOOK: u32 = 16;

/// A lease whose takeover was refused for a reason that stays (a tool call
/// in doubt, another agent, a spent budget): left to an operator, and not
/// tried again while it is listed as it was.
type Refused = (RunId, Revision);

/// Looks for expired leases every renewal interval until `closing` turns
/// true, and takes each request over in a task of the server's runs.
pub(crate) async fn take_over_expired(server: Server, mut closing: watch::Receiver<bool>) {
    let Some(policy) = server.lease else {
        return;
    };
    let (report, mut reports) = mpsc::unbounded_channel::<Refused>();
    let mut refused = HashSet::new();
    loop {
        tokio::select! {
            _ = closing.wait_for(|closed| *closed) => return,
            () = tokio::time::sleep(policy.renew_every()) => {}
        }
        while let Ok(lease) = reports.try_recv() {
            refused.insert(lease);
        }
        // Past the refused ones, which stay listed first (soonest expired).
        let limit = PER_LOOK.saturating_add(u32::try_from(refused.len()).unwrap_or(u32::MAX));
        let expired = match server.store.expired_leases(limit).await {
            Ok(expired) => expired,
            Err(error) => {
                tracing::warn!(%error, "could not list expired leases; looking again later");
                continue;
            }
        };
        refused.retain(|key| expired.iter().any(|l| (l.run_id, l.revision) == *key));
        for lease in expired {
            if refused.contains(&(lease.run_id, lease.revision)) {
                continue;
            }
            let session = server.session(lease.namespace.clone(), lease.conversation_id);
            let (live, report) = (server.live.clone(), report.clone());
            server.runs.spawn(take_over(session, live, lease, report));
        }
    }
}

async fn take_over(
    session: AgentSession,
    live: LiveText,
    lease: ExpiredLease,
    report: mpsc::UnboundedSender<Refused>,
) {
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
        Ok(Some(outcome)) => {
            tracing::info!(%request_id, run_id = %outcome.run_id, "took over a request whose lease expired");
        }
        Ok(None) => {
            tracing::warn!(%request_id, "a takeover's event stream ended without its outcome");
        }
        // Another server (or the owner's own commit) got there first.
        Err(Error::Conflict { .. } | Error::Busy { .. } | Error::NotActive { .. }) => {}
        // Looked at again later.
        Err(Error::Store(error)) if error.is_busy() || error.is_unreachable() => {
            tracing::warn!(%error, %request_id, "a takeover failed on the database; trying again later");
        }
        Err(error) => {
            tracing::warn!(%error, %request_id, "a request whose lease expired waits for an operator");
            let _ = report.send((lease.run_id, lease.revision));
        }
    }
}
