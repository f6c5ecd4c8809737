//! Rendering: aligned key–value tables for people, JSON for scripts, and
//! colour only on a terminal.

use std::io::Write;

use serde::Serialize;

use super::exit::CliError;
pub use super::text::{clip, plain};
use turnstile::ids::RunId;
use turnstile::message::Usage;
use turnstile::outcome::Outcome;

/// How output is rendered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Style {
    /// Stdout is a terminal: colour, and progress lines that update in place.
    pub terminal: bool,
}

impl Style {
    fn paint(self, code: &str, text: &str) -> String {
        if self.terminal {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }

    pub fn bold(self, text: &str) -> String {
        self.paint("1", text)
    }

    pub fn dim(self, text: &str) -> String {
        self.paint("2", text)
    }

    pub fn green(self, text: &str) -> String {
        self.paint("32", text)
    }

    pub fn yellow(self, text: &str) -> String {
        self.paint("33", text)
    }

    pub fn red(self, text: &str) -> String {
        self.paint("31", text)
    }

    pub fn cyan(self, text: &str) -> String {
        self.paint("36", text)
    }
}

/// Writes `value` as one line of JSON.
pub fn json(out: &mut dyn Write, value: &impl Serialize) -> Result<(), CliError> {
    let text = serde_json::to_string(value)
        .map_err(|e| CliError::Failed(format!("cannot encode the output as json: {e}")))?;
    writeln!(out, "{text}")?;
    Ok(())
}

/// Writes rows as an aligned two-column table, each line after `indent`.
/// A value's continuation lines are indented under its first, as `show`
/// indents a message's: a model's multi-line answer cannot start a line of
/// its own that would read as another row (`error: …`, `status …`).
pub fn table(out: &mut dyn Write, indent: &str, rows: &[(&str, String)]) -> Result<(), CliError> {
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let pad = " ".repeat(width + 2);
    for (key, value) in rows {
        let mut lines = value.split('\n');
        let first = lines.next().unwrap_or_default();
        writeln!(out, "{indent}{key:<width$}  {first}")?;
        for line in lines {
            writeln!(out, "{}", format!("{indent}{pad}{line}").trim_end())?;
        }
    }
    Ok(())
}

/// `in 182 · out 31 tokens`, plus cache tokens when there are any.
pub fn usage(usage: &Usage) -> String {
    let mut text = format!(
        "in {} · out {} tokens (total {})",
        usage.input_tokens,
        usage.output_tokens,
        usage.total()
    );
    if usage.cache_read_tokens > 0 || usage.cache_write_tokens > 0 {
        text.push_str(&format!(
            " · cache read {} · cache write {}",
            usage.cache_read_tokens, usage.cache_write_tokens
        ));
    }
    text
}

/// The human table of a committed (or replayed) request. `revision` is the
/// admission's revision read after the commit, when known.
pub fn outcome(
    out: &mut dyn Write,
    style: Style,
    outcome: &Outcome,
    revision: Option<u64>,
    resumed_from: Option<RunId>,
) -> Result<(), CliError> {
    let status = if outcome.replayed {
        style.cyan("replayed (stored answer; no model or tool work)")
    } else {
        style.green("committed")
    };
    let mut version = format!("conversation version {}", outcome.conversation_version);
    if let Some(revision) = revision {
        version.push_str(&format!(" · admission revision {revision}"));
    }
    let run = match resumed_from {
        Some(from) => format!("{} (resumed from run {from})", outcome.run_id),
        None => outcome.run_id.to_string(),
    };
    table(
        out,
        "",
        &[
            ("status", status),
            ("request", outcome.request_id.to_string()),
            ("run", run),
            ("answer", plain(&outcome.final_text).into_owned()),
            ("turns", outcome.turns.to_string()),
            ("tool calls", outcome.tool_calls.to_string()),
            ("usage", usage(&outcome.usage)),
            ("version", version),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_escapes_control_and_reordering_characters_and_keeps_the_rest() {
        assert_eq!(plain("héllo\n\tworld"), "héllo\n\tworld");
        assert_eq!(plain("a\u{1b}]52;c;x\u{7}b"), "a\\u{1b}]52;c;x\\u{7}b");
        assert_eq!(
            plain("\r\u{7f}\u{9b}\u{202e}"),
            "\\u{d}\\u{7f}\\u{9b}\\u{202e}"
        );
        assert!(matches!(plain("safe"), std::borrow::Cow::Borrowed(_)));
    }

    #[test]
    fn a_multi_line_value_is_indented_under_its_row() {
        let mut out = Vec::new();
        let rows = [
            ("answer", "fine\nerror: forged\n\nstatus  forged".to_owned()),
            ("turns", "2".to_owned()),
        ];
        table(&mut out, "", &rows).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "answer  fine\n        error: forged\n\n        status  forged\nturns   2\n"
        );
    }

    #[test]
    fn clip_flattens_and_cuts() {
        assert_eq!(clip("a\nb  c", 10), "a b c");
        assert_eq!(clip("abcdefghij", 5), "abcd…");
    }

    #[test]
    fn plain_style_writes_no_escape_codes() {
        let plain = Style::default();
        assert_eq!(plain.bold("x"), "x");
        assert!(Style { terminal: true }.bold("x").contains('\x1b'));
    }
}
