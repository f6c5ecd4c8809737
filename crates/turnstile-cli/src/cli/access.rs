//! What a command does with its database: create it, write to it, or only
//! read it; and the store settings of a writing command.

/// What a command does with its database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Access {
    /// Creates it when missing (`run`, `demo`).
    Create(Limits),
    /// Writes to an existing one, migrating an older schema (`resume`,
    /// `recover`, `abandon`, `prune`).
    Write(Limits),
    /// Only reads: never creates, never migrates (`ls`, `show`,
    /// `checkpoints`, `export`).
    Read,
}

/// The store settings of a writing command; `None` keeps the store's
/// default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Limits {
    pub max_db_bytes: Option<u64>,
    pub busy_timeout: Option<std::time::Duration>,
}

impl Access {
    pub(super) fn limits(self) -> Limits {
        match self {
            Access::Create(limits) | Access::Write(limits) => limits,
            Access::Read => Limits::default(),
        }
    }
}
