//! Opt-in leases (issue 17): while a run of a session with a
//! [`LeasePolicy`] drives, it renews its admission's lease on a timer; a
//! held admission whose lease expired is taken over by [`recover_expired`].

use std::future::Future;
use std::time::Duration;

use super::{AgentSession, ResumePolicy};
use crate::agent::RunContext;
use crate::backend::now_ms;
use crate::error::Error;
use crate::outcome::Outcome;
use crate::store::{ExpiredLease, Fence, Store};

/// How often a live owner renews its lease, and for how long each renewal
/// holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeasePolicy {
    renew_every: Duration,
    ttl: Duration,
}

impl LeasePolicy {
    /// Renews every `renew_every`; each renewal holds the lease for `ttl`.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] unless `0 < renew_every < ttl`: a lease must
    /// outlive the interval between two renewals.
    pub fn new(renew_every: Duration, ttl: Duration) -> Result<Self, Error> {
        if renew_every.is_zero() || ttl <= renew_every {
            return Err(Error::InvalidInput(format!(
                "a lease needs 0 < renew_every < ttl (got {renew_every:?} and {ttl:?})"
            )));
        }
        Ok(Self { renew_every, ttl })
    }

    /// How often the owner renews.
    pub fn renew_every(&self) -> Duration {
        self.renew_every
    }

    /// How long each renewal holds the lease.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn ttl_ms(&self) -> i64 {
        i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX)
    }
}

impl Default for LeasePolicy {
    /// Renew every 10 s, expire after 30 s.
    fn default() -> Self {
        Self {
            renew_every: Duration::from_secs(10),
            ttl: Duration::from_secs(30),
        }
    }
}

impl AgentSession {
    /// Runs of this session (fresh, resumed, recovered) hold a lease on
    /// their admission: renewed right after the claim, then every
    /// `policy.renew_every`, until the run ends in any way. Stuck detection
    /// (`ls --stuck`, `doctor`) then goes by the lease, and another process
    /// may take the request over with [`recover_expired`] once the lease
    /// expired.
    ///
    /// A renewal that is [`Error::Fenced`] (another owner took over) stops
    /// the run with that error, at the latest one `renew_every` later (the
    /// run's own commit may be landing, and wins if it does). A renewal that
    /// fails otherwise is logged and retried until the lease it last set
    /// would have expired; then the run stops with that error. Between the
    /// claim and the first renewal the admission has no lease: it is judged
    /// by its activity time meanwhile.
    pub fn with_lease(mut self, policy: LeasePolicy) -> Self {
        self.lease = Some(policy);
        self
    }

    /// `work` (a run that owns `fence`) with its lease renewed alongside,
    /// when the session has a lease policy.
    pub(super) async fn leased<T>(
        &self,
        fence: Fence,
        work: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let Some(policy) = self.lease else {
            return work.await;
        };
        let renewals = renewals(self.store.as_ref(), fence, policy);
        tokio::pin!(work, renewals);
        tokio::select! {
            biased;
            done = &mut work => done,
            stop = &mut renewals => {
                match tokio::time::timeout(policy.renew_every, work).await {
                    Ok(done) => done,
                    Err(_) => Err(stop),
                }
            }
        }
    }
}

/// Renews the lease of `fence` until it must stop: returns why.
async fn renewals(store: &dyn Store, fence: Fence, policy: LeasePolicy) -> Error {
    // Until the first renewal the claim's own activity stands for the lease.
    let mut held_until = now_ms().saturating_add(policy.ttl_ms());
    loop {
        let expires_at = now_ms().saturating_add(policy.ttl_ms());
        match store.renew_lease(&fence, expires_at).await {
            Ok(()) => held_until = expires_at,
            Err(e @ Error::Fenced { .. }) => return e,
            Err(e) if now_ms() >= held_until => return e,
            Err(e) => {
                tracing::warn!(error = %e, run_id = %fence.run_id, "lease renewal failed; retrying");
            }
        }
        tokio::time::sleep(policy.renew_every).await;
    }
}

/// What [`recover_expired`] did with one expired lease.
#[derive(Debug)]
pub struct Recovery {
    /// The lease that had expired: the request and run taken over.
    pub lease: ExpiredLease,
    /// The recovered request's outcome, or why it was not recovered:
    /// [`Error::Conflict`], [`Error::Busy`] or [`Error::NotActive`] when
    /// another recoverer (or the owner's own commit) got there first,
    /// [`Error::InvalidInput`] when `agent_for` gave a session of another
    /// conversation, or any error of [`AgentSession::resume_run`].
    pub result: Result<Outcome, Error>,
}

/// Takes over requests whose lease expired: up to `limit` of them, listed
/// with [`Store::expired_leases`], each claimed with one compare-and-swap at
/// the revision read (a recoverer that loses the race to another gets
/// [`Error::Conflict`] for that request and goes on) and continued from its
/// latest checkpoint, as [`AgentSession::resume_run`] does: the request's
/// input and messages come from the store. One after another, in the order
/// the leases expired.
///
/// `agent_for` gives the session to continue a request with (the same
/// agent it was admitted with, or the claim is refused with
/// [`Error::ConfigurationMismatch`]); `None` leaves the request alone. Give
/// the sessions a lease ([`AgentSession::with_lease`]) so the recovered
/// runs hold one in turn.
///
/// # Errors
/// Only the listing's: each request's result is in its [`Recovery`].
pub async fn recover_expired(
    store: &dyn Store,
    agent_for: impl Fn(&ExpiredLease) -> Option<AgentSession>,
    ctx: RunContext,
    policy: ResumePolicy,
    limit: u32,
) -> Result<Vec<Recovery>, Error> {
    let mut recoveries = Vec::new();
    for lease in store.expired_leases(limit).await? {
        let Some(session) = agent_for(&lease) else {
            continue;
        };
        let result = match session.conversation_id() == lease.conversation_id {
            true => {
                session
                    .resume_run(lease.run_id, ctx.clone(), lease.revision, policy)
                    .await
            }
            false => Err(Error::InvalidInput(format!(
                "the session for conversation {} drives conversation {}",
                lease.conversation_id,
                session.conversation_id()
            ))),
        };
        recoveries.push(Recovery { lease, result });
    }
    Ok(recoveries)
}
