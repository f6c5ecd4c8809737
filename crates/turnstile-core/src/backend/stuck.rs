//! The rule of a stuck admission, for backends that judge it in Rust.

use crate::store::RunStatus;

/// Whether an admission held by a run of `status`, last changed at
/// `updated_at`, with the lease `lease_expires_at`, is stuck at `now` with
/// activity older than `cutoff` counting as stale (see [the admin module](crate::admin#stuck-admissions)). A
/// backend that selects stuck admissions in SQL says the same there.
pub fn is_stuck(
    status: Option<RunStatus>,
    updated_at: i64,
    lease_expires_at: Option<i64>,
    cutoff: i64,
    now: i64,
) -> bool {
    match (status, lease_expires_at) {
        (Some(RunStatus::Running), Some(lease)) => lease < now,
        (Some(RunStatus::Running), None) => updated_at < cutoff,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_or_unknown_owners_are_stuck_and_running_ones_only_when_stale() {
        assert!(is_stuck(Some(RunStatus::Failed), 1_000, None, 0, 0));
        assert!(is_stuck(None, 1_000, None, 0, 0));
        assert!(!is_stuck(Some(RunStatus::Running), 1_000, None, 1_000, 0));
        assert!(is_stuck(Some(RunStatus::Running), 999, None, 1_000, 0));
    }

    #[test]
    fn a_running_owner_with_a_lease_is_stuck_only_once_it_expired() {
        // Stale activity does not matter while the lease holds …
        assert!(!is_stuck(
            Some(RunStatus::Running),
            0,
            Some(5_000),
            1_000,
            4_999
        ));
        // … fresh activity does not save an expired lease.
        assert!(is_stuck(
            Some(RunStatus::Running),
            9_000,
            Some(5_000),
            1_000,
            5_001
        ));
        assert!(is_stuck(
            Some(RunStatus::Failed),
            9_000,
            Some(9_999),
            1_000,
            0
        ));
    }
}
