//! The messages a model call is given: the context's newest images and
//! every file with their bytes loaded from the store (once per run), each
//! older image as a text placeholder saying what it was.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use crate::error::Error;
use crate::message::{Attachment, BlobHash, Message, Part};
use crate::store::Store;

/// Loads, in place, the bytes of the attachments the model is shown: every
/// file, and the newest `images` images. The bytes stay with the messages
/// for the run's later turns.
pub(super) async fn load_shown(
    store: &dyn Store,
    context: &mut [Message],
    images: usize,
) -> Result<(), Error> {
    let mut seen_images = 0usize;
    let mut read: HashMap<BlobHash, Arc<[u8]>> = HashMap::new();
    for message in context.iter_mut().rev() {
        for part in message.content_mut().parts_mut().iter_mut().rev() {
            let attachment = match part {
                Part::Image(attachment) => {
                    seen_images += 1;
                    if seen_images > images {
                        continue;
                    }
                    attachment
                }
                Part::ImageUrl { .. } => {
                    seen_images += 1;
                    continue;
                }
                Part::File(attachment) => attachment,
                Part::Text { .. } | Part::Json { .. } | Part::Reasoning(_) => continue,
            };
            if attachment.bytes().is_some() {
                continue;
            }
            let bytes = match read.get(&attachment.sha256()) {
                Some(bytes) => bytes.clone(),
                None => {
                    let bytes = store
                        .blob(attachment.sha256())
                        .await?
                        .ok_or_else(|| unstored(attachment, "the store does not hold it"))?;
                    read.insert(attachment.sha256(), bytes.clone());
                    bytes
                }
            };
            attachment
                .load(bytes)
                .map_err(|_| unstored(attachment, "its stored size differs"))?;
        }
    }
    Ok(())
}

/// The context as the model is sent it: images past the newest `images`
/// replaced by their placeholders. A context with no more images than that
/// is sent as it is, without a copy.
pub(super) fn shown(context: &[Message], images: usize) -> Cow<'_, [Message]> {
    let in_context = context
        .iter()
        .flat_map(|message| message.content().parts())
        .filter(|part| is_image(part))
        .count();
    if in_context <= images {
        return Cow::Borrowed(context);
    }
    let mut context = context.to_vec();
    let mut seen_images = 0usize;
    for message in context.iter_mut().rev() {
        for part in message.content_mut().parts_mut().iter_mut().rev() {
            if is_image(part) {
                seen_images += 1;
                if seen_images > images {
                    if let Some(placeholder) = part.placeholder() {
                        *part = Part::text(placeholder);
                    }
                }
            }
        }
    }
    Cow::Owned(context)
}

fn is_image(part: &Part) -> bool {
    matches!(part, Part::Image(_) | Part::ImageUrl { .. })
}

fn unstored(attachment: &Attachment, reason: &str) -> Error {
    Error::Corrupt {
        table: "blobs",
        key: attachment.sha256().to_hex(),
        reason: format!("a message names this attachment and {reason}"),
    }
}
