//! The operations commands: `ls`, `show`, `checkpoints`, `export`, `prune`
//! and `doctor`. They read (or, for `prune`, trim) an existing database and
//! never create one: a missing file, or a PostgreSQL database without the
//! turnstile schema, is "not found" (exit 4).

mod awaiting;
mod inspect;
mod list;
mod maintain;

use std::time::Duration;

use clap::{Args, ValueEnum};

pub(super) use inspect::{checkpoints, export, show};
pub(super) use list::ls;
pub(super) use maintain::{doctor, prune};

use super::db::DbLocation;
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
    /// Only this namespace.
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
    pub search: super::search::SearchArgs,
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
}

#[derive(Args, Debug)]
pub struct CheckpointsArgs {
    /// The run whose checkpoint rows to show.
    #[arg(value_name = "RUN")]
    pub run: RunId,
    /// The database: a SQLite file, or a PostgreSQL URL.
    #[arg(long, value_name = "PATH|URL")]
    pub db: DbLocation,
}

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// The conversation to export: one JSON line per transcript entry
    /// (`seq`, `request_id`, `message`), in order.
    #[arg(value_name = "CONVERSATION")]
    pub conversation: ConversationId,
    /// The database: a SQLite file, or a PostgreSQL URL.
    #[arg(long, value_name = "PATH|URL")]
    pub db: DbLocation,
    /// The namespace the conversation must be in (any when absent).
    #[arg(long, value_name = "NS")]
    pub namespace: Option<Namespace>,
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

/// Unix milliseconds as `YYYY-MM-DD hh:mm:ss` UTC. A time outside what an
/// RFC 3339 date can say (before 1970, after 9999: database content is not
/// trusted) is shown at the nearest end of that range.
pub(super) fn utc(ms: i64) -> String {
    const LAST_SECOND_OF_9999: u64 = 253_402_300_799;
    let seconds = u64::try_from(ms.div_euclid(1_000))
        .unwrap_or(0)
        .min(LAST_SECOND_OF_9999);
    let time = std::time::UNIX_EPOCH + Duration::from_secs(seconds);
    humantime::format_rfc3339_seconds(time)
        .to_string()
        .replace('T', " ")
        .trim_end_matches('Z')
        .to_owned()
}

/// Writes rows under a header, each column as wide as its widest cell.
pub(super) fn columns(
    out: &mut dyn std::io::Write,
    header: &[&str],
    rows: &[Vec<String>],
) -> Result<(), super::CliError> {
    let mut widths: Vec<usize> = header.iter().map(|h| visible_width(h)).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(visible_width(cell));
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, cell) in cells.enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            text.push_str(cell);
            let pad = widths[i].saturating_sub(visible_width(cell));
            text.extend(std::iter::repeat_n(' ', pad));
        }
        text.trim_end().to_owned()
    };
    writeln!(out, "{}", line(&mut header.iter().copied()))?;
    for row in rows {
        writeln!(out, "{}", line(&mut row.iter().map(String::as_str)))?;
    }
    Ok(())
}

/// Characters on screen: colour escape sequences take none.
fn visible_width(text: &str) -> usize {
    let mut width = 0;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // `ESC [ … m`
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            width += 1;
        }
    }
    width
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

    #[test]
    fn colour_codes_take_no_width() {
        assert_eq!(visible_width("\x1b[31mstuck\x1b[0m"), 5);
        assert_eq!(visible_width("turn 2 · ready"), 14);
    }

    #[test]
    fn utc_formats_unix_milliseconds() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(utc(1_700_000_000_999), "2023-11-14 22:13:20");
        assert_eq!(utc(-1_000), "1970-01-01 00:00:00");
        assert_eq!(utc(i64::MAX), "9999-12-31 23:59:59");
    }
}
