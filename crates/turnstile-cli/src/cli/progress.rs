//! Live progress lines for a run: one line per durable step, as it happens.
//!
//! On a terminal a waiting step shows as a line that is replaced in place and
//! the model's answer appears word by word; otherwise every line is plain
//! text, written once and flushed (so a pipe reader sees it immediately).

use std::collections::HashMap;
use std::io::Write;

use super::exit::CliError;
use super::observe::Note;
use super::output::{clip, Style};
use turnstile::events::Event;
use turnstile::message::Usage;

/// Prints events and notes of one run.
pub struct Progress {
    style: Style,
    indent: String,
    /// Arguments and results of finished tool calls, until their
    /// `ToolFinished` event is printed.
    held: HashMap<String, (String, Result<String, String>)>,
    /// A replaceable line is on screen.
    transient: bool,
    /// Text deltas are being written on the current line.
    speaking: bool,
    /// The turn of the next model answer reported by a note (notes carry
    /// no turn of their own).
    next_model_turn: Option<u32>,
}

impl Progress {
    pub fn new(style: Style, indent: impl Into<String>) -> Self {
        Self {
            style,
            indent: indent.into(),
            held: HashMap::new(),
            transient: false,
            speaking: false,
            next_model_turn: None,
        }
    }

    /// Numbers the model answers reported by notes from `turn` on.
    pub fn counting_turns_from(mut self, turn: u32) -> Self {
        self.next_model_turn = Some(turn);
        self
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
                write!(out, "{text}")?;
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
            Event::ToolStarted { name, .. } if s.terminal => {
                self.transient_line(out, &s.dim(&format!("    running {name}…")))
            }
            Event::ToolFinished {
                call_id,
                name,
                is_error,
                reused,
                ..
            } => {
                let held = self.held.remove(call_id);
                let text = match (reused, held) {
                    (true, _) => format!("{name} · result reused from the journal, not run again"),
                    (false, Some((arguments, result))) => tool_line(name, &arguments, &result),
                    // Answered without running (unknown tool, bad
                    // arguments, timeout, panic): no note was sent.
                    (false, None) if *is_error => format!("{name} → error result"),
                    (false, None) => format!("{name} finished"),
                };
                let mark = if *is_error {
                    s.red("✗")
                } else {
                    s.green("✓")
                };
                self.line(out, &format!("    {mark} {text}"))
            }
            Event::CheckpointSaved { turn, revision } => self.line(
                out,
                &s.dim(&format!(
                    "    checkpoint saved · turn {turn} · revision {revision}"
                )),
            ),
            Event::ConversationCommitted {
                conversation_version,
                ..
            } => self.line(
                out,
                &s.green(&format!(
                    "committed · conversation version {conversation_version}"
                )),
            ),
            _ => Ok(()),
        }
    }

    /// A note from the observed model or tools. With an event stream the
    /// tool notes are held for their `ToolFinished` event and model notes are
    /// redundant; without one (resume, recovery) each note is a line.
    pub fn note(
        &mut self,
        out: &mut dyn Write,
        note: Note,
        streamed: bool,
    ) -> Result<(), CliError> {
        match (note, streamed) {
            (
                Note::Tool {
                    call_id,
                    arguments,
                    result,
                    ..
                },
                true,
            ) => {
                self.held.insert(call_id, (arguments, result));
                Ok(())
            }
            (Note::Model { .. }, true) => Ok(()),
            (Note::Model { tool_calls, usage }, false) => {
                let what = match tool_calls {
                    0 => "answered".to_owned(),
                    1 => "asked for 1 tool call".to_owned(),
                    n => format!("asked for {n} tool calls"),
                };
                let turn = match self.next_model_turn.as_mut() {
                    Some(turn) => {
                        *turn += 1;
                        format!("turn {} · ", *turn - 1)
                    }
                    None => String::new(),
                };
                self.line(out, &format!("{turn}model {what} · {}", tokens(&usage)))
            }
            (
                Note::Tool {
                    turn,
                    name,
                    arguments,
                    result,
                    ..
                },
                false,
            ) => {
                let mark = if result.is_ok() {
                    self.style.green("✓")
                } else {
                    self.style.red("✗")
                };
                // A tool round ends its turn: the next answer is the next turn.
                self.next_model_turn = Some(turn + 1);
                let text = tool_line(&name, &arguments, &result);
                self.line(out, &format!("    {mark} {text}"))
            }
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

fn tool_line(name: &str, arguments: &str, result: &Result<String, String>) -> String {
    match result {
        Ok(value) => format!("{name} {} → {}", clip(arguments, 60), clip(value, 40)),
        Err(error) => format!(
            "{name} {} → error: {}",
            clip(arguments, 60),
            clip(error, 60)
        ),
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
        progress
            .note(
                &mut out,
                Note::Tool {
                    turn: 1,
                    call_id: "c1".into(),
                    name: "add".into(),
                    arguments: r#"{"a":1,"b":2}"#.into(),
                    result: Ok("3".into()),
                },
                true,
            )
            .unwrap();
        for event in [
            Event::TurnStarted { turn: 1 },
            Event::TextDelta {
                turn: 1,
                text: "ignored ".into(),
            },
            Event::ToolFinished {
                turn: 1,
                call_id: "c1".into(),
                name: "add".into(),
                is_error: false,
                reused: false,
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
                "      checkpoint saved · turn 1 · revision 4",
            ]
        );
        assert!(!text.contains('\x1b'));
    }
}
