//! API keys: read from the environment, never shown.

use std::fmt;

use turnstile_core::ModelError;

/// The API key in the environment variable `key_var`, surrounding
/// whitespace trimmed. Keys are taken from the environment, never from
/// arguments, so they stay out of shell histories and process listings.
///
/// # Errors
/// A fatal [`ModelError`] naming the variable (never its value) when the
/// name is not a valid variable name, or the variable is unset, empty or
/// not valid Unicode.
pub fn api_key_from_env(key_var: &str) -> Result<String, ModelError> {
    if key_var.is_empty() || key_var.contains(['=', '\0']) {
        return Err(ModelError::fatal(format!(
            "invalid environment variable name {key_var:?} for the api key"
        )));
    }
    let key = match std::env::var(key_var) {
        Ok(key) => key,
        Err(std::env::VarError::NotPresent) => {
            return Err(ModelError::fatal(format!(
                "environment variable {key_var} (the api key) is not set"
            )))
        }
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(ModelError::fatal(format!(
                "environment variable {key_var} (the api key) is not valid unicode"
            )))
        }
    };
    let key = key.trim();
    if key.is_empty() {
        return Err(ModelError::fatal(format!(
            "environment variable {key_var} (the api key) is empty"
        )));
    }
    Ok(key.to_owned())
}

/// `text` with every occurrence of `key` replaced by `[redacted]` (for a
/// server that echoes the key back in an error body).
pub fn redact(key: Option<&str>, text: &str) -> String {
    match key.filter(|k| !k.is_empty()) {
        Some(key) => text.replace(key, "[redacted]"),
        None => text.to_owned(),
    }
}

/// `url` with any password in it (`https://user:secret@host`) replaced by
/// `REDACTED`: for anything that shows a base URL (a `Debug`, a printed
/// command line).
pub fn redacted_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("REDACTED"));
            parsed.to_string()
        }
        _ => url.to_owned(),
    }
}

/// Shows a secret as `<redacted>` in `Debug` output.
pub struct Redacted;

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}
