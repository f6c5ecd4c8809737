//! Rows to domain types and back, for backends: database content is never
//! trusted, so anything undecodable becomes [`Error::Corrupt`] naming the
//! table and key, never a panic.

use std::time::{SystemTime, UNIX_EPOCH};

use uuid::Uuid;

use crate::error::Error;
use crate::message::{Message, Usage};
use crate::store::InputHash;

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Counters are u64 in the API and 64-bit signed integers in SQL; values past
/// i64::MAX are clamped, as token counts never get there honestly.
pub fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Decoding context: which row of which table is being read.
#[derive(Clone, Copy)]
pub struct Row<'a> {
    pub table: &'static str,
    pub key: &'a (dyn std::fmt::Display + Sync),
}

impl Row<'_> {
    pub fn corrupt(&self, reason: impl Into<String>) -> Error {
        Error::Corrupt {
            table: self.table,
            key: self.key.to_string(),
            reason: reason.into(),
        }
    }

    pub fn u64(&self, column: &str, value: i64) -> Result<u64, Error> {
        u64::try_from(value).map_err(|_| self.corrupt(format!("{column} is negative ({value})")))
    }

    pub fn u32(&self, column: &str, value: i64) -> Result<u32, Error> {
        u32::try_from(value).map_err(|_| self.corrupt(format!("{column} out of range ({value})")))
    }

    pub fn uuid(&self, column: &str, bytes: &[u8]) -> Result<Uuid, Error> {
        Uuid::from_slice(bytes).map_err(|_| self.corrupt(format!("{column} is not a 16-byte uuid")))
    }

    /// An id column: a 16-byte uuid that is not nil.
    pub fn id<T: TryFrom<Uuid>>(&self, column: &str, bytes: &[u8]) -> Result<T, Error> {
        self.checked_id(column, self.uuid(column, bytes)?)
    }

    /// An id read as a uuid already: the nil uuid is corruption here, not
    /// bad input.
    pub fn checked_id<T: TryFrom<Uuid>>(&self, column: &str, uuid: Uuid) -> Result<T, Error> {
        T::try_from(uuid).map_err(|_| self.corrupt(format!("{column} is the nil uuid")))
    }

    pub fn hash(&self, column: &str, bytes: &[u8]) -> Result<InputHash, Error> {
        <[u8; 32]>::try_from(bytes)
            .map(InputHash)
            .map_err(|_| self.corrupt(format!("{column} is not a 32-byte sha-256")))
    }

    pub fn usage(
        &self,
        input: i64,
        output: i64,
        cache_read: i64,
        cache_write: i64,
    ) -> Result<Usage, Error> {
        Ok(Usage {
            input_tokens: self.u64("input_tokens", input)?,
            output_tokens: self.u64("output_tokens", output)?,
            cache_read_tokens: self.u64("cache_read_tokens", cache_read)?,
            cache_write_tokens: self.u64("cache_write_tokens", cache_write)?,
        })
    }
}

/// Serializes a value the crate itself defines; these never fail, but a
/// failure is still reported rather than unwrapped.
pub fn to_json<T: serde::Serialize + ?Sized>(value: &T) -> Result<String, Error> {
    serde_json::to_string(value)
        .map_err(|e| Error::InvalidInput(format!("value cannot be serialized: {e}")))
}

/// A message as its stored columns: role, text, and its other fields as a
/// `meta` JSON object (`None` when it has none). The text is never
/// JSON-escaped, so it is stored as it is.
pub fn message_columns(message: &Message) -> Result<(String, String, Option<String>), Error> {
    let serde_json::Value::Object(mut fields) = serde_json::to_value(message)
        .map_err(|e| Error::InvalidInput(format!("message cannot be serialized: {e}")))?
    else {
        return Err(Error::InvalidInput(
            "a message serializes to an object".into(),
        ));
    };
    let role = match fields.remove("role") {
        Some(serde_json::Value::String(role)) => role,
        _ => return Err(Error::InvalidInput("a message has a role".into())),
    };
    let content = match fields.remove("content") {
        Some(serde_json::Value::String(content)) => content,
        _ => return Err(Error::InvalidInput("a message has a text".into())),
    };
    let meta = if fields.is_empty() {
        None
    } else {
        Some(to_json(&fields)?)
    };
    Ok((role, content, meta))
}

/// Rebuilds a message from its stored role, text and `meta` JSON object
/// (the message's other fields): the inverse of [`message_columns`].
pub fn decode_message(
    row: &Row<'_>,
    role: &str,
    content: String,
    meta: Option<&str>,
) -> Result<Message, Error> {
    let mut fields = match meta {
        None => serde_json::Map::new(),
        Some(text) => match serde_json::from_str(text) {
            Ok(serde_json::Value::Object(map)) => map,
            Ok(_) => return Err(row.corrupt("meta is not a JSON object")),
            Err(e) => return Err(row.corrupt(format!("meta: {e}"))),
        },
    };
    fields.insert("role".into(), role.into());
    fields.insert("content".into(), content.into());
    serde_json::from_value(serde_json::Value::Object(fields))
        .map_err(|e| row.corrupt(format!("message: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ToolCall;

    #[test]
    fn every_kind_of_message_round_trips_through_its_columns() {
        let messages = [
            Message::system("be brief"),
            Message::user("nul\0inside \"quoted\""),
            Message::assistant("plain"),
            Message::Assistant {
                content: String::new(),
                tool_calls: vec![ToolCall {
                    id: "c1".into(),
                    name: "search".into(),
                    arguments: r#"{"q":"x"}"#.into(),
                }],
            },
            Message::Tool {
                call_id: "c1".into(),
                content: "failed".into(),
                is_error: true,
            },
        ];
        let key = Row {
            table: "test",
            key: &"k",
        };
        for message in messages {
            let (role, content, meta) = message_columns(&message).expect("columns");
            assert_eq!(content, message.content());
            let back = decode_message(&key, &role, content, meta.as_deref()).expect("decode");
            assert_eq!(back, message);
        }
        assert_eq!(
            message_columns(&Message::user("x")).expect("columns").2,
            None
        );
    }
}
