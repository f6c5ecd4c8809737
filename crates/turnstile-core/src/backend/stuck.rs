//! The rule of a stuck admission, for backends that judge it in Rust.

use crate::store::RunStatus;

/// Whether an admission held by a run of `status`, for a request that
/// `awaiting_approval` or not, last changed at `updated_at`, with the lease
/// `lease_expires_at`, is stuck at `now` with activity older than `cutoff`
/// counting as stale (see [the admin module](crate::admin#stuck-admissions)):
/// never while it awaits approval. A backend that selects stuck admissions
/// in SQL says the same there.
pub fn is_stuck(
    status: Option<RunStatus>,
    awaiting_approval: bool,
    updated_at: i64,
    lease_expires_at: Option<i64>,
    cutoff: i64,
    now: i64,
) -> bool {
    if awaiting_approval {
        return false;
    }
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
        assert!(is_stuck(Some(RunStatus::Failed), false, 1_000, None, 0, 0));
        assert!(is_stuck(None, false, 1_000, None, 0, 0));
        assert!(!is_stuck(
            Some(RunStatus::Running),
            false,
            1_000,
            None,
            1_000,
            0
        ));
        assert!(is_stuck(
            Some(RunStatus::Running),
            false,
            999,
            None,
            1_000,
            0
        ));
    }

    #[test]
    fn a_running_owner_with_a_lease_is_stuck_only_once_it_expired() {
        // Stale activity does not matter while the lease holds …
        assert!(!is_stuck(
            Some(RunStatus::Running),
            false,
            0,
            Some(5_000),
            1_000,
            4_999
        ));
        // … fresh activity does not save an expired lease.
        assert!(is_stuck(
            Some(RunStatus::Running),
            false,
            9_000,
            Some(5_000),
            1_000,
            5_001
        ));
        assert!(is_stuck(
            Some(RunStatus::Failed),
            false,
            9_000,
            Some(9_999),
            1_000,
            0
        ));
    }

    #[test]
    fn an_admission_awaiting_approval_is_never_stuck() {
        assert!(!is_stuck(Some(RunStatus::Failed), true, 0, None, 1_000, 0));
        assert!(!is_stuck(None, true, 0, Some(0), 1_000, 5_000));
        assert!(is_stuck(Some(RunStatus::Failed), false, 0, None, 1_000, 0));
    }
}
