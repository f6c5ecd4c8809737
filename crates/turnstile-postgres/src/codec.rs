//! Driver errors to typed errors, and the bytes of stored text. Database
//! content is never trusted: see `turnstile_core::backend`.

use turnstile_core::Error;
use turnstile_core::StoreError;

pub(crate) use turnstile_core::backend::{now_ms, to_i64, Row};

/// Maps a driver error to the opaque [`StoreError`], naming what was being
/// done. A lock wait or statement past its timeout is busy; a full disk is
/// full, as on SQLite.
pub(crate) fn db(context: &'static str) -> impl FnOnce(sqlx::Error) -> Error {
    move |e| {
        let state = sqlstate(&e);
        let busy = matches!(e, sqlx::Error::PoolTimedOut)
            || matches!(state.as_deref(), Some("55P03" | "57014"));
        let full = state.as_deref() == Some("53100");
        let error = StoreError::new(format!("{context}: {e}"), Some(Box::new(e)));
        Error::Store(match (busy, full) {
            (true, _) => error.busy(),
            (_, true) => error.full(),
            _ => error,
        })
    }
}

/// The SQLSTATE of a database error.
pub(crate) fn sqlstate(error: &sqlx::Error) -> Option<String> {
    Some(error.as_database_error()?.code()?.into_owned())
}

/// A unique-key violation (SQLSTATE 23505).
pub(crate) fn is_unique_violation(error: &sqlx::Error) -> bool {
    sqlstate(error).as_deref() == Some("23505")
}

/// Text a model, tool or user wrote, decoded from its stored UTF-8.
pub(crate) fn text(row: &Row<'_>, column: &str, bytes: Vec<u8>) -> Result<String, Error> {
    String::from_utf8(bytes).map_err(|_| row.corrupt(format!("{column} is not UTF-8")))
}
