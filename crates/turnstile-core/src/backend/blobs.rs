//! What a backend writes and reads for images' and files' bytes: each
//! stored once, by SHA-256, in the transaction of the first message that
//! names it.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::error::Error;
use crate::message::{BlobHash, Content, Message};

/// The blobs the messages of one step name: the bytes to store (each
/// once), and the hashes of attachments given without their bytes, which
/// the store must already hold.
#[derive(Debug, Default)]
pub struct StepBlobs {
    /// Attachments with their bytes, by hash.
    pub loaded: BTreeMap<BlobHash, Arc<[u8]>>,
    /// Attachments given as references only (read back from a store),
    /// with the size each claims.
    pub referenced: Vec<(BlobHash, u64)>,
}

impl StepBlobs {
    /// The blobs `messages` name; `None` when they name none, so that a
    /// text-only step is written as it always was.
    pub fn of(messages: &[Message]) -> Option<Self> {
        Self::of_contents(messages.iter().map(Message::content))
    }

    /// The blobs these contents (a tool result's, say) name, as
    /// [`StepBlobs::of`].
    pub fn of_contents<'a>(contents: impl IntoIterator<Item = &'a Content>) -> Option<Self> {
        let mut blobs = Self::default();
        for attachment in contents.into_iter().flat_map(Content::attachments) {
            match attachment.bytes() {
                Some(bytes) => {
                    blobs
                        .loaded
                        .entry(attachment.sha256())
                        .or_insert_with(|| bytes.clone());
                }
                None => blobs
                    .referenced
                    .push((attachment.sha256(), attachment.size())),
            }
        }
        blobs
            .referenced
            .retain(|(hash, _)| !blobs.loaded.contains_key(hash));
        blobs.referenced.sort_unstable();
        blobs.referenced.dedup();
        (!blobs.loaded.is_empty() || !blobs.referenced.is_empty()).then_some(blobs)
    }

    /// Every hash named, loaded or referenced.
    pub fn hashes(&self) -> Vec<String> {
        self.loaded
            .keys()
            .chain(self.referenced.iter().map(|(hash, _)| hash))
            .map(BlobHash::to_hex)
            .collect()
    }
}

/// The refusal of a message naming a blob the store does not hold.
pub fn missing_blob(sha256: BlobHash) -> Error {
    Error::InvalidInput(format!(
        "a part names the attachment {sha256}, which this store does not hold: send the \
         attachment with its bytes"
    ))
}

/// The refusal of a reference that claims another size than the bytes it
/// names have: an edited reference, which would pass the part limits
/// unchecked and fail every later model call.
pub fn wrong_blob_size(sha256: BlobHash, claimed: u64, stored: u64) -> Error {
    Error::InvalidInput(format!(
        "a part names the attachment {sha256} as {claimed} bytes, but it holds {stored}: \
         send the reference as it was read back, or the attachment with its bytes"
    ))
}

/// A stored blob as read: its bytes, checked against the hash they are
/// stored under ([`Error::Corrupt`] if they differ).
pub fn checked_blob(sha256: BlobHash, bytes: Vec<u8>) -> Result<Arc<[u8]>, Error> {
    if BlobHash::of(&bytes) != sha256 {
        return Err(Error::Corrupt {
            table: "blobs",
            key: sha256.to_hex(),
            reason: "its bytes do not hash to its key".into(),
        });
    }
    Ok(Arc::from(bytes))
}
