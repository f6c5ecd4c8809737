//! `prune` (retention, then give the space back) and `doctor` (a health
//! report; exit 1 when the integrity check fails).

use std::io::Write;

use super::args::{DoctorArgs, PruneArgs, PruneStatus};
use super::columns::utc;
use crate::cli::access::Access;
use crate::cli::db::DbLocation;
use crate::cli::exit::CliError;
use crate::cli::output::{self, Style};
use crate::cli::store::open_store;
use turnstile::admin::{DoctorReport, PruneOptions};
use turnstile::store::RequestStatus;
use turnstile::SqliteStore;

pub(in crate::cli) async fn prune(
    args: PruneArgs,
    out: &mut dyn Write,
    style: Style,
    json: bool,
) -> Result<(), CliError> {
    let store = open_store(&args.db, Access::Write(Default::default())).await?;
    let result = async {
        let options = PruneOptions {
            older_than: args.older_than,
            status: args.status.map(|status| match status {
                PruneStatus::Completed => RequestStatus::Completed,
                PruneStatus::Abandoned => RequestStatus::Abandoned,
            }),
            include_transcripts: args.include_transcripts,
            conversations_older_than: args.conversations_older_than,
            keep_last_requests: args.keep_last,
            dry_run: args.dry_run,
        };
        let report = store.prune(&options).await?;
        if json {
            return output::json(out, &report);
        }
        let verb = if report.dry_run {
            style.yellow("dry run: would delete")
        } else {
            style.green("deleted")
        };
        let mut what = match args.status {
            Some(PruneStatus::Completed) => "completed requests".to_owned(),
            Some(PruneStatus::Abandoned) => "abandoned requests".to_owned(),
            None => "completed and abandoned requests".to_owned(),
        };
        if args.include_transcripts {
            what.push_str(" and idle conversations");
        }
        writeln!(
            out,
            "{verb} from {what} finished before {} UTC ({} examined)",
            utc(report.cutoff),
            report.requests_examined
        )?;
        let mut rows: Vec<(&str, String)> = report
            .deleted
            .rows()
            .into_iter()
            .map(|(table, n)| (table, n.to_string()))
            .collect();
        rows.push(("total rows", report.deleted.total().to_string()));
        output::table(out, "  ", &rows)?;
        if matches!(args.db, DbLocation::Postgres(_)) {
            // The tables' bytes; VACUUM makes the space reusable, and the
            // server gives it back to the disk only at a VACUUM FULL.
            let tables = if report.dry_run {
                format!(
                    "{} (unchanged: nothing deleted)",
                    bytes(report.database_bytes_before)
                )
            } else {
                format!(
                    "{} → {} (vacuumed: the space is reused)",
                    bytes(report.database_bytes_before),
                    bytes(report.database_bytes_after)
                )
            };
            return output::table(out, "", &[("tables", tables)]);
        }
        let database = if report.dry_run {
            format!(
                "{} + {} log (unchanged: nothing deleted)",
                bytes(report.database_bytes_before),
                bytes(report.wal_bytes_before)
            )
        } else {
            format!(
                "{} + {} log → {} + {} log · {} pages given back",
                bytes(report.database_bytes_before),
                bytes(report.wal_bytes_before),
                bytes(report.database_bytes_after),
                bytes(report.wal_bytes_after),
                report.pages_freed
            )
        };
        output::table(out, "", &[("file", database)])?;
        if report.free_pages_after > 0 && !report.dry_run {
            writeln!(
                out,
                "{} free pages stay in the file (it was created without incremental auto-vacuum; \
                 a full VACUUM returns them)",
                report.free_pages_after
            )?;
        }
        if report.wal_checkpoint_busy {
            writeln!(
                out,
                "the write-ahead log was not truncated: another connection was reading"
            )?;
        }
        Ok(())
    }
    .await;
    crate::cli::store::closed(store.as_ref(), result).await
}

pub(in crate::cli) async fn doctor(
    args: DoctorArgs,
    out: &mut dyn Write,
    style: Style,
    json: bool,
) -> Result<(), CliError> {
    let postgres = matches!(args.db, DbLocation::Postgres(_));
    let report = match &args.db {
        DbLocation::File(path) => {
            // Only a path that is not there is "not found"; one that cannot
            // be looked at (no permission) is the doctor's own "cannot open".
            if std::fs::metadata(path).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
                return Err(CliError::MissingDatabase(path.display().to_string()));
            }
            SqliteStore::doctor(path, args.stale_after).await?
        }
        DbLocation::Postgres(url) => crate::cli::postgres::doctor(url, args.stale_after).await?,
    };
    if json {
        output::json(out, &report)?;
    } else if report.cannot_open.is_none() {
        if postgres {
            print_postgres(out, style, &report)?;
        } else {
            print_sqlite(out, style, &report)?;
        }
        for why in &report.not_checked {
            writeln!(
                out,
                "{} {}",
                style.yellow("not checked:"),
                output::plain(why)
            )?;
        }
    }
    if let Some(why) = report.cannot_open {
        Err(CliError::CannotOpen(format!(
            "cannot open {} to check it: {why}",
            report.location
        )))
    } else if report.integrity_ok == Some(true) {
        Ok(())
    } else if report.integrity_ok.is_none() && postgres {
        Err(CliError::Failed(format!(
            "could not check {}: {}",
            report.location,
            report.not_checked.first().map_or("", String::as_str)
        )))
    } else {
        Err(CliError::Failed(format!(
            "integrity check failed for {}: {}",
            report.location,
            report.integrity.first().map_or("", String::as_str)
        )))
    }
}

fn print_sqlite(out: &mut dyn Write, style: Style, report: &DoctorReport) -> Result<(), CliError> {
    let detail = |name: &str| match report.details.get(name) {
        Some(serde_json::Value::String(text)) => text.clone(),
        Some(value) if !value.is_null() => value.to_string(),
        _ => "unknown".into(),
    };
    let pages = format!(
        "{} × {} bytes · {} free · auto_vacuum {} · journal {}",
        detail("page_count"),
        detail("page_size"),
        detail("freelist_count"),
        detail("auto_vacuum"),
        detail("journal_mode"),
    );
    output::table(
        out,
        "",
        &[
            ("location", output::clip(&report.location, 200)),
            ("integrity", integrity(style, report)),
            (
                "schema version",
                schema(style, report, "the next open migrates it"),
            ),
            ("pages", pages),
            ("database", bytes(report.database_bytes)),
            ("write-ahead log", bytes(report.wal_bytes)),
            ("admissions", admissions(style, report)),
            ("blobs", blobs(style, report)),
        ],
    )
}

/// The server, the schema, the store's invariants and each table's size.
fn print_postgres(
    out: &mut dyn Write,
    style: Style,
    report: &DoctorReport,
) -> Result<(), CliError> {
    let text = |name: &str| match report.details.get(name) {
        Some(serde_json::Value::String(text)) => output::plain(text).into_owned(),
        _ => "unknown".into(),
    };
    let integrity = match report.integrity_ok {
        None => style.yellow("not checked"),
        Some(_) => integrity(style, report),
    };
    let tables: Vec<(String, u64)> = match report.details.get("table_bytes") {
        Some(serde_json::Value::Object(sizes)) => sizes
            .iter()
            .map(|(table, n)| (output::plain(table).into_owned(), n.as_u64().unwrap_or(0)))
            .collect(),
        _ => Vec::new(),
    };
    output::table(
        out,
        "",
        &[
            ("location", output::clip(&report.location, 200)),
            (
                "server",
                format!(
                    "PostgreSQL {} · schema {}",
                    text("server_version"),
                    text("schema")
                ),
            ),
            ("integrity", integrity),
            (
                "schema version",
                schema(style, report, "a writing command migrates it"),
            ),
            ("admissions", admissions(style, report)),
            ("blobs", blobs(style, report)),
            (
                "database",
                format!(
                    "{} in {} tables (indexes and TOAST included)",
                    bytes(report.database_bytes),
                    tables.len()
                ),
            ),
        ],
    )?;
    let sizes: Vec<(&str, String)> = tables
        .iter()
        .map(|(table, n)| (table.as_str(), bytes(*n)))
        .collect();
    output::table(out, "  ", &sizes)
}

/// `ok`, or what failed.
fn integrity(style: Style, report: &DoctorReport) -> String {
    if report.integrity_ok == Some(true) {
        style.green("ok")
    } else {
        style.red(&format!(
            "FAILED: {}",
            report
                .integrity
                .iter()
                .take(5)
                .map(|line| output::clip(line, 120))
                .collect::<Vec<_>>()
                .join("; ")
        ))
    }
}

/// The schema version against the supported one; `older` says what
/// happens to an older one.
fn schema(style: Style, report: &DoctorReport, older: &str) -> String {
    match report.schema_version {
        Some(found) if found > report.supported_schema_version => style.red(&format!(
            "{found} (newer than the supported {}: upgrade turnstile)",
            report.supported_schema_version
        )),
        Some(found) if found < report.supported_schema_version => {
            format!("{found} ({older} to {})", report.supported_schema_version)
        }
        Some(found) => format!("{found} (supported {found})"),
        None => "unknown".into(),
    }
}

/// `N held · M stuck · K awaiting approval`.
fn admissions(style: Style, report: &DoctorReport) -> String {
    let number = |n: Option<u64>| n.map_or("unknown".into(), |n| n.to_string());
    let stuck = match report.stuck_admissions {
        Some(n) if n > 0 => style.red(&format!("{n} stuck (see `turnstile ls requests --stuck`)")),
        other => format!("{} stuck", number(other)),
    };
    let awaiting = match report.awaiting_approval_admissions {
        Some(n) if n > 0 => style.yellow(&format!(
            "{n} awaiting approval (see `turnstile approvals`)"
        )),
        other => format!("{} awaiting approval", number(other)),
    };
    format!(
        "{} held · {stuck} · {awaiting}",
        number(report.held_admissions)
    )
}

/// `N images and files stored once, 12345 bytes (12.1 KiB), 0 unreferenced`.
fn blobs(style: Style, report: &DoctorReport) -> String {
    let (Some(count), Some(size)) = (report.blobs, report.blob_bytes) else {
        return "unknown".into();
    };
    let unreferenced = match report.unreferenced_blobs {
        Some(0) => "0 unreferenced".to_owned(),
        Some(n) => style.red(&format!("{n} unreferenced (a defect: please report it)")),
        None => "unreferenced unknown".to_owned(),
    };
    format!(
        "{count} images and files stored once, {}, {unreferenced}",
        bytes(size)
    )
}

/// `12345 bytes (12.1 KiB)`.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} bytes");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{n} bytes ({value:.1} {})", UNITS[unit])
}
