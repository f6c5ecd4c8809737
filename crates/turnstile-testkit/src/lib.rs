//! Test support shared by the turnstile crates' integration tests; not
//! published.
//!
//! - [`tools`]: the tool doubles (an echo, tools that count, block, stall,
//!   cancel, fail or panic, and an effect tool whose side effect is a line in
//!   a synced log, so "ran exactly once" is counted outside the database).
//! - [`session`]: scripted agents, stores on a fresh SQLite file in a
//!   temporary directory or in memory, sessions on them, and assertions on
//!   transcripts.
//! - [`process`]: re-running the calling test binary as a worker process
//!   (one ignored test, named by its module path), and signals to it.
//! - [`sse`]: a reader of `turnstile serve`'s event streams.
//! - [`torture`], [`race`], [`lease`]: the crash torture, the two-process
//!   ownership race and the lease takeover, written once for any backend;
//!   each backend's tests say how to open, read and check their store.
//! - `postgres` (feature `postgres`): stores on the throwaway PostgreSQL test
//!   server and what the PostgreSQL durability tests inspect.

pub mod lease;
pub mod llama;
pub mod mcp;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod process;
pub mod python;
pub mod race;
pub mod session;
pub mod sse;
pub mod tools;
pub mod torture;
