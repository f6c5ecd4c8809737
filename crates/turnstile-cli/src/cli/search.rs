//! The conversation search flags of `ls conversations`: owner, one
//! metadata key, time ranges and the page cursor.

use clap::Args;
use serde_json::Value;

use turnstile::admin::ListFilter;
use turnstile::store::ConversationCursor;

/// Filters of `ls conversations` (other listings refuse them).
#[derive(Args, Debug, Default)]
pub struct SearchArgs {
    /// Only conversations of this owner.
    #[arg(long, value_name = "OWNER")]
    pub owner: Option<String>,
    /// Only conversations whose metadata key K holds the string V
    /// (`--meta k=v`), or with `k:=JSON` the JSON value (an integer,
    /// `true`, `false` or `null`: `--meta priority:=3`).
    #[arg(long, value_name = "K=V|K:=JSON", value_parser = parse_meta_filter)]
    pub meta: Option<(String, Value)>,
    /// Only conversations created at or after this time (RFC 3339, or Unix
    /// milliseconds).
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub created_after: Option<i64>,
    /// Only conversations created before this time.
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub created_before: Option<i64>,
    /// Only conversations updated (last activity or metadata change) at or
    /// after this time.
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub updated_after: Option<i64>,
    /// Only conversations updated before this time.
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub updated_before: Option<i64>,
    /// The next page: the cursor a previous page printed.
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
pub(super) fn parse_pair(s: &str) -> Result<(String, Value), String> {
    if let Some((key, json)) = s.split_once(":=") {
        if !key.contains('=') {
            let value = serde_json::from_str(json)
                .map_err(|e| format!("{json:?} after := is not JSON: {e}"))?;
            return Ok((key.to_owned(), value));
        }
    }
    let (key, value) = s
        .split_once('=')
        .ok_or_else(|| format!("expected KEY=VALUE or KEY:=JSON, got {s:?}"))?;
    Ok((key.to_owned(), Value::String(value.to_owned())))
}

/// RFC 3339 (`2026-12-01T18:00:00Z`) or Unix milliseconds.
fn parse_time(s: &str) -> Result<i64, String> {
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    let time = humantime::parse_rfc3339_weak(s)
        .map_err(|e| format!("expected an RFC 3339 time or Unix milliseconds, got {s:?}: {e}"))?;
    let ms = time
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| format!("{s:?} is before 1970"))?
        .as_millis();
    i64::try_from(ms).map_err(|_| format!("{s:?} is too far away"))
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
}
