//! `--lease` of `run`, `resume` and `recover`, and the lease timings of
//! the runs `recover-expired` continues.

use std::time::Duration;

use clap::Args;

use super::exit::CliError;
use super::ops::parse_duration;
use turnstile::session::AgentSession;
use turnstile::LeasePolicy;

/// `--lease [--lease-renew D] [--lease-expire D]`.
#[derive(Args, Clone, Debug, Default)]
pub struct LeaseArgs {
    /// Hold a lease on the admission while the run drives, renewed on a
    /// timer. Once it expired (this process frozen or gone), `turnstile
    /// recover-expired` in any process may take the request over; this run,
    /// if it wakes, is then fenced (exit 5).
    #[arg(long)]
    pub lease: bool,
    #[command(flatten)]
    pub timing: LeaseTiming,
}

/// How often a lease is renewed and how long a renewal holds it.
#[derive(Args, Clone, Debug, Default)]
pub struct LeaseTiming {
    /// How often the lease is renewed (default 10s, or a third of
    /// --lease-expire).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub lease_renew: Option<Duration>,
    /// How long after a renewal the lease expires (default 30s, or three
    /// times --lease-renew). Longer than --lease-renew.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub lease_expire: Option<Duration>,
}

impl LeaseArgs {
    /// The lease `--lease` asks for, or none.
    ///
    /// # Errors
    /// [`CliError::Usage`] for a timing without `--lease`, or one
    /// [`LeasePolicy::new`] refuses.
    pub(super) fn policy(&self) -> Result<Option<LeasePolicy>, CliError> {
        let timed = self.timing.lease_renew.is_some() || self.timing.lease_expire.is_some();
        match (self.lease, timed) {
            (true, _) => self.timing.policy().map(Some),
            (false, true) => Err(CliError::Usage(
                "--lease-renew and --lease-expire need --lease".into(),
            )),
            (false, false) => Ok(None),
        }
    }
}

impl LeaseTiming {
    /// The policy, one missing duration derived from the other in the
    /// ratio of the library's defaults (1 : 3).
    ///
    /// # Errors
    /// [`CliError::Usage`] unless `0 < renew < expire`.
    pub(super) fn policy(&self) -> Result<LeasePolicy, CliError> {
        let defaults = LeasePolicy::default();
        let (renew, expire) = match (self.lease_renew, self.lease_expire) {
            (None, None) => (defaults.renew_every(), defaults.ttl()),
            (Some(renew), None) => (renew, renew.saturating_mul(3)),
            (None, Some(expire)) => (expire / 3, expire),
            (Some(renew), Some(expire)) => (renew, expire),
        };
        LeasePolicy::new(renew, expire).map_err(|_| {
            CliError::Usage(format!(
                "a lease must be renewed more often than it expires: --lease-renew {} \
                 and --lease-expire {} (both above zero)",
                humantime::format_duration(renew),
                humantime::format_duration(expire)
            ))
        })
    }
}

/// `session`, holding `lease` when there is one.
pub(super) fn leased(session: AgentSession, lease: Option<LeasePolicy>) -> AgentSession {
    match lease {
        Some(policy) => session.with_lease(policy),
        None => session,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(renew: Option<u64>, expire: Option<u64>) -> LeaseTiming {
        LeaseTiming {
            lease_renew: renew.map(Duration::from_secs),
            lease_expire: expire.map(Duration::from_secs),
        }
    }

    #[test]
    fn a_missing_duration_follows_the_other_in_the_default_ratio() {
        let policy = |renew, expire| timing(renew, expire).policy().unwrap();
        assert_eq!(policy(None, None), LeasePolicy::default());
        assert_eq!(policy(Some(2), None).ttl(), Duration::from_secs(6));
        assert_eq!(policy(None, Some(9)).renew_every(), Duration::from_secs(3));
        assert!(matches!(
            timing(Some(5), Some(5)).policy(),
            Err(CliError::Usage(_))
        ));
        assert!(matches!(
            timing(Some(0), None).policy(),
            Err(CliError::Usage(_))
        ));
    }

    #[test]
    fn timings_need_the_lease_flag() {
        let args = LeaseArgs {
            lease: false,
            timing: timing(Some(1), None),
        };
        assert!(matches!(args.policy(), Err(CliError::Usage(_))));
        assert_eq!(LeaseArgs::default().policy().unwrap(), None);
    }
}
