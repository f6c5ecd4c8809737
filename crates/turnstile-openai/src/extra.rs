//! The members of an answer and of its tool calls that this client does not
//! read (Gemini's thought signature in a call's `extra_content`, say): kept
//! as the answer's or the call's provider metadata, as their text, and sent
//! back in the same place, byte for byte.

use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use turnstile_core::message::ProviderMetadata;

/// The members of an answer this client reads or that are the server's
/// report on it rather than part of the message (`refusal`, `annotations`,
/// `audio`): never kept, never sent back.
pub(crate) const ANSWER_MEMBERS: [&str; 9] = [
    "role",
    "content",
    "reasoning_content",
    "reasoning",
    "tool_calls",
    "refusal",
    "annotations",
    "audio",
    "function_call",
];

/// The members of a tool call this client reads.
pub(crate) const CALL_MEMBERS: [&str; 4] = ["index", "id", "type", "function"];

/// A JSON object's members, in order, each value as its text.
#[derive(Default)]
pub(crate) struct Members(Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for Members {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Ordered;
        impl<'de> Visitor<'de> for Ordered {
            type Value = Members;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members, A::Error> {
                let mut members = Vec::new();
                while let Some(entry) = map.next_entry::<String, Box<RawValue>>()? {
                    members.push(entry);
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(Ordered)
    }
}

impl Members {
    /// The members of `object` (a JSON object's text) not in `known` and
    /// not null; none when it is not an object.
    pub(crate) fn unknown(object: &RawValue, known: &[&str]) -> Self {
        let Ok(Members(all)) = serde_json::from_str::<Members>(object.get()) else {
            return Self::default();
        };
        Self(
            all.into_iter()
                .filter(|(name, value)| !known.contains(&name.as_str()) && value.get() != "null")
                .collect(),
        )
    }

    /// Adds the members of `other` this one does not have yet (a stream's
    /// later fragments repeat or add members).
    pub(crate) fn absorb(&mut self, other: Members) {
        for (name, value) in other.0 {
            if !self.0.iter().any(|(have, _)| *have == name) {
                self.0.push((name, value));
            }
        }
    }

    /// The members as provider metadata; `None` when there are none.
    pub(crate) fn into_metadata(self) -> Option<ProviderMetadata> {
        if self.0.is_empty() {
            return None;
        }
        let members: Vec<String> = self
            .0
            .iter()
            .map(|(name, value)| format!("{}:{}", Value::String(name.clone()), value.get()))
            .collect();
        ProviderMetadata::new(format!("{{{}}}", members.join(","))).ok()
    }

    /// The members of stored metadata (a JSON object's text).
    pub(crate) fn of(metadata: Option<&ProviderMetadata>) -> Self {
        metadata
            .and_then(|m| serde_json::from_str::<Members>(m.as_str()).ok())
            .unwrap_or_default()
    }

    /// `object` as JSON text with these members after its own, except a
    /// member it has itself (the metadata cannot replace what this client
    /// sends).
    pub(crate) fn appended_to(&self, object: &Map<String, Value>) -> Box<RawValue> {
        let mut text = Value::Object(object.clone()).to_string();
        for (name, value) in &self.0 {
            if object.contains_key(name) {
                continue;
            }
            text.pop();
            if text.len() > 1 {
                text.push(',');
            }
            text.push_str(&Value::String(name.clone()).to_string());
            text.push(':');
            text.push_str(value.get());
            text.push('}');
        }
        // Every piece is JSON text, so this always parses.
        RawValue::from_string(text).unwrap_or_default()
    }

    /// One member.
    pub(crate) fn one(name: &str, value: Box<RawValue>) -> Self {
        Self(vec![(name.to_owned(), value)])
    }
}
