//! Live progress lines for a run: one line per durable step, as it happens.
//!
//! On a terminal a waiting step shows as a line that is replaced in place and
//! the model's answer appears word by word; otherwise every line is plain
//! text, written once and flushed (so a pipe reader sees it immediately).

use std::io::Write;

use super::exit::CliError;
use super::output::{clip, plain, Style};
use turnstile::events::Event;
use turnstile::message::Usage;

/// Prints the events of one run.
pub struct Progress {
    style: Style,
    indent: String,
    /// The call id and arguments of the tool call running, until its
    /// `ToolFinished` event is printed.
    running: Option<(String, String)>,
    /// A replaceable line is on screen.
    transient: bool,
    /// Text deltas are being written on the current line.
    speaking: bool,
}

impl Progress {
    pub fn new(style: Style, indent: impl Into<String>) -> Self {
        Self {
            style,
            indent: indent.into(),
            running: None,
            transient: false,
            speaking: false,
        }
    }

    /// One event of a streamed run.
    pub fn event(&mut self, out: &mut dyn Write, event: &Event) -> Result<(), CliError> {
        let s = self.style;
        match event {
            Event::RunStarted {
                run_id,
                resumed_from,
                revision,
                ..
            } => {
                let mut text = format!("run {run_id} started · admission revision {revision}");
                if let Some(from) = resumed_from {
                    text.push_str(&format!(" · continues run {from}"));
                }
                self.line(out, &text)
            }
            Event::AgentChanged { from, to, .. } => {
                let short = |f: &str| f.chars().take(12).collect::<String>();
                self.line(
                    out,
                    &s.yellow(&format!(
                        "the agent changed: {} → {} (upgrade accepted)",
                        clip(&short(from), 12),
                        clip(&short(to), 12)
                    )),
                )
            }
            Event::TurnStarted { turn } => {
                if s.terminal {
                    self.transient_line(
                        out,
                        &s.dim(&format!("turn {turn} · waiting for the model…")),
                    )
                } else {
                    self.line(
                        out,
                        &format!("turn {turn} · write-ahead checkpoint saved, calling the model"),
                    )
                }
            }
            Event::TextDelta { turn, text } if s.terminal => {
                if !self.speaking {
                    self.clear(out)?;
                    write!(out, "{}turn {turn} · {}", self.indent, s.dim("answer: "))?;
                    self.speaking = true;
                }
                write!(out, "{}", plain(text))?;
                out.flush()?;
                Ok(())
            }
            Event::ModelResponded {
                turn,
                usage,
                tool_calls,
            } => {
                let what = match tool_calls {
                    0 => "answered".to_owned(),
                    1 => "asked for 1 tool call".to_owned(),
                    n => format!("asked for {n} tool calls"),
                };
                self.line(
                    out,
                    &format!("turn {turn} · model {what} · {}", tokens(usage)),
                )
            }
            Event::ToolStarted {
                call_id,
                name,
                arguments,
                ..
            } => {
                self.running = Some((call_id.clone(), arguments.clone()));
                match s.terminal {
                    true => self
                        .transient_line(out, &s.dim(&format!("    running {}…", clip(name, 60)))),
                    false => Ok(()),
                }
            }
            Event::ToolFinished {
                call_id,
                name,
                content,
                is_error,
                reused,
                ..
            } => {
                let arguments = match self.running.take() {
                    Some((running, arguments)) if running == *call_id => arguments,
                    _ => String::new(),
                };
                let text = match reused {
                    true => format!(
                        "{} · result reused from the journal, not run again",
                        clip(name, 60)
                    ),
                    false => tool_line(name, &arguments, content, *is_error),
                };
                let mark = if *is_error {
                    s.red("✗")
                } else {
                    s.green("✓")
                };
                self.line(out, &format!("    {mark} {text}"))
            }
            Event::ApprovalRequested {
                call_id,
                tool,
                arguments,
                ..
            } => self.line(
                out,
                &format!(
                    "    {} {} {} · awaits approval (call {})",
                    s.yellow("?"),
                    clip(tool, 60),
                    clip(arguments, 60),
                    clip(call_id, 60)
                ),
            ),
            Event::CheckpointSaved { turn, revision } => self.line(
                out,
                &s.dim(&format!(
                    "    checkpoint saved · turn {turn} · revision {revision}"
                )),
            ),
            // A replay did no work: the outcome shows it.
            Event::ConversationCommitted {
                outcome,
                conversation_version,
            } if !outcome.replayed => self.line(
                out,
                &s.green(&format!(
                    "committed · conversation version {conversation_version}"
                )),
            ),
            _ => Ok(()),
        }
    }

    /// Ends any line in progress.
    pub fn finish(&mut self, out: &mut dyn Write) -> Result<(), CliError> {
        self.clear(out)?;
        out.flush()?;
        Ok(())
    }

    fn line(&mut self, out: &mut dyn Write, text: &str) -> Result<(), CliError> {
        self.clear(out)?;
        writeln!(out, "{}{text}", self.indent)?;
        out.flush()?;
        Ok(())
    }

    fn transient_line(&mut self, out: &mut dyn Write, text: &str) -> Result<(), CliError> {
        self.clear(out)?;
        write!(out, "{}{text}", self.indent)?;
        out.flush()?;
        self.transient = true;
        Ok(())
    }

    fn clear(&mut self, out: &mut dyn Write) -> Result<(), CliError> {
        if self.speaking {
            writeln!(out)?;
            self.speaking = false;
        }
        if self.transient {
            write!(out, "\r\x1b[2K")?;
            self.transient = false;
        }
        Ok(())
    }
}

fn tool_line(name: &str, arguments: &str, content: &str, is_error: bool) -> String {
    // A call that never started (a rejected one) has no arguments here.
    let call = match arguments.is_empty() {
        true => clip(name, 60),
        false => format!("{} {}", clip(name, 60), clip(arguments, 60)),
    };
    match is_error {
        false => format!("{call} → {}", clip(content, 40)),
        true => format!("{call} → error: {}", clip(content, 60)),
    }
}

/// `in 182 · out 31 tokens`.
pub fn tokens(usage: &Usage) -> String {
    format!(
        "in {} · out {} tokens",
        usage.input_tokens, usage.output_tokens
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnstile::ids::Revision;

    #[test]
    fn plain_progress_is_one_flushed_line_per_step() {
        let mut out = Vec::new();
        let mut progress = Progress::new(Style::default(), "  ");
        for event in [
            Event::TurnStarted { turn: 1 },
            Event::TextDelta {
                turn: 1,
                text: "ignored ".into(),
            },
            Event::ToolStarted {
                turn: 1,
                call_id: "c1".into(),
                name: "add".into(),
                arguments: r#"{"a":1,"b":2}"#.into(),
            },
            Event::ToolFinished {
                turn: 1,
                call_id: "c1".into(),
                name: "add".into(),
                content: "3".into(),
                is_error: false,
                reused: false,
            },
            Event::ToolStarted {
                turn: 1,
                call_id: "c2".into(),
                name: "nope".into(),
                arguments: "{}".into(),
            },
            Event::ToolFinished {
                turn: 1,
                call_id: "c2".into(),
                name: "nope".into(),
                content: "unknown tool \"nope\"".into(),
                is_error: true,
                reused: false,
            },
            Event::ApprovalRequested {
                request_id: turnstile::ids::RequestId::new(),
                run_id: turnstile::ids::RunId::new(),
                call_id: "c3".into(),
                tool: "clock".into(),
                arguments: "{}".into(),
                revision: Revision(4),
            },
            Event::CheckpointSaved {
                turn: 1,
                revision: Revision(4),
            },
        ] {
            progress.event(&mut out, &event).unwrap();
        }
        progress.finish(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text.lines().collect::<Vec<_>>(),
            [
                "  turn 1 · write-ahead checkpoint saved, calling the model",
                r#"      ✓ add {"a":1,"b":2} → 3"#,
                r#"      ✗ nope {} → error: unknown tool "nope""#,
                "      ? clock {} · awaits approval (call c3)",
                "      checkpoint saved · turn 1 · revision 4",
            ]
        );
        assert!(!text.contains('\x1b'));
    }
}
