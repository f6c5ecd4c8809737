//! One message as `show` and `checkpoints` print it: its text, its parts
//! marked by what they are, its tool calls.

use std::io::Write;

use crate::cli::exit::CliError;
use crate::cli::output::{self, Style};
use turnstile::message::{Message, Part, Reasoning};

/// `label role  text` (the label `#seq`, say); tool calls as
/// `→ name(arguments) [id]`; continuation lines indented under the text;
/// reasoning's text only when asked for.
pub(super) fn message(
    out: &mut dyn Write,
    style: Style,
    label: &str,
    message: &Message,
    show_reasoning: bool,
) -> Result<(), CliError> {
    let head = format!("{label:>4}  {:<9}  ", message.role());
    let pad = " ".repeat(head.chars().count());
    let text = message.text();
    let content = output::plain(&text);
    // Reasoning is marked, and shown only when asked for: it is the
    // provider's, kept to be sent back.
    let mut lines: Vec<String> = Vec::new();
    for reasoning in message.content().reasoning() {
        lines.push(style.dim(&reasoning_mark(reasoning)));
        if let (true, Some(text)) = (show_reasoning, &reasoning.text) {
            lines.extend(output::plain(text).lines().map(|l| style.dim(l)));
        }
    }
    lines.extend(content.lines().map(str::to_owned));
    // Images and files by what they are; their bytes are not read.
    lines.extend(
        message
            .content()
            .parts()
            .iter()
            .filter_map(part_mark)
            .map(|mark| style.dim(&output::plain(&mark))),
    );
    match message {
        Message::Assistant { tool_calls, .. } => {
            lines.extend(tool_calls.iter().map(|call| {
                style.cyan(&output::plain(&format!(
                    "→ {}({}) [{}]",
                    call.name, call.arguments, call.id
                )))
            }));
        }
        Message::Tool {
            call_id, is_error, ..
        } => {
            let call_id = output::plain(call_id);
            let tag = if *is_error {
                style.red(&format!("[{call_id}] error:"))
            } else {
                style.dim(&format!("[{call_id}]"))
            };
            match lines.first_mut() {
                Some(first) => *first = format!("{tag} {first}"),
                None => lines.push(tag),
            }
        }
        _ => {}
    }
    if lines.is_empty() {
        lines.push(String::new());
    }
    for (i, line) in lines.iter().enumerate() {
        let lead = if i == 0 { head.as_str() } else { pad.as_str() };
        writeln!(out, "{}", format!("{lead}{line}").trim_end())?;
    }
    Ok(())
}

/// `[image image/png 34 KiB sha256:ab12cd34]`: what an image or file part
/// is; `None` for text and reasoning.
fn part_mark(part: &Part) -> Option<String> {
    let (kind, attachment) = match part {
        Part::Image(attachment) => ("image", attachment),
        Part::File(attachment) => ("file", attachment),
        Part::ImageUrl { url } => return Some(format!("[image {url}]")),
        Part::Text { .. } | Part::Json { .. } | Part::Reasoning(_) => return None,
    };
    let hex = attachment.sha256().to_hex();
    let name = attachment
        .name()
        .map(|n| format!("{n} "))
        .unwrap_or_default();
    Some(format!(
        "[{kind} {name}{} {} sha256:{}]",
        attachment.media_type(),
        size_words(attachment.size()),
        &hex[..8]
    ))
}

/// `12 bytes`, `34 KiB`, `1.5 MiB`.
fn size_words(n: u64) -> String {
    match n {
        n if n < 1024 => format!("{n} bytes"),
        n if n < 1024 * 1024 => format!("{} KiB", n.div_ceil(1024)),
        n => format!("{:.1} MiB", n as f64 / (1024.0 * 1024.0)),
    }
}

/// `[reasoning anthropic 1234 bytes, signed]`: what a reasoning part holds.
fn reasoning_mark(reasoning: &Reasoning) -> String {
    let bytes = [&reasoning.text, &reasoning.redacted]
        .into_iter()
        .flatten()
        .map(String::len)
        .sum::<usize>();
    let redacted = if reasoning.redacted.is_some() {
        ", redacted"
    } else {
        ""
    };
    let signed = if reasoning.signature.is_some() {
        ", signed"
    } else {
        ""
    };
    let provider = output::plain(&reasoning.provider);
    format!("[reasoning {provider} {bytes} bytes{redacted}{signed}]")
}
