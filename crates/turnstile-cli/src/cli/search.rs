//! The conversation search flags of `ls conversations`: owner, one
//! metadata key, time ranges and the page cursor.

use clap::Args;
use serde_json::Value;

use turnstile::admin::ListFilter;
use turnstile::store::ConversationCursor;

use super::text::echoed;

/// Filters of `ls conversations` (other listings refuse them), shown
/// under a heading of their own in `ls --help`.
#[derive(Args, Debug, Default)]
#[command(next_help_heading = "Filters of `ls conversations` only (requests and runs refuse them)")]
pub struct SearchArgs {
    /// Only conversations of this owner (`ls conversations` only).
    #[arg(long, value_name = "OWNER")]
    pub owner: Option<String>,
    /// Only conversations whose metadata key K holds the string V
    /// (`--meta k=v`), or with `k:=JSON` the JSON value (an integer,
    /// `true`, `false` or `null`: `--meta priority:=3`). `ls conversations`
    /// only.
    #[arg(long, value_name = "K=V|K:=JSON", value_parser = parse_meta_filter)]
    pub meta: Option<(String, Value)>,
    /// Only conversations created at or after this time (RFC 3339 with `Z`
    /// or an offset such as `+01:00`, or Unix milliseconds). `ls
    /// conversations` only.
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub created_after: Option<i64>,
    /// Only conversations created before this time (`ls conversations`
    /// only).
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub created_before: Option<i64>,
    /// Only conversations updated (last activity or metadata change) at or
    /// after this time (`ls conversations` only).
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub updated_after: Option<i64>,
    /// Only conversations updated before this time (`ls conversations`
    /// only).
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub updated_before: Option<i64>,
    /// The next page: the cursor a previous page printed (`ls
    /// conversations` only).
    #[arg(long, value_name = "CURSOR", value_parser = parse_cursor)]
    pub after: Option<ConversationCursor>,
}

impl SearchArgs {
    /// Whether any flag is given (only `ls conversations` takes them).
    pub fn any(&self) -> bool {
        self.owner.is_some()
            || self.meta.is_some()
            || self.created_after.is_some()
            || self.created_before.is_some()
            || self.updated_after.is_some()
            || self.updated_before.is_some()
            || self.after.is_some()
    }

    /// `filter` with these filters added.
    pub fn apply(self, filter: ListFilter) -> ListFilter {
        ListFilter {
            owner: self.owner,
            meta: self.meta,
            created_after: self.created_after,
            created_before: self.created_before,
            updated_after: self.updated_after,
            updated_before: self.updated_before,
            after: self.after,
            ..filter
        }
    }
}

/// `k=v` (a string) or `k:=JSON`.
fn parse_meta_filter(s: &str) -> Result<(String, Value), String> {
    let (key, value) = parse_pair(s)?;
    turnstile::store::meta::check_key(&key).map_err(|e| e.to_string())?;
    turnstile::store::meta::check_filter_value(&value).map_err(|e| e.to_string())?;
    Ok((key, value))
}

/// `k=v` as a string value, `k:=JSON` as a JSON value.
fn parse_pair(s: &str) -> Result<(String, Value), String> {
    if let Some((key, json)) = s.split_once(":=") {
        if !key.contains('=') {
            let value = serde_json::from_str(json)
                .map_err(|e| format!("{} after := is not JSON: {e}", echoed(json)))?;
            return Ok((key.to_owned(), value));
        }
    }
    let (key, value) = s
        .split_once('=')
        .ok_or_else(|| format!("expected KEY=VALUE or KEY:=JSON, got {}", echoed(s)))?;
    Ok((key.to_owned(), Value::String(value.to_owned())))
}

/// RFC 3339 (`2026-12-01T18:00:00Z`, or with a numeric offset such as
/// `2026-12-01T19:00:00+01:00`) or Unix milliseconds.
fn parse_time(s: &str) -> Result<i64, String> {
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    let (utc, offset_ms) = split_offset(s);
    let time = humantime::parse_rfc3339_weak(utc)
        .map_err(|e| format!("expected an RFC 3339 time or Unix milliseconds, got {s:?}: {e}"))?;
    let ms = time
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| format!("{s:?} is before 1970"))?
        .as_millis();
    i64::try_from(ms)
        .ok()
        .and_then(|ms| ms.checked_sub(offset_ms))
        .filter(|ms| *ms >= 0)
        .ok_or_else(|| format!("{s:?} is out of range"))
}

/// A time without its `±HH:MM` offset, and the offset in milliseconds
/// (humantime reads only UTC): `10:00+01:00` is `09:00Z`.
fn split_offset(s: &str) -> (&str, i64) {
    let bytes = s.as_bytes();
    let n = bytes.len();
    if n < 7 || bytes[n - 3] != b':' || !matches!(bytes[n - 6], b'+' | b'-') {
        return (s, 0);
    }
    let digits = |range: std::ops::Range<usize>| -> Option<i64> {
        let text = s.get(range)?;
        text.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| text.parse().ok())?
    };
    match (digits(n - 5..n - 3), digits(n - 2..n)) {
        (Some(hours), Some(minutes)) if hours < 24 && minutes < 60 => {
            let sign = if bytes[n - 6] == b'-' { -1 } else { 1 };
            (&s[..n - 6], sign * (hours * 60 + minutes) * 60_000)
        }
        _ => (s, 0),
    }
}

fn parse_cursor(s: &str) -> Result<ConversationCursor, String> {
    s.parse().map_err(|e: turnstile::Error| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pairs_are_strings_unless_given_as_json() {
        assert_eq!(parse_pair("k=v").unwrap(), ("k".into(), json!("v")));
        assert_eq!(parse_pair("k=a=b").unwrap(), ("k".into(), json!("a=b")));
        assert_eq!(parse_pair("k:=3").unwrap(), ("k".into(), json!(3)));
        assert_eq!(parse_pair("k=x:=3").unwrap(), ("k".into(), json!("x:=3")));
        assert!(parse_pair("k").is_err());
        assert!(parse_pair("k:={").is_err());
        assert!(parse_meta_filter("k:=1.5").is_err());
    }

    #[test]
    fn times_are_rfc3339_or_unix_milliseconds() {
        assert_eq!(parse_time("1700000000000").unwrap(), 1_700_000_000_000);
        assert_eq!(
            parse_time("2023-11-14T22:13:20Z").unwrap(),
            1_700_000_000_000
        );
        assert!(parse_time("yesterday").is_err());
    }

    #[test]
    fn times_with_a_numeric_offset_are_that_far_from_utc() {
        let utc = parse_time("2023-11-14T22:13:20Z").unwrap();
        assert_eq!(parse_time("2023-11-14T23:13:20+01:00").unwrap(), utc);
        assert_eq!(parse_time("2023-11-14T16:43:20-05:30").unwrap(), utc);
        assert_eq!(parse_time("2023-11-14T22:13:20+00:00").unwrap(), utc);
        assert_eq!(
            parse_time("2023-11-14T23:13:20.5+01:00").unwrap(),
            utc + 500
        );
        assert!(parse_time("2023-11-14T22:13:20+25:00").is_err());
    }
}
