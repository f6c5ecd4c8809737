//! The operations commands: `ls`, `show`, `checkpoints`, `export`,
//! `events`, `prune` and `doctor`. They read (or, for `prune`, trim) an existing database and
//! never create one: a missing file, or a PostgreSQL database without the
//! turnstile schema, is "not found" (exit 4).

mod args;
mod columns;
mod events;
mod export;
mod inspect;
mod list;
mod maintain;
mod render;

pub use args::{
    parse_duration, CheckpointsArgs, DoctorArgs, EventsArgs, ExportArgs, LsArgs, PruneArgs,
    ShowArgs,
};
pub(super) use columns::{columns, utc};
pub(super) use events::events;
pub(super) use export::export;
pub(super) use inspect::{checkpoints, show};
pub(super) use list::ls;
pub(super) use maintain::{doctor, prune};
