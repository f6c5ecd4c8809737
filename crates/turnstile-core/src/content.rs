//! What a message is made of: a list of parts (text, reasoning, images,
//! files), and the opaque provider metadata a model needs back exactly.

use std::borrow::Cow;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::attachment::Attachment;
use crate::error::Error;

/// A message's content: its parts, in order.
///
/// Plain text is one text part: `Content::from("hi")`. It serializes as a
/// JSON string when it is plain text (no part, or one text part) and as an
/// array of parts otherwise, and reads either form.
#[derive(Clone, Debug, Default)]
pub struct Content {
    parts: Vec<Part>,
}

/// Plain text (no part, or one text part) equals plain text of the same
/// bytes, so no part equals one empty text part; other content equals part
/// by part.
impl PartialEq for Content {
    fn eq(&self, other: &Self) -> bool {
        match (self.as_plain_text(), other.as_plain_text()) {
            (Some(a), Some(b)) => a == b,
            (None, None) => self.parts == other.parts,
            _ => false,
        }
    }
}

impl Eq for Content {}

impl Content {
    /// Content of these parts, in order.
    pub fn new(parts: Vec<Part>) -> Self {
        Self { parts }
    }

    /// The parts, in order.
    pub fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// The parts, to change one in place.
    pub fn parts_mut(&mut self) -> &mut [Part] {
        &mut self.parts
    }

    /// The parts, to change or take.
    pub fn into_parts(self) -> Vec<Part> {
        self.parts
    }

    /// The text when the content is plain text (no part, or one text
    /// part); `None` when it holds anything else.
    pub fn as_plain_text(&self) -> Option<&str> {
        match self.parts.as_slice() {
            [] => Some(""),
            [Part::Text { text }] => Some(text),
            _ => None,
        }
    }

    /// The text and JSON parts, joined in order; reasoning, images and
    /// files are not text.
    pub fn text(&self) -> Cow<'_, str> {
        if let Some(text) = self.as_plain_text() {
            return Cow::Borrowed(text);
        }
        Cow::Owned(self.parts.iter().filter_map(Part::as_text).collect())
    }

    /// The reasoning parts, in order.
    pub fn reasoning(&self) -> impl Iterator<Item = &Reasoning> {
        self.parts.iter().filter_map(|part| match part {
            Part::Reasoning(reasoning) => Some(reasoning),
            _ => None,
        })
    }

    /// The images' and files' attachments, in order.
    pub fn attachments(&self) -> impl Iterator<Item = &Attachment> {
        self.parts.iter().filter_map(Part::attachment)
    }

    /// The images' and files' attachments, to load their bytes.
    pub fn attachments_mut(&mut self) -> impl Iterator<Item = &mut Attachment> {
        self.parts.iter_mut().filter_map(|part| match part {
            Part::Image(attachment) | Part::File(attachment) => Some(attachment),
            _ => None,
        })
    }
}

impl From<String> for Content {
    fn from(text: String) -> Self {
        Self {
            parts: vec![Part::Text { text }],
        }
    }
}

impl From<&str> for Content {
    fn from(text: &str) -> Self {
        Self::from(text.to_owned())
    }
}

impl From<&String> for Content {
    fn from(text: &String) -> Self {
        Self::from(text.clone())
    }
}

impl From<Vec<Part>> for Content {
    fn from(parts: Vec<Part>) -> Self {
        Self::new(parts)
    }
}

impl PartialEq<str> for Content {
    fn eq(&self, other: &str) -> bool {
        self.as_plain_text() == Some(other)
    }
}

impl PartialEq<&str> for Content {
    fn eq(&self, other: &&str) -> bool {
        self == *other
    }
}

impl Serialize for Content {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.as_plain_text() {
            Some(text) => serializer.serialize_str(text),
            None => self.parts.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // A visitor rather than an untagged enum, so that a bad part is
        // reported as what is wrong with it (an unknown part type, say).
        struct Form;

        impl<'de> serde::de::Visitor<'de> for Form {
            type Value = Content;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("text or a list of content parts")
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Content, E> {
                Ok(Content::from(text))
            }

            fn visit_string<E: serde::de::Error>(self, text: String) -> Result<Content, E> {
                Ok(Content::from(text))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Content, A::Error> {
                let mut parts = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
                while let Some(part) = seq.next_element::<Part>()? {
                    parts.push(part);
                }
                Ok(Content::new(parts))
            }
        }

        deserializer.deserialize_any(Form)
    }
}

/// One part of a message's content.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    /// Text.
    Text {
        /// The text, as it is.
        text: String,
    },
    /// The model's reasoning, kept to be sent back exactly (a provider
    /// may refuse a tool loop whose reasoning does not come back).
    Reasoning(Reasoning),
    /// An image, its bytes stored once per store.
    Image(Attachment),
    /// An image a model fetches itself, by URL.
    ImageUrl {
        /// Where the image is.
        url: String,
    },
    /// A document or other file, its bytes stored once per store.
    File(Attachment),
    /// A JSON value (a tool's structured result, say), kept as its text.
    Json {
        /// The value's JSON text, exactly as it was given.
        json: JsonText,
    },
}

impl Part {
    /// A text part.
    pub fn text(text: impl Into<String>) -> Self {
        Part::Text { text: text.into() }
    }

    /// A JSON part from its text, which must be one JSON value; the text
    /// is kept as it is.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] when it is not JSON.
    pub fn json(json: impl Into<String>) -> Result<Self, Error> {
        Ok(Part::Json {
            json: JsonText::new(json)?,
        })
    }

    /// The text of a text or JSON part; `None` for every other part.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Part::Text { text } => Some(text),
            Part::Json { json } => Some(json.as_str()),
            _ => None,
        }
    }

    /// The part as a reader of text takes it: text and JSON as they are,
    /// an image or file as its [`placeholder`](Self::placeholder), reasoning
    /// as nothing (it is the provider's, never summarized or quoted).
    pub fn as_text_or_placeholder(&self) -> Option<Cow<'_, str>> {
        match self {
            Part::Reasoning(_) => None,
            part => match part.as_text() {
                Some(text) => Some(Cow::Borrowed(text)),
                None => part.placeholder().map(Cow::Owned),
            },
        }
    }

    /// The attachment of an image or file part.
    pub fn attachment(&self) -> Option<&Attachment> {
        match self {
            Part::Image(attachment) | Part::File(attachment) => Some(attachment),
            _ => None,
        }
    }

    /// How the part is described where it is left out or summarized
    /// (`[image: image/png, 34 KiB]`); `None` for text and JSON.
    pub fn placeholder(&self) -> Option<String> {
        match self {
            Part::Text { .. } | Part::Json { .. } => None,
            Part::Reasoning(reasoning) => Some(format!("[reasoning: {}]", reasoning.provider)),
            Part::Image(attachment) => Some(format!("[image: {}]", attachment.describe())),
            Part::ImageUrl { url } => Some(format!("[image: {url}]")),
            Part::File(attachment) => Some(format!("[file: {}]", attachment.describe())),
        }
    }
}

/// Reasoning a model produced: its text and/or an opaque signature, or
/// data the provider redacted or encrypted, and which provider family
/// produced it (a model client sends back only its own family's
/// reasoning). Unknown fields are refused when it is read: reasoning sent
/// back without a field its provider needs would be refused or degrade.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reasoning {
    /// The provider family, such as `anthropic`, `openai` or `google`.
    pub provider: String,
    /// The reasoning's text, when the provider shows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The provider's signature over the reasoning, sent back as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    /// Redacted or encrypted reasoning, sent back as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redacted: Option<String>,
}

/// A JSON value kept as its text, byte for byte: its keys in their order,
/// its numbers as written (past what an `f64` holds too).
///
/// It serializes as a JSON string holding that text, so that no JSON layer
/// between the model and the database (a store's JSON functions, a
/// `serde_json::Value`) can reorder its keys or rewrite its numbers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct JsonText(String);

impl JsonText {
    /// The value from its JSON text, which must be one JSON value; the text
    /// is kept as it is (whitespace included).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] when it is not JSON.
    pub fn new(json: impl Into<String>) -> Result<Self, Error> {
        let json = json.into();
        // Checked without converting its numbers, which are kept as
        // written.
        if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&json) {
            return Err(Error::InvalidInput(format!("not JSON: {e}")));
        }
        Ok(Self(json))
    }

    /// The JSON text, exactly as it was given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The value, for reading (send [`as_str`](Self::as_str) on to keep
    /// it exact); `None` when it holds a number a `serde_json::Value`
    /// cannot (such as `1e400`).
    pub fn to_value(&self) -> Option<serde_json::Value> {
        serde_json::from_str(&self.0).ok()
    }
}

impl<'de> Deserialize<'de> for JsonText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        JsonText::new(text).map_err(serde::de::Error::custom)
    }
}

/// An opaque JSON object a provider attached to an answer or a tool call
/// (a thought signature, say) that it needs back exactly: kept as its text,
/// byte for byte, as a [`JsonText`] is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct ProviderMetadata(JsonText);

impl ProviderMetadata {
    /// Metadata from its JSON text, which must be one JSON object; the
    /// text is kept as it is (whitespace included).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] when it is not a JSON object.
    pub fn new(json: impl Into<String>) -> Result<Self, Error> {
        let json = JsonText::new(json).map_err(|e| match e {
            Error::InvalidInput(why) => Error::InvalidInput(format!("provider metadata is {why}")),
            other => other,
        })?;
        if !json.as_str().trim_start().starts_with('{') {
            return Err(Error::InvalidInput(
                "provider metadata must be a JSON object".into(),
            ));
        }
        Ok(Self(json))
    }

    /// The metadata's JSON text, exactly as it was given.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    /// The metadata as a JSON value, for reading (send back
    /// [`as_str`](Self::as_str) to keep it exact); `None` when it holds a
    /// number a `serde_json::Value` cannot (such as `1e400`).
    pub fn to_value(&self) -> Option<serde_json::Value> {
        self.0.to_value()
    }
}

impl<'de> Deserialize<'de> for ProviderMetadata {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        ProviderMetadata::new(text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_part_keeps_its_text_and_refuses_what_is_not_json() {
        let text = r#" {"n": 123456789012345678901234567890, "x": 1e400} "#;
        let part = Part::json(text).unwrap();
        let content = Content::new(vec![Part::text("result: "), part.clone()]);
        assert_eq!(content.text(), format!("result: {text}"));
        assert_eq!(part.placeholder(), None);
        let json = serde_json::to_string(&content).unwrap();
        assert_eq!(
            json,
            r#"[{"type":"text","text":"result: "},{"type":"json","json":" {\"n\": 123456789012345678901234567890, \"x\": 1e400} "}]"#
        );
        assert_eq!(serde_json::from_str::<Content>(&json).unwrap(), content);
        for bad in ["", "{", "nope", "1 2"] {
            assert!(
                matches!(Part::json(bad), Err(Error::InvalidInput(_))),
                "{bad:?}"
            );
        }
        let stored = r#"[{"type":"json","json":"{"}]"#;
        assert!(serde_json::from_str::<Content>(stored).is_err());
    }

    #[test]
    fn plain_text_serializes_as_a_string_and_parts_as_an_array() {
        assert_eq!(
            serde_json::to_string(&Content::from("hi")).unwrap(),
            r#""hi""#
        );
        assert_eq!(serde_json::to_string(&Content::default()).unwrap(), r#""""#);
        let parts = Content::new(vec![
            Part::Reasoning(Reasoning {
                provider: "anthropic".into(),
                text: Some("think".into()),
                signature: Some("sig".into()),
                redacted: None,
            }),
            Part::text("answer"),
        ]);
        let json = serde_json::to_string(&parts).unwrap();
        assert_eq!(
            json,
            r#"[{"type":"reasoning","provider":"anthropic","text":"think","signature":"sig"},{"type":"text","text":"answer"}]"#
        );
        assert_eq!(serde_json::from_str::<Content>(&json).unwrap(), parts);
        assert_eq!(
            serde_json::from_str::<Content>(r#""hi""#).unwrap(),
            Content::from("hi")
        );
        assert_eq!(parts.text(), "answer");
        assert_eq!(parts.as_plain_text(), None);
        assert_eq!(Content::new(Vec::new()), Content::from(""));
        let unknown = serde_json::from_str::<Content>(r#"[{"type": "hologram"}]"#)
            .expect_err("an unknown part type");
        assert!(unknown.to_string().contains("hologram"), "{unknown}");
        assert!(serde_json::from_str::<Content>("7").is_err());
        assert_ne!(
            Content::new(vec![Part::text(""), Part::text("")]),
            Content::from("")
        );
    }

    #[test]
    fn provider_metadata_keeps_its_text_and_must_be_an_object() {
        let text = r#"{ "z": 1, "a": 12345678901234567890123, "f": 1e400, "s": "\u00e9" }"#;
        let metadata = ProviderMetadata::new(text).unwrap();
        let json = serde_json::to_string(&metadata).unwrap();
        let back: ProviderMetadata = serde_json::from_str(&json).unwrap();
        assert_eq!(back.as_str(), text);
        let through_value: ProviderMetadata =
            serde_json::from_value(serde_json::to_value(&metadata).unwrap()).unwrap();
        assert_eq!(through_value.as_str(), text);
        assert_eq!(metadata.to_value(), None, "1e400 is past an f64");
        let plain = ProviderMetadata::new(r#"{"a": [1]}"#).unwrap();
        assert_eq!(plain.to_value(), Some(serde_json::json!({"a": [1]})));
        for bad in ["[]", "1", "\"x\"", "{", ""] {
            assert!(
                matches!(ProviderMetadata::new(bad), Err(Error::InvalidInput(_))),
                "{bad}"
            );
        }
    }
}
