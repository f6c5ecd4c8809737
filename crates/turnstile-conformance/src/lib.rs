//! The store contract as a test suite: every behaviour of
//! [`Store`](turnstile_core::Store) and
//! [`StoreAdmin`](turnstile_core::admin::StoreAdmin), written once as
//! functions over a shared store and instantiated by each backend's tests
//! with [`suite!`]:
//!
//! ```ignore
//! turnstile_conformance::suite!(in_memory, async {
//!     let store = MyStore::in_memory().await.expect("open");
//!     (store, ()) // the store, and whatever must outlive it
//! });
//! ```
//!
//! A new backend proves itself by adding that one file to its tests.

pub mod activity;
pub mod admin;
pub mod admission;
pub mod approvals;
pub mod blobs;
pub mod budgets;
pub mod claim_memory;
pub mod concurrency;
pub mod deletion;
pub mod event_log;
pub mod fencing;
pub mod fork;
pub mod leases;
pub mod lifecycle;
pub mod logs;
pub mod meta;
pub mod parts;
pub mod retention;
pub mod retention_policy;
pub mod stuck_order;
pub mod summaries;
pub mod support;
pub mod tokens;

/// Instantiates every behaviour of the suite as a `#[tokio::test]` in a
/// module named `$backend`. `$open` is an expression (evaluated once per
/// test) of a future yielding `(store, keep)`: a store implementing
/// `StoreAdmin`, and a value that must outlive it (a temp dir, a server).
/// The calling crate needs `tokio` with `macros` and `rt-multi-thread`.
#[macro_export]
macro_rules! suite {
    ($backend:ident, $open:expr) => {
        mod $backend {
            #[allow(unused_imports)]
            use super::*;

            $crate::cases!($open;
    activity::each_owner_step_refreshes_the_held_admissions_activity_time,

    admission::ensure_conversation_is_idempotent_and_starts_idle,
    admission::conversation_in_another_namespace_is_a_namespace_mismatch,
    admission::unknown_conversation_is_not_found,
    admission::claim_context_reads_what_the_single_reads_read_and_only_what_a_claim_uses,
    admission::claim_on_idle_conversation_admits_and_bumps_revision,
    admission::second_claim_by_another_request_is_busy_with_current_holder,
    admission::same_request_claimed_again_returns_existing_and_writes_nothing,
    admission::claim_with_stale_revision_conflicts_and_changes_nothing,
    admission::recovery_claim_moves_admission_to_a_new_run,
    admission::recovery_claim_with_stale_revision_conflicts_and_changes_nothing,
    admission::recovery_claim_refuses_a_turn_in_flight_unless_its_tool_round_is_resolved,
    admission::recovery_claim_that_retries_a_model_call_takes_a_turn_in_flight,
    admission::abandon_with_stale_revision_is_refused_and_changes_nothing,
    admission::abandon_releases_admission_and_burns_request,
    claim_memory::a_next_request_claimed_from_memory_sees_what_a_read_shows_whatever_changed,
    claim_memory::a_claim_naming_another_creation_time_conflicts_and_writes_nothing,
    fencing::turn_writes_of_a_replaced_owner_are_fenced_and_write_nothing,
    fencing::commit_of_a_replaced_owner_is_fenced_and_writes_nothing,
    fencing::owner_writes_after_commit_or_abandon_are_fenced,
    lifecycle::request_with_tool_turns_commits_to_transcript_and_releases,
    lifecycle::successive_commits_append_to_the_transcript_in_order,
    lifecycle::a_held_requests_messages_are_in_no_transcript_read_until_its_commit,
    lifecycle::a_first_run_with_the_requests_id_reads_as_one_with_its_own,
    lifecycle::a_claims_first_turn_and_its_reports_read_back_with_either_run_id,
    lifecycle::a_commit_with_or_without_reports_or_an_earlier_turn_reads_back_the_same,
    lifecycle::hostile_strings_round_trip_verbatim_through_commit,
    event_log::a_request_logs_each_step_once_in_order_and_reads_page_by_page,
    event_log::refused_steps_log_nothing,
    event_log::stops_approvals_takeovers_and_abandons_are_logged,
    event_log::pruned_and_deleted_events_go_with_their_rows_and_no_number_returns,
    parts::parts_reasoning_and_provider_metadata_round_trip_byte_exact,
    blobs::images_and_files_round_trip_exactly_and_reads_leave_their_bytes_unread,
    blobs::one_image_in_a_hundred_requests_and_a_fork_is_stored_once_until_its_last_reference_goes,
    blobs::prune_removes_a_blob_with_its_last_reference_and_keeps_a_named_one,
    blobs::a_part_over_the_limit_or_naming_unstored_bytes_is_refused_and_writes_nothing,
    blobs::a_tool_result_with_an_image_is_journaled_whole_and_its_blob_follows_the_result,
    concurrency::concurrent_claims_at_one_revision_admit_exactly_one,
    concurrency::concurrent_recovery_claims_at_one_revision_admit_exactly_one,
    summaries::summary_pass_that_does_not_fit_the_transcript_conflicts_and_changes_nothing,
    summaries::summary_commit_at_a_stale_version_or_for_another_pass_conflicts_and_changes_nothing,
    summaries::summary_commit_counts_once_and_a_repeat_after_a_lost_acknowledgement_returns_the_stored_row,
    summaries::summary_writes_of_a_replaced_owner_are_fenced_and_write_nothing,
    summaries::latest_summary_is_the_newest_with_its_through_seq,
    summaries::abandon_clears_the_pass_in_flight_and_keeps_the_committed_summaries,
    admin::conversation_listing_is_newest_first_filtered_and_limited,
    admin::request_listing_is_newest_first_filtered_and_limited,
    admin::run_listing_is_newest_first_filtered_and_limited,
    admin::summaries_of_unknown_ids_are_none_and_of_known_ones_match_the_listings,
    admin::stuck_only_lists_a_failed_owner_and_a_running_one_only_once_stale,
    admin::doctor_on_a_healthy_store_reports_integrity_and_admission_counts,
    admin::storage_reports_bytes_in_use_that_grow_with_commits,
    retention::prune_deletes_what_no_replay_needs_and_a_completed_request_still_replays,
    retention::prune_dry_run_counts_exactly_and_deletes_nothing,
    retention::prune_spares_requests_finished_within_older_than_and_filters_by_status,
    retention::prune_with_transcripts_deletes_idle_conversations_whole_and_spares_held_ones,
    approvals::await_approval_settles_the_turn_and_lists_the_awaiting_call,
    approvals::a_request_awaiting_approval_is_held_but_not_stuck_and_counted_apart,
    approvals::await_approval_of_a_replaced_owner_or_an_unknown_call_writes_nothing,
    approvals::a_decision_moves_the_revision_on_and_is_journaled_with_its_time,
    approvals::a_refused_decision_writes_nothing,
    approvals::concurrent_decisions_on_one_call_let_exactly_one_win,
    approvals::pending_approvals_leave_out_answered_calls_and_released_requests,
    approvals::claim_stores_the_deadline_and_every_read_of_the_request_returns_it,
    budgets::claim_stores_the_budget_and_every_read_of_the_request_returns_it,
    budgets::recovery_claim_with_a_budget_change_records_it_and_the_request_keeps_it,
    approvals::recovery_claim_with_another_fingerprint_records_the_agent_change,
    approvals::prune_deletes_the_approvals_of_finished_requests,
    approvals::a_decision_waits_while_a_run_of_the_request_goes_on,
    retention_policy::keep_last_requests_spares_the_newest_requests_of_each_conversation,
    retention_policy::keep_last_requests_counts_a_held_request_among_the_newest,
    retention_policy::a_retention_policy_prunes_each_status_at_its_own_age_and_idle_conversations_whole,
    retention_policy::the_retention_task_applies_its_policy_on_a_timer_until_stopped,
    deletion::delete_removes_every_row_and_leaves_tombstones_of_the_id_and_its_requests,
    deletion::run_ids_of_a_deleted_conversation_answer_deleted_and_pruned_ones_are_unknown,
    deletion::a_deleted_request_id_in_a_new_conversation_is_refused_and_creates_nothing,
    deletion::a_refused_delete_changes_nothing,
    deletion::owner_writes_after_a_delete_are_fenced_and_resurrect_nothing,
    deletion::a_claim_racing_a_delete_either_wins_whole,
    fork::fork_at_every_boundary_copies_the_prefix_or_refuses_a_cut_inside_a_tool_round,
    fork::fork_to_a_taken_id_or_from_a_missing_conversation_is_refused,
    fork::fork_of_a_busy_conversation_copies_its_committed_history_and_the_latest_summary_within_the_cut,
    fork::a_fork_and_its_source_take_requests_independently,
    leases::a_renewal_sets_the_lease_and_moves_neither_the_revision_nor_the_activity_time,
    leases::a_renewal_by_a_replaced_or_finished_owner_is_fenced_and_writes_nothing,
    leases::expired_leases_lists_only_expired_leases_of_running_owners_soonest_first,
    leases::stuck_goes_by_the_lease_when_the_owner_holds_one,
    leases::a_recovery_claim_a_commit_and_an_abandon_each_drop_the_lease,
    meta::metadata_is_set_read_and_versioned_apart_from_the_admission,
    meta::a_stale_meta_version_conflicts_and_writes_nothing,
    meta::metadata_set_at_creation_creates_the_conversation_idle,
    meta::metadata_out_of_bounds_is_refused_naming_the_bound_and_writes_nothing,
    meta::metadata_of_another_namespace_is_a_namespace_mismatch,
    meta::conversation_listing_filters_by_owner_metadata_and_times,
    meta::pages_walk_every_conversation_once_newest_first,
    meta::pages_stay_stable_while_conversations_are_created,
    tokens::a_token_stands_for_its_namespace_until_revoked_and_its_secret_is_not_kept,
            );
        }
    };
}

/// One `#[tokio::test]` per `module::behaviour`, used by [`suite!`].
#[macro_export]
macro_rules! cases {
    ($open:expr; $($module:ident :: $name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() -> $crate::support::TestResult {
                let (store, _keep) = $open.await;
                $crate::$module::$name(::std::sync::Arc::new(store)).await
            }
        )*
    };
}
