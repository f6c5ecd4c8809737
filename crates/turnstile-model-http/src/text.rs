//! Error text that says what went wrong without quoting what the server or
//! the model sent: errors are logged and stored.

use serde_json::error::Category;
use serde_json::Value;

/// Describes a decoding error by its category and position and by what was
/// `expected`. Never by serde's own message: it quotes the offending value,
/// which is model output.
pub fn decode_error(e: &serde_json::Error, expected: &str) -> String {
    let what = match e.classify() {
        Category::Io => "read error",
        Category::Syntax => "invalid json",
        Category::Data => "invalid type or value",
        Category::Eof => "unexpected end of input",
    };
    format!(
        "{what} at line {} column {} (expected {expected})",
        e.line(),
        e.column()
    )
}

/// How a value's kind is named in an error (never the value itself).
pub fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// At most `max` characters of `text`, whitespace collapsed.
pub fn excerpt(text: &str, max: usize) -> String {
    let collapsed = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match collapsed.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &collapsed[..cut]),
        None => collapsed,
    }
}

/// An error and its sources, joined by `: `.
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let part = e.to_string();
        if !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn decode_errors_do_not_quote_the_input() {
        const MARK: &str = "MALFORMED-CHUNK-MARK";
        let serde =
            serde_json::from_str::<Vec<u32>>(&json!([1, format!("private {MARK}")]).to_string())
                .unwrap_err();
        let detail = decode_error(&serde, "a list of numbers");
        assert!(
            detail.starts_with("invalid type or value at line 1 column "),
            "{detail}"
        );
        assert!(!detail.contains(MARK), "{detail}");
    }

    #[test]
    fn excerpts_cut_on_char_boundaries() {
        assert_eq!(excerpt("  é\n\té  é ", 3), "é é…");
        assert_eq!(excerpt("short", 10), "short");
    }
}
