//! Rendering for the operations commands: times, and aligned columns.

use std::time::Duration;

/// Unix milliseconds as `YYYY-MM-DD hh:mm:ss` UTC. A time outside what an
/// RFC 3339 date can say (before 1970, after 9999: database content is not
/// trusted) is shown at the nearest end of that range.
pub(in crate::cli) fn utc(ms: i64) -> String {
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
pub(in crate::cli) fn columns(
    out: &mut dyn std::io::Write,
    header: &[&str],
    rows: &[Vec<String>],
) -> Result<(), crate::cli::exit::CliError> {
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
