//! The facade's integration tests, one module per behaviour, linked into
//! one binary. The tests that kill or freeze processes re-run this binary
//! to execute one ignored worker test, named by its module path
//! (`turnstile_testkit::worker_test!`).

mod admission_model;
mod approval_crash;
mod crash_resume;
mod crash_torture;
mod delete_kill;
mod lease_takeover;
mod races;
mod reconcile_crash;
mod retention_kill;
mod session_admission;
mod session_ambiguity;
mod session_approvals;
mod session_budget;
mod session_delete_fork;
mod session_events;
mod session_fencing;
mod session_images;
mod session_leases;
mod session_lifecycle;
mod session_meta;
mod session_reasoning;
mod session_stream;
mod session_summary;
mod session_tool_faults;
