//! A request's input: the argument, or stdin, and the files attached to
//! it, checked before the database is opened.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::exit::CliError;
use turnstile::session::MAX_INPUT_BYTES;
use turnstile::store::PartLimits;
use turnstile::{Attachment, Content, Part};

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

/// Files sent with the input: images as images, anything else as a file.
#[derive(clap::Args, Debug, Default)]
pub struct AttachArgs {
    /// A file to send with the input (repeatable): .png, .jpg, .jpeg, .gif
    /// and .webp go as images; .pdf, .txt, .md, .csv and .json as files
    /// with their names; any other type is refused. Stored once however
    /// many requests send it.
    #[arg(long = "attach", value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

impl AttachArgs {
    /// The input with the files after its text; each file is read now,
    /// before the database is opened, and refused past the default part
    /// limit.
    pub(super) fn content(&self, text: String) -> Result<Content, CliError> {
        if self.files.is_empty() {
            return Ok(Content::from(text));
        }
        let mut parts = vec![Part::text(text)];
        for path in &self.files {
            parts.push(attachment(path)?);
        }
        Ok(Content::new(parts))
    }
}

/// The files `--attach` takes, by extension: their media type, and whether
/// they go as an image.
const ACCEPTED: [(&str, &str, bool); 10] = [
    ("png", "image/png", true),
    ("jpg", "image/jpeg", true),
    ("jpeg", "image/jpeg", true),
    ("gif", "image/gif", true),
    ("webp", "image/webp", true),
    ("pdf", "application/pdf", false),
    ("txt", "text/plain", false),
    ("md", "text/markdown", false),
    ("csv", "text/csv", false),
    ("json", "application/json", false),
];

fn attachment(path: &Path) -> Result<Part, CliError> {
    let shown = path.display();
    let extension = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let Some(&(_, media_type, image)) = ACCEPTED
        .iter()
        .find(|(ext, _, _)| extension.as_deref() == Some(*ext))
    else {
        let accepted: Vec<&str> = ACCEPTED.iter().map(|(ext, _, _)| *ext).collect();
        return Err(CliError::Usage(format!(
            "--attach {shown}: unknown file type; accepted: .{}",
            accepted.join(", .")
        )));
    };
    let unreadable =
        |e: std::io::Error| CliError::Usage(format!("cannot read --attach {shown}: {e}"));
    // One byte past the limit is enough to refuse: the size a file reports
    // (none, for a device) is not trusted.
    let limit = PartLimits::DEFAULT_MAX_PART_BYTES;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(limit + 1).read_to_end(&mut bytes))
        .map_err(unreadable)?;
    if bytes.len() as u64 > limit {
        return Err(CliError::Usage(format!(
            "--attach {shown} holds over {limit} bytes, the limit of one part"
        )));
    }
    let attachment = Attachment::new(media_type, bytes)
        .map_err(|e| CliError::Usage(format!("--attach {shown}: {e}")))?;
    Ok(match image {
        true => Part::Image(attachment),
        false => {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            Part::File(attachment.with_name(name))
        }
    })
}
