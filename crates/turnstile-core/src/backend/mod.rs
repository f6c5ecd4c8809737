//! The backend author's kit: what a crate implementing [`Store`] and
//! [`StoreAdmin`] shares with the other backends, so that every backend
//! decodes the same rows into the same records and refuses the same state
//! with the same [`Error`]. Applications need none of it; the `turnstile`
//! facade does not re-export it.
//!
//! - **Reading rows.** Database content is never trusted: [`Row`] names the
//!   table and key being read, and its decoders ([`Row::u64`], [`Row::id`],
//!   [`Row::hash`], [`Row::usage`], …) turn an impossible value into
//!   [`Error::Corrupt`] instead of a panic. [`AdmissionRow`] and
//!   [`CheckpointRow`] are the admission and loop checkpoint rows as every
//!   backend selects them; [`decode_message`] and [`decode_metadata`] read
//!   a stored message and metadata object back, [`decode_budget`] and
//!   [`decode_budget_change`] a request's budget and a run's change of it,
//!   [`EventRow`] an event of a conversation's log.
//! - **Writing rows.** [`message_columns`] splits a message into the
//!   columns it is stored in, [`metadata_json`], [`budget_json`],
//!   [`budget_change_json`] and [`to_json`] serialize,
//!   [`to_i64`] clamps a counter into a signed SQL integer, [`now_ms`] is
//!   the clock every stored time is read from (Unix milliseconds).
//! - **Storing blobs.** [`StepBlobs`] are the images' and files' bytes the
//!   messages of a step name, to store (once, by SHA-256) in the step's
//!   transaction before its messages; [`missing_blob`] refuses a reference
//!   to bytes the store does not hold; [`checked_blob`] reads them back.
//! - **Naming a refusal.** When a step's compare-and-swap or guard matches
//!   nothing, the backend reads the rows as they are now and asks:
//!   [`cas_refusal`] (a claim, recovery claim or abandon: `Busy`,
//!   `NotActive` or `Conflict`), [`decision_refusal`] (an approval
//!   decision), [`owns`] (whether a fence still owns its admission),
//!   [`missing_conversation`] (`Deleted` or `NotFound`), and, before a
//!   delete or a fork writes, [`check_delete`] and [`check_fork_cut`].
//! - **Claiming without a read.** A store that keeps a
//!   [`ClaimMemory`](crate::store::ClaimMemory) returns it from
//!   [`Store::claim_memory`](crate::Store::claim_memory), so that a
//!   conversation's next request claims without reading first.
//! - **Judging a listing.** [`is_stuck`] is the rule of a stuck admission
//!   (see [the admin module](crate::admin#stuck-admissions)) for a backend
//!   that judges it in Rust rather than in SQL.
//!
//! A backend proves it uses these as intended by passing the
//! `turnstile-conformance` suite.
//!
//! [`Store`]: crate::Store
//! [`StoreAdmin`]: crate::StoreAdmin
//! [`Error`]: crate::Error
//! [`Error::Corrupt`]: crate::Error::Corrupt

mod blobs;
mod event_row;
mod refusals;
mod rows;
mod stuck;

pub use blobs::{checked_blob, missing_blob, wrong_blob_size, StepBlobs};
pub use event_row::EventRow;
pub use refusals::{
    cas_refusal, check_delete, check_fork_cut, decision_refusal, missing_conversation, owns, Wanted,
};
pub use rows::{
    budget_change_json, budget_json, decode_budget, decode_budget_change, decode_message,
    decode_metadata, decode_tool_result, message_columns, metadata_json, now_ms,
    stored_messages_json, to_i64, to_json, tool_result_columns, AdmissionRow, CheckpointRow,
    EntryKey, Row,
};
pub use stuck::is_stuck;
