//! Conversions between rows and domain types. Database content is never
//! trusted: anything undecodable becomes [`Error::Corrupt`] naming the table
//! and key, never a panic.

use std::time::{SystemTime, UNIX_EPOCH};

use uuid::Uuid;

use turnstile_core::message::Usage;
use turnstile_core::store::InputHash;
use turnstile_core::Error;
use turnstile_core::StoreError;

/// Maps a driver error to the opaque [`StoreError`], naming what was being done.
pub(super) fn db(context: &'static str) -> impl FnOnce(sqlx::Error) -> Error {
    move |e| {
        // SQLITE_BUSY and SQLITE_LOCKED, with their extended codes; and a
        // pool whose connection another write held past the wait.
        let busy = matches!(e, sqlx::Error::PoolTimedOut)
            || primary_code(&e).is_some_and(|code| matches!(code, 5 | 6));
        let error = classified(format!("{context}: {e}"), Box::new(e));
        Error::Store(if busy { error.busy() } else { error })
    }
}

/// SQLite's primary result code of a database error (its extended code's
/// low byte).
pub(super) fn primary_code(error: &sqlx::Error) -> Option<i32> {
    error
        .as_database_error()?
        .code()?
        .parse::<i32>()
        .ok()
        .map(|code| code & 0xff)
}

/// A store error, marked full when SQLite ran out of room anywhere in its
/// source chain.
pub(super) fn classified(
    message: String,
    source: Box<dyn std::error::Error + Send + Sync>,
) -> StoreError {
    let full = is_sqlite_full(&*source);
    let error = StoreError::new(message, Some(source));
    if full {
        error.full()
    } else {
        error
    }
}

/// Whether SQLite answered `SQLITE_FULL` (13, with any extended code)
/// anywhere in an error's source chain.
fn is_sqlite_full(error: &(dyn std::error::Error + 'static)) -> bool {
    const SQLITE_FULL: i32 = 13;
    let mut next = Some(error);
    while let Some(error) = next {
        let code = error.downcast_ref::<sqlx::Error>().and_then(primary_code);
        if code == Some(SQLITE_FULL) {
            return true;
        }
        next = error.source();
    }
    false
}

pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Counters are u64 in the API and INTEGER (i64) in SQLite; values past
/// i64::MAX are clamped, as token counts never get there honestly.
pub(super) fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Decoding context: which row of which table is being read.
#[derive(Clone, Copy)]
pub(super) struct Row<'a> {
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
pub(super) fn to_json<T: serde::Serialize + ?Sized>(value: &T) -> Result<String, Error> {
    serde_json::to_string(value)
        .map_err(|e| Error::InvalidInput(format!("value cannot be serialized: {e}")))
}

/// Rebuilds a message from its stored role, text and `meta` JSON object
/// (the message's other fields).
pub(super) fn decode_message(
    row: &Row<'_>,
    role: &str,
    content: String,
    meta: Option<&str>,
) -> Result<turnstile_core::message::Message, Error> {
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
