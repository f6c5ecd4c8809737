//! The SQLite backend's integration tests, one module per behaviour,
//! linked into one binary. `group_commit` is a binary of its own.

mod approval_faults;
mod claim_memory;
mod claim_window;
mod commit_errors;
mod concurrent_open;
mod conformance;
mod disk_full;
mod doctor_invariants;
mod durability;
mod faults;
mod fork_cost;
mod message_meta;
mod new_file;
mod stuck_order;
mod transcript_keys;
mod unreferenced_blobs;
