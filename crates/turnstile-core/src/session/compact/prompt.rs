//! Summary compaction: the pass limit, the summary model's prompt, the
//! message that carries a summary into the main model's context, and where
//! one pass's batch ends.
//!
//! How it runs is in the parent module; what is stored is in
//! [`Store::commit_summary`](crate::Store::commit_summary).

use std::borrow::Cow;
use std::fmt;

use sha2::{Digest, Sha256};

use crate::error::Error;
use crate::message::{Content, Message, Part};
use crate::store::TranscriptEntry;

/// The largest summary accepted, in bytes (256 KiB). A larger or empty
/// answer of the summary model is refused with [`Error::InvalidSummary`].
pub const MAX_SUMMARY_BYTES: usize = 256 * 1024;

/// The summary agent's instructions when its system prompt is empty.
pub const DEFAULT_SUMMARY_PROMPT: &str = "You keep a running summary of a conversation between \
a user and an AI assistant. You get the summary so far (if any) and the next part of the \
conversation. Answer with one updated summary that keeps every fact, decision, open question \
and tool result the assistant may need later, and nothing else.";

/// How the main model's context introduces the latest summary.
pub const SUMMARY_HEADING: &str = "Summary of the earlier conversation:";

/// How many summary passes one request may run, counted across its resumes
/// and recoveries: 1–256.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MaxPasses(u16);

impl MaxPasses {
    /// The smallest limit accepted.
    pub const MIN: u32 = 1;
    /// The largest limit accepted.
    pub const MAX: u32 = 256;

    /// Validates a pass limit.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] outside 1–256.
    pub fn new(passes: u32) -> Result<Self, Error> {
        if !(Self::MIN..=Self::MAX).contains(&passes) {
            return Err(Error::InvalidInput(format!(
                "max summary passes must be {}-{}, got {passes}",
                Self::MIN,
                Self::MAX
            )));
        }
        // In range, so it fits.
        Ok(Self(passes as u16))
    }

    /// The limit.
    pub fn get(self) -> u32 {
        u32::from(self.0)
    }
}

impl TryFrom<u32> for MaxPasses {
    type Error = Error;

    fn try_from(passes: u32) -> Result<Self, Error> {
        Self::new(passes)
    }
}

impl fmt::Display for MaxPasses {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The message that puts a summary into the main model's context, right
/// after the system prompt.
pub(in crate::session) fn context_message(summary: &str) -> Message {
    Message::system(format!("{SUMMARY_HEADING}\n{summary}"))
}

/// What the summary model is given: its system prompt, the previous summary
/// (if any) and the batch rendered as text, one entry per paragraph.
pub(super) fn prompt(
    system_prompt: &str,
    previous: Option<&str>,
    batch: &[TranscriptEntry],
) -> Vec<Message> {
    let system = if system_prompt.is_empty() {
        DEFAULT_SUMMARY_PROMPT
    } else {
        system_prompt
    };
    let mut messages = vec![Message::system(system)];
    if let Some(previous) = previous {
        messages.push(context_message(previous));
    }
    let (first, last) = match (batch.first(), batch.last()) {
        (Some(first), Some(last)) => (first.seq, last.seq),
        _ => (0, 0),
    };
    let mut text = format!("Conversation entries {first} to {last}, to add to the summary:\n");
    for entry in batch {
        text.push('\n');
        render(&mut text, entry);
    }
    messages.push(Message::user(text));
    messages
}

/// SHA-256 of a prompt, recorded with its pass: a pass re-run after a crash
/// must send the same prompt.
pub(super) fn prompt_sha256(messages: &[Message]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for message in messages {
        // Role and length prefix the text, so no two prompts hash alike by
        // moving text between messages.
        // Plain text hashes as its bytes (as before parts existed, so a pass
        // in flight keeps its hash across an upgrade), other content as its
        // JSON.
        let content = match message.content().as_plain_text() {
            Some(text) => std::borrow::Cow::Borrowed(text),
            None => std::borrow::Cow::Owned(
                serde_json::to_string(message.content()).unwrap_or_default(),
            ),
        };
        hasher.update(message.role().as_bytes());
        hasher.update((content.len() as u64).to_le_bytes());
        hasher.update(content.as_bytes());
    }
    hasher.finalize().into()
}

fn render(out: &mut String, entry: &TranscriptEntry) {
    let seq = entry.seq;
    match &entry.message {
        Message::System { content } => {
            out.push_str(&format!("#{seq} system: {}\n", summarized(content)))
        }
        Message::User { content } => {
            out.push_str(&format!("#{seq} user: {}\n", summarized(content)))
        }
        Message::Assistant {
            content,
            tool_calls,
            ..
        } => {
            let text = summarized(content);
            if !text.is_empty() || tool_calls.is_empty() {
                out.push_str(&format!("#{seq} assistant: {text}\n"));
            }
            for call in tool_calls {
                out.push_str(&format!(
                    "#{seq} assistant calls tool {} ({}) with {}\n",
                    call.name, call.id, call.arguments
                ));
            }
        }
        Message::Tool {
            call_id,
            content,
            is_error,
        } => {
            let what = if *is_error { "error" } else { "result" };
            let text = summarized(content);
            out.push_str(&format!("#{seq} tool {what} for {call_id}: {text}\n"));
        }
    }
}

/// Content as a summary pass reads it: its text and JSON, with each image
/// or file described by its placeholder (`[image: image/png, 34 KiB]`). Reasoning
/// is never summarized into a later prompt.
fn summarized(content: &Content) -> Cow<'_, str> {
    if let Some(text) = content.as_plain_text() {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        content
            .parts()
            .iter()
            .filter_map(Part::as_text_or_placeholder)
            .collect(),
    )
}

/// Checks a summary model's answer.
pub(super) fn check_output(content: &str) -> Result<(), String> {
    if content.trim().is_empty() {
        return Err("the summary is empty".into());
    }
    if content.len() > MAX_SUMMARY_BYTES {
        return Err(format!(
            "the summary of {} bytes exceeds the {MAX_SUMMARY_BYTES}-byte limit",
            content.len()
        ));
    }
    Ok(())
}

/// How many of `entries` (consecutive, starting at a batch's first entry)
/// one pass absorbs: `batch`, or more when the entries right after would be
/// tool results, so a tool call is never summarized apart from its results
/// (the context after a summary never opens with an orphaned result).
/// `entries` must reach at least one past the batch when there is more
/// transcript, so the entry after it can be looked at.
pub(super) fn batch_len(entries: &[TranscriptEntry], batch: usize) -> usize {
    let mut end = batch.min(entries.len());
    while entries
        .get(end)
        .is_some_and(|e| matches!(e.message, Message::Tool { .. }))
    {
        end += 1;
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::RequestId;
    use crate::message::ToolCall;

    fn entries(messages: Vec<Message>) -> Vec<TranscriptEntry> {
        let request_id = RequestId::new();
        messages
            .into_iter()
            .enumerate()
            .map(|(seq, message)| TranscriptEntry {
                seq: seq as u64,
                request_id,
                message,
            })
            .collect()
    }

    fn tool(id: &str) -> Message {
        Message::tool(id, "ok", false)
    }

    fn calls(ids: &[&str]) -> Message {
        Message::assistant_with_calls(
            "",
            ids.iter()
                .map(|id| ToolCall::new(*id, "t", serde_json::json!({})))
                .collect(),
        )
    }

    #[test]
    fn max_passes_accepts_1_to_256_only() {
        assert!(MaxPasses::new(0).is_err());
        assert_eq!(MaxPasses::new(1).unwrap().get(), 1);
        assert_eq!(MaxPasses::new(256).unwrap().get(), 256);
        assert!(MaxPasses::new(257).is_err());
        assert!(MaxPasses::try_from(u32::MAX).is_err());
    }

    #[test]
    fn a_batch_is_extended_over_the_tool_results_of_its_last_call() {
        let e = entries(vec![
            Message::user("q"),
            calls(&["a", "b"]),
            tool("a"),
            tool("b"),
            Message::assistant("done"),
            Message::user("q2"),
        ]);
        assert_eq!(batch_len(&e, 2), 4);
        assert_eq!(batch_len(&e, 3), 4);
        assert_eq!(batch_len(&e, 4), 4);
        assert_eq!(batch_len(&e, 1), 1);
        assert_eq!(batch_len(&e[..2], 2), 2);
    }

    #[test]
    fn empty_and_oversize_summaries_are_refused() {
        assert!(check_output("  \n").is_err());
        assert!(check_output(&"x".repeat(MAX_SUMMARY_BYTES + 1)).is_err());
        assert!(check_output(&"x".repeat(MAX_SUMMARY_BYTES)).is_ok());
    }

    #[test]
    fn the_prompt_holds_the_previous_summary_and_every_entry_of_the_batch() {
        let e = entries(vec![Message::user("hello"), calls(&["a"]), tool("a")]);
        let prompt = prompt("", Some("before"), &e);
        assert_eq!(prompt.len(), 3);
        assert_eq!(prompt[0].text(), DEFAULT_SUMMARY_PROMPT);
        assert!(prompt[1].text().ends_with("before"));
        let text = prompt[2].text();
        assert!(text.contains("#0 user: hello"));
        assert!(text.contains("#1 assistant calls tool t (a)"));
        assert!(text.contains("#2 tool result for a: ok"));
        assert_ne!(
            prompt_sha256(&prompt),
            prompt_sha256(&super::prompt("", None, &e))
        );
    }

    #[test]
    fn images_and_files_are_described_not_sent_to_a_summary() {
        let image = crate::message::Attachment::new("image/png", vec![9u8; 34 * 1024]).unwrap();
        let file = crate::message::Attachment::new("application/pdf", vec![1u8; 10])
            .unwrap()
            .with_name("q3.pdf");
        let e = entries(vec![Message::user_parts(vec![
            Part::text("look at "),
            Part::Image(image),
            Part::File(file),
        ])]);
        let text = prompt("", None, &e)[1].text().into_owned();
        assert!(
            text.contains("#0 user: look at [image: image/png, 34 KiB][file: q3.pdf, application/pdf, 10 bytes]"),
            "{text}"
        );
    }

    #[test]
    fn reasoning_is_not_summarized_and_plain_text_hashes_as_its_bytes() {
        let thought = Message::Assistant {
            content: crate::message::Content::new(vec![
                crate::message::Part::Reasoning(crate::message::Reasoning {
                    provider: "anthropic".into(),
                    text: Some("private chain of thought".into()),
                    signature: Some("sig".into()),
                    redacted: None,
                }),
                crate::message::Part::text("the answer"),
            ]),
            tool_calls: Vec::new(),
            provider_metadata: None,
        };
        let e = entries(vec![Message::user("q"), thought]);
        let text = prompt("", None, &e)[1].text().into_owned();
        assert!(text.contains("#1 assistant: the answer"), "{text}");
        assert!(!text.contains("private") && !text.contains("sig"), "{text}");

        // The hash of a plain text prompt is the one passes in flight
        // recorded before content had parts: role, length, bytes.
        let plain = [Message::user("hi")];
        let mut hasher = Sha256::new();
        hasher.update(b"user");
        hasher.update(2u64.to_le_bytes());
        hasher.update(b"hi");
        assert_eq!(prompt_sha256(&plain), <[u8; 32]>::from(hasher.finalize()));
    }
}
