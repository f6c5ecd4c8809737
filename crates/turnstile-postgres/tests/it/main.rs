//! The PostgreSQL backend's integration tests, one module per behaviour,
//! linked into one binary; each test process starts its own throwaway
//! server (`turnstile-test-postgres`). The tests that kill processes re-run
//! this binary to execute one ignored worker test, named by its module path
//! (`turnstile_testkit::worker_test!`). `races` is a binary of its own.

mod abandon_race;
mod conformance;
mod connect;
mod crash_torture;
mod folded_row_race;
mod fork_cost;
mod lease_takeover;
mod migrate_0019;
mod migrate_0027;
mod migrate_0028;
mod server_crash;
mod sessions;
mod stuck_order;
mod terminate_backends;
