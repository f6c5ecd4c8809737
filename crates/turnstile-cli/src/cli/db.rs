//! `--db`: a SQLite file path, or a PostgreSQL URL (`postgres://…` or
//! `postgresql://…`, the scheme in any case).
//!
//! A URL may hold a password (`user:password@`, or `?password=`): it is kept
//! only to connect with. Everything that shows a URL (`Display`, `Debug`,
//! the resume hint, errors, reports) shows it without the password, which
//! `PGPASSWORD` or `~/.pgpass` then supply, so a printed command still runs.

use std::ffi::OsStr;
use std::fmt;
use std::path::PathBuf;

use clap::builder::{PathBufValueParser, TypedValueParser, ValueParserFactory};
use clap::error::ErrorKind;
use turnstile::{Error, PostgresOptions};

use super::output;

/// Where a command's database is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DbLocation {
    /// A SQLite database file.
    File(PathBuf),
    /// A PostgreSQL server's database.
    Postgres(PgUrl),
}

impl fmt::Display for DbLocation {
    /// The path, or the URL without its password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DbLocation::File(path) => write!(f, "{}", path.display()),
            DbLocation::Postgres(url) => f.write_str(&url.redacted()),
        }
    }
}

/// A PostgreSQL URL that parsed. Never shown as given: see [`PgUrl::redacted`].
#[derive(Clone, PartialEq, Eq)]
pub struct PgUrl(String);

impl PgUrl {
    /// The URL as given, password included: only to connect with.
    pub fn secret(&self) -> &str {
        &self.0
    }

    /// The URL without its password.
    pub fn redacted(&self) -> String {
        without_password(&self.0)
    }
}

impl fmt::Debug for PgUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PgUrl").field(&self.redacted()).finish()
    }
}

/// Whether `--db` names a server rather than a file.
fn is_postgres_url(value: &[u8]) -> bool {
    ["postgres://", "postgresql://"].iter().any(|scheme| {
        value
            .get(..scheme.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(scheme.as_bytes()))
    })
}

impl ValueParserFactory for DbLocation {
    type Parser = DbLocationParser;

    fn value_parser() -> Self::Parser {
        DbLocationParser
    }
}

/// Parses `--db`. A file path is taken as clap takes any path; a URL must
/// parse as a PostgreSQL URL, and a refusal never quotes it.
#[derive(Clone, Copy, Debug)]
pub struct DbLocationParser;

impl TypedValueParser for DbLocationParser {
    type Value = DbLocation;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<DbLocation, clap::Error> {
        if !is_postgres_url(value.as_encoded_bytes()) {
            return PathBufValueParser::new()
                .parse_ref(cmd, arg, value)
                .map(DbLocation::File);
        }
        let refuse = |why: String| {
            let name = arg.map_or_else(|| "--db".to_owned(), |arg| arg.to_string());
            clap::Error::raw(
                ErrorKind::ValueValidation,
                format!("invalid PostgreSQL URL for {name}: {why}\n"),
            )
            .with_cmd(cmd)
        };
        let url = value
            .to_str()
            .ok_or_else(|| refuse("it is not valid UTF-8".into()))?;
        // Checked here, so a bad URL is a usage error before anything runs.
        // The driver would ignore an unknown parameter (and log its value,
        // which may be a misspelt password): refused by name, as libpq does.
        if let Some(key) = query_keys(url).find(|key| !KNOWN_PARAMETERS.contains(&key.as_str())) {
            let key = output::plain(&key).into_owned();
            return Err(refuse(format!("unknown parameter {key:?}")));
        }
        // The store's messages name the part that is wrong, never its value.
        PostgresOptions::new(url).location().map_err(|e| match e {
            Error::InvalidInput(why) => refuse(
                why.strip_prefix("PostgreSQL URL: ")
                    .unwrap_or(&why)
                    .to_owned(),
            ),
            other => refuse(other.to_string()),
        })?;
        Ok(DbLocation::Postgres(PgUrl(url.to_owned())))
    }
}

/// The query parameters the driver (sqlx 0.8) reads; it ignores others.
const KNOWN_PARAMETERS: [&str; 18] = [
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// The decoded keys of `url`'s query; `options[NAME]` counts as `options`.
fn query_keys(url: &str) -> impl Iterator<Item = String> + '_ {
    let before_fragment = url.split('#').next().unwrap_or_default();
    let query = before_fragment
        .split_once('?')
        .map_or("", |(_, query)| query);
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let key = decoded(pair.split_once('=').map_or(pair, |(key, _)| key));
            match key.strip_prefix("options[") {
                Some(rest) if rest.ends_with(']') => "options".to_owned(),
                _ => key,
            }
        })
}

/// `url` without a password: the `:password` of its user info and every
/// `password` query parameter removed, the rest as it was. The user info
/// ends at the authority's last `@`, and the authority at the first `/`,
/// `?` or `#`, as URL parsers (and so the driver) read it.
pub fn without_password(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let (head, rest) = url.split_at(scheme_end + 3);
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let mut out = head.to_owned();
    match authority.rfind('@') {
        Some(at) => {
            let userinfo = &authority[..at];
            out.push_str(userinfo.split_once(':').map_or(userinfo, |(user, _)| user));
            out.push_str(&authority[at..]);
        }
        None => out.push_str(authority),
    }
    let (before_fragment, fragment) = match tail.split_once('#') {
        Some((before, fragment)) => (before, Some(fragment)),
        None => (tail, None),
    };
    let (path, query) = match before_fragment.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (before_fragment, None),
    };
    out.push_str(path);
    if let Some(query) = query {
        let kept: Vec<&str> = query
            .split('&')
            .filter(|pair| {
                let key = pair.split_once('=').map_or(*pair, |(key, _)| key);
                decoded(key) != "password"
            })
            .collect();
        if !kept.is_empty() {
            out.push('?');
            out.push_str(&kept.join("&"));
        }
    }
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(fragment);
    }
    out
}

/// A query key as the driver reads it: `+` is a space, `%XX` a byte.
fn decoded(key: &str) -> String {
    let bytes = key.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(high), Some(low)) => {
                    out.push((high * 16 + low) as u8);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn parse(value: &str) -> Result<DbLocation, clap::Error> {
        DbLocationParser.parse_ref(&clap::Command::new("t"), None, OsStr::new(value))
    }

    #[test]
    fn urls_are_told_from_paths_by_their_scheme() {
        assert!(matches!(parse("a.db"), Ok(DbLocation::File(p)) if p == Path::new("a.db")));
        assert!(matches!(
            parse("postgres:/not-a-url"),
            Ok(DbLocation::File(_))
        ));
        for url in [
            "postgres://u@localhost/db",
            "postgresql://localhost:5433/db?sslmode=disable",
            "POSTGRES://u:pw@localhost/db",
        ] {
            assert!(matches!(parse(url), Ok(DbLocation::Postgres(_))), "{url}");
        }
        assert!(parse("").is_err(), "an empty path is refused as before");
    }

    #[test]
    fn a_refused_url_is_not_quoted() {
        let error = parse("postgres://user:s3cret@host:notaport/db").unwrap_err();
        let text = error.render().to_string();
        assert!(text.contains("invalid PostgreSQL URL"), "{text}");
        assert!(!text.contains("s3cret"), "{text}");
    }

    #[test]
    fn an_unknown_parameter_is_refused_by_name_without_its_value() {
        let error = parse("postgres://h/db?sslmode=disable&passwd=s3cret").unwrap_err();
        let text = error.render().to_string();
        assert!(text.contains("\"passwd\""), "{text}");
        assert!(!text.contains("s3cret"), "{text}");
        for url in [
            "postgres://h/db?sslmode=disable&application_name=x&password=p",
            "postgres://h/db?options[statement_timeout]=5",
            "postgres://h/db?",
            "postgres://h/db?port=5433#x?y",
        ] {
            assert!(parse(url).is_ok(), "{url}");
        }
    }

    #[test]
    fn the_password_is_removed_and_nothing_else() {
        let cases = [
            ("postgres://u:pw@h:5432/db", "postgres://u@h:5432/db"),
            ("postgres://u@h/db", "postgres://u@h/db"),
            ("postgres://h/db", "postgres://h/db"),
            ("postgres://u:@h/db", "postgres://u@h/db"),
            ("postgres://:pw@h/db", "postgres://@h/db"),
            ("postgres://u:p@ss:w@h/db", "postgres://u@h/db"),
            ("postgresql://u:p%40w@h/db?x=1", "postgresql://u@h/db?x=1"),
            (
                "postgres://u@h/db?sslmode=disable&password=pw&application_name=a",
                "postgres://u@h/db?sslmode=disable&application_name=a",
            ),
            ("postgres://h/db?password=pw", "postgres://h/db"),
            ("postgres://h/db?pass%77ord=pw", "postgres://h/db"),
            ("postgres://h/db?passwords=1", "postgres://h/db?passwords=1"),
            ("postgres://u:pw@h", "postgres://u@h"),
            ("postgres://u:pw@h#frag", "postgres://u@h#frag"),
        ];
        for (url, expected) in cases {
            assert_eq!(without_password(url), expected, "{url}");
        }
        let location = parse("postgres://u:hunter2@h/db?password=hunter3").unwrap();
        assert_eq!(location.to_string(), "postgres://u@h/db");
        assert!(!format!("{location:?}").contains("hunter"));
    }

    #[test]
    fn query_keys_are_decoded_like_the_driver_does() {
        assert_eq!(decoded("pass%77ord"), "password");
        assert_eq!(decoded("a+b"), "a b");
        assert_eq!(decoded("100%"), "100%");
        assert_eq!(decoded("%zz"), "%zz");
        assert_eq!(decoded("%4"), "%4");
    }
}
