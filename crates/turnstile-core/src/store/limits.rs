//! How much one message may hold.

use crate::error::Error;
use crate::message::{Content, Message, Part};

/// Limits on a message's content, in bytes, that a store checks before it
/// writes a message: over a limit is [`Error::InvalidInput`] and nothing is
/// written. A part's size is its text (a text part), its text, signature
/// and redacted data (reasoning), its URL, or its bytes (an image or file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartLimits {
    /// The most one part may hold.
    pub max_part_bytes: u64,
    /// The most all of one message's parts may hold together.
    pub max_message_bytes: u64,
}

impl PartLimits {
    /// 20 MiB: what the large providers take as one image or document.
    pub const DEFAULT_MAX_PART_BYTES: u64 = 20 << 20;
    /// 64 MiB.
    pub const DEFAULT_MAX_MESSAGE_BYTES: u64 = 64 << 20;

    /// Checks every message; the first one over a limit is refused, saying
    /// which part of which message and what the limit is.
    pub fn check(&self, messages: &[Message]) -> Result<(), Error> {
        self.check_contents(messages.iter().map(Message::content))
    }

    /// Checks each content as [`PartLimits::check`] checks a message's (a
    /// tool result's, say).
    pub fn check_contents<'a>(
        &self,
        contents: impl IntoIterator<Item = &'a Content>,
    ) -> Result<(), Error> {
        for (index, content) in contents.into_iter().enumerate() {
            let mut total: u64 = 0;
            for (position, part) in content.parts().iter().enumerate() {
                let size = part_size(part);
                if size > self.max_part_bytes {
                    return Err(Error::InvalidInput(format!(
                        "part {position} of message {index} holds {size} bytes, over the \
                         limit of {} bytes per part: send less, or raise the store's \
                         part limits",
                        self.max_part_bytes
                    )));
                }
                total = total.saturating_add(size);
            }
            if total > self.max_message_bytes {
                return Err(Error::InvalidInput(format!(
                    "message {index} holds {total} bytes, over the limit of {} bytes per \
                     message: split it, or raise the store's part limits",
                    self.max_message_bytes
                )));
            }
        }
        Ok(())
    }
}

impl Default for PartLimits {
    fn default() -> Self {
        Self {
            max_part_bytes: Self::DEFAULT_MAX_PART_BYTES,
            max_message_bytes: Self::DEFAULT_MAX_MESSAGE_BYTES,
        }
    }
}

fn part_size(part: &Part) -> u64 {
    let len = |text: &Option<String>| text.as_ref().map_or(0, String::len) as u64;
    match part {
        Part::Text { text } => text.len() as u64,
        Part::Json { json } => json.as_str().len() as u64,
        Part::Reasoning(reasoning) => {
            len(&reasoning.text) + len(&reasoning.signature) + len(&reasoning.redacted)
        }
        Part::ImageUrl { url } => url.len() as u64,
        Part::Image(attachment) | Part::File(attachment) => attachment.size(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Attachment;

    #[test]
    fn a_part_or_a_message_over_its_limit_is_refused_naming_it() {
        let limits = PartLimits {
            max_part_bytes: 10,
            max_message_bytes: 15,
        };
        let image = |n: usize| Part::Image(Attachment::new("image/png", vec![7u8; n]).unwrap());
        assert!(limits
            .check(&[Message::user_parts(vec![image(10), Part::text("12345")])])
            .is_ok());
        let Err(Error::InvalidInput(part)) =
            limits.check(&[Message::user("ok"), Message::user_parts(vec![image(11)])])
        else {
            panic!("an 11-byte part is over 10");
        };
        assert!(part.contains("part 0 of message 1"), "{part}");
        let Err(Error::InvalidInput(message)) =
            limits.check(&[Message::user_parts(vec![image(10), Part::text("123456")])])
        else {
            panic!("16 bytes in one message is over 15");
        };
        assert!(message.contains("message 0 holds 16 bytes"), "{message}");
    }
}
