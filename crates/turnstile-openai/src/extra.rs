//! The members of an answer and of its tool calls that this client does not
//! read (Gemini's thought signature in a call's `extra_content`, say): kept
//! as the answer's or the call's provider metadata, as their text, and sent
//! back in the same place, byte for byte.

use std::collections::{HashMap, HashSet};
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

/// The most members kept of one answer or call, and their most bytes: a
/// server's extensions are a few small objects; past these, the rest is
/// dropped rather than stored and sent back with every later call.
const MAX_MEMBERS: usize = 64;
const MAX_BYTES: usize = 256 * 1024;

/// A JSON object's members, in order, each value as its text; each name
/// once.
#[derive(Default)]
pub(crate) struct Members {
    entries: Vec<(String, Box<RawValue>)>,
    names: HashSet<String>,
    bytes: usize,
}

/// Every member of an object, in order, repeats included.
struct Ordered(Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for Ordered {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> Visitor<'de> for Entries {
            type Value = Ordered;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ordered, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry::<String, Box<RawValue>>()? {
                    entries.push(entry);
                }
                Ok(Ordered(entries))
            }
        }
        deserializer.deserialize_map(Entries)
    }
}

impl Members {
    /// The members of `object` (a JSON object's text) not in `known` and
    /// not null, a repeated name with its last value (as JSON parsers
    /// read it); none when it is not an object.
    pub(crate) fn unknown(object: &RawValue, known: &[&str]) -> Self {
        let Ok(Ordered(all)) = serde_json::from_str::<Ordered>(object.get()) else {
            return Self::default();
        };
        let last: HashMap<String, usize> = all
            .iter()
            .enumerate()
            .map(|(i, (name, _))| (name.clone(), i))
            .collect();
        let mut members = Self::default();
        for (i, (name, value)) in all.into_iter().enumerate() {
            if last[&name] == i && !known.contains(&name.as_str()) && value.get() != "null" {
                members.push(name, value);
            }
        }
        members
    }

    /// Adds a member unless its name is here already or the limits are
    /// reached.
    fn push(&mut self, name: String, value: Box<RawValue>) {
        let size = name.len() + value.get().len();
        if self.names.contains(&name)
            || self.entries.len() >= MAX_MEMBERS
            || self.bytes + size > MAX_BYTES
        {
            return;
        }
        self.bytes += size;
        self.names.insert(name.clone());
        self.entries.push((name, value));
    }

    /// Adds the members of `other` this one does not have yet: a stream's
    /// later fragments repeat a member or add one, and a member is kept as
    /// the first fragment that carried it.
    pub(crate) fn absorb(&mut self, other: Members) {
        for (name, value) in other.entries {
            self.push(name, value);
        }
    }

    /// The members as provider metadata; `None` when there are none.
    pub(crate) fn into_metadata(self) -> Option<ProviderMetadata> {
        if self.entries.is_empty() {
            return None;
        }
        let members: Vec<String> = self
            .entries
            .iter()
            .map(|(name, value)| format!("{}:{}", Value::String(name.clone()), value.get()))
            .collect();
        ProviderMetadata::new(format!("{{{}}}", members.join(","))).ok()
    }

    /// The members of stored metadata (a JSON object's text) but those
    /// named in `reserved` (what this client sends itself: metadata cannot
    /// replace or add it), a repeated name with its last value.
    pub(crate) fn of(metadata: Option<&ProviderMetadata>, reserved: &[&str]) -> Self {
        match metadata.and_then(|m| serde_json::from_str::<Box<RawValue>>(m.as_str()).ok()) {
            Some(object) => Self::unknown(&object, reserved),
            None => Self::default(),
        }
    }

    /// `object` as JSON text with these members after its own, except a
    /// name it has itself.
    pub(crate) fn appended_to(&self, object: &Map<String, Value>) -> Box<RawValue> {
        let mut text = Value::Object(object.clone()).to_string();
        for (name, value) in &self.entries {
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
        let mut members = Self::default();
        members.push(name.to_owned(), value);
        members
    }
}
