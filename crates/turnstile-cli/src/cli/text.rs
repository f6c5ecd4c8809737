//! Text a person did not write, made safe to show: on a terminal (control
//! and reordering characters escaped) and in a command line to paste
//! (quoted for the shell).

/// Text from a model, a tool, a user or an endpoint, made safe for a
/// terminal: every control character but newline and tab, and every
/// character that reorders text (bidirectional overrides and isolates), is
/// written visibly as `\u{…}`, so no such text can set a window title,
/// write the clipboard, move the cursor or forge earlier lines. `--json`
/// and `export` print text exactly; only human output goes through this.
pub fn plain(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(unsafe_for_terminal) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut safe = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if unsafe_for_terminal(c) {
            safe.extend(c.escape_unicode());
        } else {
            safe.push(c);
        }
    }
    std::borrow::Cow::Owned(safe)
}

/// A control character (but newline and tab), or one that reorders text.
pub fn unsafe_for_terminal(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// `text` cut to `max` characters, on one line, made [`plain`].
pub fn clip(text: &str, max: usize) -> String {
    let text = plain(text);
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= max {
        flat
    } else {
        let cut: String = flat.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    }
}

/// What the user typed, quoted, as an error echoes it: once, on one line,
/// and cut after 60 characters so a huge bad value does not flood it.
pub fn echoed(typed: &str) -> String {
    format!("{:?}", clip(typed, 60))
}

/// A shell word that pastes and runs: as it is when it is plain,
/// single-quoted when it has spaces or shell characters, and ANSI-C quoted
/// (`$'…'`, bash and zsh) when it has line breaks, control or reordering
/// characters, so that a path with a newline, a tab or a bidi mark still
/// fits the one-line error (or a printed command line), which shows such
/// characters escaped.
pub fn quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else if word.chars().any(|c| c == '\n' || unsafe_for_terminal(c)) {
        let mut quoted = String::from("$'");
        for c in word.chars() {
            match c {
                '\'' => quoted.push_str("\\'"),
                '\\' => quoted.push_str("\\\\"),
                '\n' => quoted.push_str("\\n"),
                '\t' => quoted.push_str("\\t"),
                c if u32::from(c) < 0x80 && c.is_control() => {
                    quoted.push_str(&format!("\\x{:02x}", u32::from(c)))
                }
                c if unsafe_for_terminal(c) => quoted.push_str(&format!("\\u{:04x}", u32::from(c))),
                c => quoted.push(c),
            }
        }
        quoted.push('\'');
        quoted
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}
