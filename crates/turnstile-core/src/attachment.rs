//! Images and files in a message: their bytes are stored once per store,
//! by SHA-256, and a message holds a reference to them.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

use crate::error::Error;

/// The SHA-256 of an attachment's bytes: the key its bytes are stored
/// under. Written as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlobHash([u8; 32]);

impl BlobHash {
    /// The hash of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }

    /// The hash's 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The hash as 64 lowercase hex digits, as it is stored.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// A hash from its 64 hex digits.
    pub fn from_hex(text: &str) -> Result<Self, Error> {
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(text, &mut bytes)
            .map_err(|_| Error::InvalidInput(format!("{text:?} is not a SHA-256 in hex")))?;
        Ok(Self(bytes))
    }
}

impl fmt::Display for BlobHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for BlobHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlobHash({self})")
    }
}

impl Serialize for BlobHash {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for BlobHash {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        BlobHash::from_hex(&text).map_err(serde::de::Error::custom)
    }
}

/// An image's or a file's bytes with their media type (and a file's
/// name): what an image or file part holds.
///
/// A message read back from a store holds the attachment's reference
/// (hash, size, media type) without its bytes, so reading a transcript
/// costs nothing per image; the session loads the bytes of what it sends
/// to a model ([`Store::blob`](crate::Store::blob)). As JSON it is its
/// reference only: the bytes are stored beside the message, once.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attachment {
    media_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    sha256: BlobHash,
    size: u64,
    #[serde(skip)]
    bytes: Option<Arc<[u8]>>,
}

impl Attachment {
    /// An attachment of these bytes, of this media type (such as
    /// `image/png` or `application/pdf`).
    pub fn new(media_type: impl Into<String>, bytes: impl Into<Arc<[u8]>>) -> Result<Self, Error> {
        let media_type = media_type.into();
        if media_type.trim().is_empty() || media_type.chars().any(char::is_control) {
            return Err(Error::InvalidInput(format!(
                "an attachment's media type must be a type such as image/png, got {media_type:?}"
            )));
        }
        let bytes: Arc<[u8]> = bytes.into();
        Ok(Self {
            media_type,
            name: None,
            sha256: BlobHash::of(&bytes),
            size: bytes.len() as u64,
            bytes: Some(bytes),
        })
    }

    /// The same attachment with a file name.
    pub fn with_name(self, name: impl Into<String>) -> Self {
        Self {
            name: Some(name.into()),
            ..self
        }
    }

    /// Its media type.
    pub fn media_type(&self) -> &str {
        &self.media_type
    }

    /// Its file name, if it was given one.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The SHA-256 of its bytes.
    pub fn sha256(&self) -> BlobHash {
        self.sha256
    }

    /// The length of its bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Its bytes, when they are loaded: always for an attachment made with
    /// [`Attachment::new`], once the session loaded them for one read
    /// back.
    pub fn bytes(&self) -> Option<&Arc<[u8]>> {
        self.bytes.as_ref()
    }

    /// Gives a reference read back its bytes; refused (and nothing
    /// changes) unless they are the bytes it names.
    pub fn load(&mut self, bytes: Arc<[u8]>) -> Result<(), Error> {
        if bytes.len() as u64 != self.size || BlobHash::of(&bytes) != self.sha256 {
            return Err(Error::InvalidInput(format!(
                "these {} bytes are not the attachment {} ({} bytes)",
                bytes.len(),
                self.sha256,
                self.size
            )));
        }
        self.bytes = Some(bytes);
        Ok(())
    }

    /// A short description of it, as a summary or a placeholder shows it:
    /// `image/png, 34 KiB`.
    pub fn describe(&self) -> String {
        let size = match self.size {
            n if n < 1024 => format!("{n} bytes"),
            n if n < 1024 * 1024 => format!("{} KiB", n.div_ceil(1024)),
            n => format!("{:.1} MiB", n as f64 / (1024.0 * 1024.0)),
        };
        match &self.name {
            Some(name) => format!("{name}, {}, {size}", self.media_type),
            None => format!("{}, {size}", self.media_type),
        }
    }
}

/// Equal when they name the same bytes with the same media type and name,
/// whether or not their bytes are loaded.
impl PartialEq for Attachment {
    fn eq(&self, other: &Self) -> bool {
        self.sha256 == other.sha256
            && self.size == other.size
            && self.media_type == other.media_type
            && self.name == other.name
    }
}

impl Eq for Attachment {}

impl fmt::Debug for Attachment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Attachment")
            .field("media_type", &self.media_type)
            .field("name", &self.name)
            .field("sha256", &self.sha256)
            .field("size", &self.size)
            .field("loaded", &self.bytes.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attachment_is_its_reference_as_json_and_loads_only_its_own_bytes() {
        let bytes: Arc<[u8]> = Arc::from(&[0u8, 159, 146, 150, 255][..]);
        let image = Attachment::new("image/png", bytes.clone()).unwrap();
        let json = serde_json::to_string(&image).unwrap();
        assert_eq!(
            json,
            format!(
                r#"{{"media_type":"image/png","sha256":"{}","size":5}}"#,
                BlobHash::of(&bytes)
            )
        );
        let mut back: Attachment = serde_json::from_str(&json).unwrap();
        assert_eq!(back, image);
        assert!(back.bytes().is_none());
        let wrong = back.load(Arc::from(&b"other"[..])).unwrap_err();
        assert!(matches!(wrong, Error::InvalidInput(_)), "{wrong}");
        assert!(back.bytes().is_none());
        back.load(bytes.clone()).unwrap();
        assert_eq!(back.bytes().map(|b| &b[..]), Some(&bytes[..]));
        assert!(Attachment::new(" ", bytes.clone()).is_err());
        assert!(serde_json::from_str::<Attachment>(
            r#"{"media_type":"image/png","sha256":"zz","size":5}"#
        )
        .is_err());
        let file = Attachment::new("application/pdf", vec![1u8; 35_000])
            .unwrap()
            .with_name("report.pdf");
        assert_eq!(file.describe(), "report.pdf, application/pdf, 35 KiB");
    }
}
