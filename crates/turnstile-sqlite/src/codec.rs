//! Conversions between rows and domain types. Database content is never
//! trusted: anything undecodable becomes [`Error::Corrupt`] naming the table
//! and key, never a panic.

use turnstile_core::Error;
use turnstile_core::StoreError;

pub(super) use turnstile_core::backend::{decode_message, now_ms, to_i64, to_json, Row};

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

/// The one row a writing statement returns, read to the statement's end.
/// A lone step's statement commits when it ends, and a failed commit is
/// reported then; `fetch_one` would stop at the row and reset the
/// statement, which drops that error (SQLite has rolled the step back while
/// its caller is told it committed).
pub(super) fn only_row<T>(rows: Vec<T>) -> Result<T, sqlx::Error> {
    rows.into_iter().next().ok_or(sqlx::Error::RowNotFound)
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

/// A run owner's fence as its statements bind it: ids as uuids (16-byte
/// blobs), the revision as SQLite's integer.
pub(super) struct FenceColumns {
    pub(super) conversation: uuid::Uuid,
    pub(super) request: uuid::Uuid,
    pub(super) run: uuid::Uuid,
    pub(super) revision: i64,
}

impl FenceColumns {
    pub(super) fn of(fence: &turnstile_core::store::Fence) -> Self {
        Self {
            conversation: fence.conversation_id.as_uuid(),
            request: fence.request_id.as_uuid(),
            run: fence.run_id.as_uuid(),
            revision: to_i64(fence.revision.0),
        }
    }
}

/// Bytes as the lowercase hex the shared statements `unhex`, and as error keys.
pub(super) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        let _ = write!(out, "{byte:02x}");
    }
    out
}
