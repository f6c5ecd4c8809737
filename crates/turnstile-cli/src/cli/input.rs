//! A request's input: the argument, or stdin, checked before the database
//! is opened.

use std::io::Read;

use super::exit::CliError;
use turnstile::session::MAX_INPUT_BYTES;

/// The input from the argument or stdin; empty input is refused.
pub(super) fn read_input(arg: Option<String>) -> Result<String, CliError> {
    let input = match arg {
        Some(input) => input,
        None => {
            // One byte past the limit is enough to refuse: `yes | turnstile
            // run …` must not read without end.
            let mut input = String::new();
            std::io::stdin()
                .take(MAX_INPUT_BYTES as u64 + 1)
                .read_to_string(&mut input)
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::InvalidData => {
                        CliError::Usage("the input on stdin is not valid UTF-8".into())
                    }
                    _ => CliError::io("read the input from stdin")(e),
                })?;
            let end = input.trim_end_matches(['\n', '\r']).len();
            input.truncate(end);
            input
        }
    };
    if input.trim().is_empty() {
        return Err(CliError::Usage(
            "the input is empty: give it as an argument or on stdin".into(),
        ));
    }
    // Refused here, before the database is opened (or created).
    if input.len() > MAX_INPUT_BYTES {
        return Err(CliError::Usage(format!(
            "the input is over the {MAX_INPUT_BYTES}-byte limit"
        )));
    }
    Ok(input)
}
