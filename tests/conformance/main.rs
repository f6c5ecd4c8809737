//! The store conformance suite: the contract of `Store`, written once as
//! generic functions over `Arc<dyn Store>` and run against every backend
//! (in-memory SQLite and a SQLite file here; PostgreSQL later).

#[path = "../store_support/mod.rs"]
mod support;

mod admission;
mod concurrency;
mod fencing;
mod lifecycle;

use std::sync::Arc;

use tempfile::TempDir;
use turnstile::{SqliteStore, Store};

/// A store under test and whatever must outlive it.
struct Backend {
    store: Arc<dyn Store>,
    _dir: Option<TempDir>,
}

impl Backend {
    async fn in_memory() -> Backend {
        let store = SqliteStore::in_memory()
            .await
            .expect("open in-memory store");
        Backend {
            store: Arc::new(store),
            _dir: None,
        }
    }

    async fn file() -> Backend {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(dir.path().join("conformance.db"))
            .await
            .expect("open file store");
        Backend {
            store: Arc::new(store),
            _dir: Some(dir),
        }
    }
}

/// Instantiates every suite function once per backend, as
/// `<backend>::<behaviour>`.
macro_rules! conformance {
    ($($module:ident :: $name:ident),* $(,)?) => {
        mod in_memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() -> crate::support::TestResult {
                    let backend = crate::Backend::in_memory().await;
                    crate::$module::$name(backend.store.clone()).await
                }
            )*
        }

        mod file {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() -> crate::support::TestResult {
                    let backend = crate::Backend::file().await;
                    crate::$module::$name(backend.store.clone()).await
                }
            )*
        }
    };
}

conformance!(
    admission::ensure_conversation_is_idempotent_and_starts_idle,
    admission::conversation_in_another_namespace_is_a_namespace_mismatch,
    admission::unknown_conversation_is_not_found,
    admission::claim_on_idle_conversation_admits_and_bumps_revision,
    admission::second_claim_by_another_request_is_busy_with_current_holder,
    admission::same_request_claimed_again_returns_existing_and_writes_nothing,
    admission::claim_with_stale_revision_conflicts_and_changes_nothing,
    admission::recovery_claim_moves_admission_to_a_new_run,
    admission::recovery_claim_with_stale_revision_conflicts_and_changes_nothing,
    admission::abandon_with_stale_revision_is_refused_and_changes_nothing,
    admission::abandon_releases_admission_and_burns_request,
    fencing::turn_writes_of_a_replaced_owner_are_fenced_and_write_nothing,
    fencing::commit_of_a_replaced_owner_is_fenced_and_writes_nothing,
    fencing::owner_writes_after_commit_or_abandon_are_fenced,
    lifecycle::request_with_tool_turns_commits_to_transcript_and_releases,
    lifecycle::successive_commits_append_to_the_transcript_in_order,
    lifecycle::hostile_strings_round_trip_verbatim_through_commit,
    concurrency::concurrent_claims_at_one_revision_admit_exactly_one,
    concurrency::concurrent_recovery_claims_at_one_revision_admit_exactly_one,
);
