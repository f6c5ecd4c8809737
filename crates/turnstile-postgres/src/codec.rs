//! Driver errors to typed errors, and the bytes of stored text. Database
//! content is never trusted: see `turnstile_core::backend`.

use turnstile_core::Error;
use turnstile_core::StoreError;

pub(crate) use turnstile_core::backend::{now_ms, to_i64, Row};

/// Maps a driver error to the opaque [`StoreError`], naming what was being
/// done. A lock wait or statement past its timeout is busy; a full disk is
/// full, as on SQLite; a lost connection or a server shutting down is
/// unreachable.
pub(crate) fn db(context: &'static str) -> impl FnOnce(sqlx::Error) -> Error {
    move |e| {
        let state = sqlstate(&e);
        let busy = matches!(e, sqlx::Error::PoolTimedOut)
            || matches!(state.as_deref(), Some("55P03" | "57014"));
        let full = state.as_deref() == Some("53100");
        // connection exceptions; admin_shutdown, crash_shutdown,
        // cannot_connect_now.
        let unreachable = matches!(e, sqlx::Error::Io(_))
            || state
                .as_deref()
                .is_some_and(|s| s.starts_with("08") || matches!(s, "57P01" | "57P02" | "57P03"));
        let error = StoreError::new(format!("{context}: {e}"), Some(Box::new(e)));
        Error::Store(match (busy, full, unreachable) {
            (true, _, _) => error.busy(),
            (_, true, _) => error.full(),
            (_, _, true) => error.unreachable(),
            _ => error,
        })
    }
}

/// The same error, marked unreachable when it is a store error: for a
/// connection that could not be opened within the wait.
pub(crate) fn unreachable(error: Error) -> Error {
    match error {
        Error::Store(store) => Error::Store(store.unreachable()),
        other => other,
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
