//! `turnstile bench`'s arguments and the caps on its workload.

use clap::{Args, ValueEnum};

use crate::cli::db::DbLocation;
use turnstile::session::MAX_INPUT_BYTES;
use turnstile::store::PartLimits;
use turnstile::Durability;

/// The largest `--message-bytes`: the largest input a request accepts.
pub(super) const MAX_MESSAGE_BYTES: i64 = MAX_INPUT_BYTES as i64;
/// Caps on the whole workload, so a typo cannot fill the disk or memory
/// (one latency is kept per turn).
pub(super) const MAX_TURNS: u64 = 1_000_000;
pub(super) const MAX_MESSAGE_TEXT_BYTES: u64 = 4 << 30;
/// The largest `--image-bytes`: the default limit of one part.
pub(super) const MAX_IMAGE_BYTES: i64 = PartLimits::DEFAULT_MAX_PART_BYTES as i64;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Conversations in the workload.
    #[arg(long, value_name = "N", default_value_t = 200,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub conversations: u32,
    /// Turns per conversation. A turn is one request: a user input answered
    /// by a scripted final answer (two messages).
    #[arg(long, value_name = "T", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub turns: u32,
    /// Bytes of each message's text (input and answer alike).
    #[arg(long, value_name = "B", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(1..=MAX_MESSAGE_BYTES))]
    pub message_bytes: u32,
    /// Bytes of an image sent with each request's input (0, the default:
    /// none). Each image's bytes differ (no two requests share one), so
    /// the storage figure counts every image stored.
    #[arg(long, value_name = "B", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=MAX_IMAGE_BYTES))]
    pub image_bytes: u32,
    /// `full` (synchronous=FULL, survives power loss; the default) or
    /// `normal` (synchronous=NORMAL, survives a process crash). SQLite only:
    /// on PostgreSQL the server's settings decide, and are reported.
    #[arg(long, value_enum)]
    pub durability: Option<BenchDurability>,
    /// Conversations driven at the same time, each by its own task (at most
    /// --conversations). Default 1. SQLite only: on PostgreSQL the bench
    /// runs at 1, 8 and 64.
    #[arg(long, value_name = "C",
          value_parser = clap::value_parser!(u32).range(1..=1_024))]
    pub concurrency: Option<u32>,
    /// Write to this new file and keep it (an existing file is refused); it
    /// also holds the requests of the timed steps, as many as the
    /// workload's up to 200, in conversations of their own. Default: a
    /// fresh temp directory, removed afterwards. Or a PostgreSQL
    /// URL: each workload then runs in a new schema of that database
    /// (`turnstile_bench_…`), dropped afterwards.
    #[arg(long, value_name = "PATH|URL", conflicts_with = "in_memory")]
    pub db: Option<DbLocation>,
    /// Run the workload on `SqliteStore::in_memory()` (the test-harness
    /// store), against a baseline in memory too; storage is what the
    /// in-memory database holds.
    #[arg(long)]
    pub in_memory: bool,
}

/// `--durability`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BenchDurability {
    Full,
    Normal,
}

impl BenchDurability {
    pub(super) fn store(self) -> Durability {
        match self {
            BenchDurability::Full => Durability::Full,
            BenchDurability::Normal => Durability::Normal,
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            BenchDurability::Full => "full",
            BenchDurability::Normal => "normal",
        }
    }
}
