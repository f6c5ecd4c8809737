//! The arguments of the operations commands.

use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::cli::db::DbLocation;
use turnstile::ids::{ConversationId, Namespace, RunId};

/// What `ls` lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ListKind {
    Conversations,
    Requests,
    Runs,
}

#[derive(Args, Debug)]
pub struct LsArgs {
    /// What to list, newest first.
    #[arg(value_enum)]
    pub kind: ListKind,
    /// The database: a SQLite file, or a PostgreSQL URL.
    #[arg(long, value_name = "PATH|URL")]
    pub db: DbLocation,
    /// Only this namespace (every namespace when absent).
    #[arg(long, value_name = "NS")]
    pub namespace: Option<Namespace>,
    /// Only this conversation.
    #[arg(long, value_name = "UUID")]
    pub conversation: Option<ConversationId>,
    /// Only what stuck admissions hold: admissions whose run failed, or is
    /// `running` without a change for --stale-after. The database cannot see
    /// processes: a live run inside one long model or tool call looks stuck
    /// once that call outlasts --stale-after. A request awaiting approval
    /// is not stuck (see `turnstile approvals`).
    #[arg(long)]
    pub stuck: bool,
    /// How long a `running` owner may leave its admission unchanged before
    /// it counts as stuck (`30s`, `5m`, `2h`, `7d`).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    pub stale_after: Duration,
    /// At most this many rows.
    #[arg(long, value_name = "N", default_value_t = 50,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: u32,
    #[command(flatten)]
    pub search: crate::cli::search::SearchArgs,
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    /// The conversation to show.
    #[arg(value_name = "CONVERSATION")]
    pub conversation: ConversationId,
    /// The database: a SQLite file, or a PostgreSQL URL.
    #[arg(long, value_name = "PATH|URL")]
    pub db: DbLocation,
    /// The namespace the conversation must be in (any when absent).
    #[arg(long, value_name = "NS")]
    pub namespace: Option<Namespace>,
    /// Print the text of the model's reasoning under its mark.
    #[arg(long)]
    pub reasoning: bool,
}

#[derive(Args, Debug)]
pub struct CheckpointsArgs {
    /// The run whose checkpoint rows, and the messages its request held at
    /// the last of them, to show.
    #[arg(value_name = "RUN")]
    pub run: RunId,
    /// The database: a SQLite file, or a PostgreSQL URL.
    #[arg(long, value_name = "PATH|URL")]
    pub db: DbLocation,
    /// Print the text of the model's reasoning under its mark.
    #[arg(long)]
    pub reasoning: bool,
}

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// The conversation to export: one JSON line per transcript entry
    /// (`seq`, `request_id`, `message`), in order; each image's and file's
    /// bytes as base64 in its part (`data`).
    #[arg(value_name = "CONVERSATION")]
    pub conversation: ConversationId,
    /// The database: a SQLite file, or a PostgreSQL URL.
    #[arg(long, value_name = "PATH|URL")]
    pub db: DbLocation,
    /// The namespace the conversation must be in (any when absent).
    #[arg(long, value_name = "NS")]
    pub namespace: Option<Namespace>,
    /// Write each image's and file's bytes once to this existing
    /// directory, in a file named by its SHA-256, instead of as base64.
    #[arg(long, value_name = "DIR")]
    pub blobs: Option<std::path::PathBuf>,
}

#[derive(Args, Debug)]
pub struct EventsArgs {
    /// The conversation whose event log to print: one JSON line per event
    /// (`seq`, `at`, `request_id`, `kind` and the kind's fields), in order.
    #[arg(value_name = "CONVERSATION")]
    pub conversation: ConversationId,
    /// The database: a SQLite file, or a PostgreSQL URL.
    #[arg(long, value_name = "PATH|URL")]
    pub db: DbLocation,
    /// The namespace the conversation must be in (any when absent).
    #[arg(long, value_name = "NS")]
    pub namespace: Option<Namespace>,
    /// Only the events after this one (the last `seq` already seen).
    #[arg(long, value_name = "SEQ", default_value_t = 0)]
    pub after: u64,
    /// Keep printing new events as their steps commit, in this process or
    /// any other, until interrupted (Ctrl-C, SIGTERM).
    #[arg(long)]
    pub follow: bool,
    /// How often `--follow` looks for new events (e.g. `250ms`, `2s`).
    #[arg(long, value_name = "DURATION", default_value = "250ms", value_parser = parse_duration)]
    pub poll: Duration,
}

/// Which finished requests `prune` trims.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PruneStatus {
    Completed,
    Abandoned,
}

#[derive(Args, Debug)]
pub struct PruneArgs {
    /// The database: a SQLite file, or a PostgreSQL URL.
    #[arg(long, value_name = "PATH|URL")]
    pub db: DbLocation,
    /// Trim requests finished longer ago than this (`30s`, `5m`, `2h`, `7d`).
    /// A completed request keeps what its replay reads (request, committing
    /// run, its completed checkpoint, reports, transcript); an abandoned one
    /// keeps its row, so its id stays burned.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub older_than: Duration,
    /// Only requests of this status (both when absent).
    #[arg(long, value_enum)]
    pub status: Option<PruneStatus>,
    /// Count what would be deleted; delete nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Also delete whole idle conversations last active before the cutoff:
    /// transcripts, requests (their ids become unknown) and all.
    #[arg(long, conflicts_with = "status")]
    pub include_transcripts: bool,
    /// With --include-transcripts: the idle age past which a conversation
    /// goes whole (--older-than when absent).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, requires = "include_transcripts")]
    pub conversations_older_than: Option<Duration>,
    /// Spare the newest N requests of each conversation, whatever their age
    /// (a request in progress counts among them).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub keep_last: u32,
}

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// The database: a SQLite file, or a PostgreSQL URL.
    #[arg(long, value_name = "PATH|URL")]
    pub db: DbLocation,
    /// How long a `running` owner may leave its admission unchanged before
    /// it counts as stuck.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_duration)]
    pub stale_after: Duration,
}

/// Parses `30s`, `5m`, `2h` or `7d` (a whole number and a unit).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("expected a duration like 30s, 5m, 2h or 7d, got {s:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_a_number_and_a_unit() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7_200)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(604_800)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5_400)));
        for bad in ["", "5", "m", "-5m", "5x", "99999999999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}
