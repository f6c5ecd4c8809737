//! What deleting and forking a conversation answer
//! ([`Store::delete_conversation`](super::Store::delete_conversation),
//! [`Store::fork_conversation`](super::Store::fork_conversation)).

use serde::Serialize;

use super::TranscriptEntry;
use crate::admin::TableCounts;
use crate::error::Error;
use crate::ids::{ConversationId, Namespace, RequestId, Revision};
use crate::message::Message;

/// What [`Store::delete_conversation`](super::Store::delete_conversation)
/// removed. The conversation's id and its request ids stay behind as
/// tombstones: none of them is ever admitted again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeleteReport {
    pub conversation_id: ConversationId,
    /// Rows deleted per table.
    pub deleted: TableCounts,
    /// Summary rows deleted.
    pub summaries: u64,
    /// Request ids kept as tombstones.
    pub tombstoned_requests: u64,
    /// Pages given back to the file system afterwards (SQLite's incremental
    /// vacuum, as `prune` does; 0 where the backend reclaims space by
    /// itself).
    pub pages_freed: u64,
}

/// Whether a delete may go on, given the conversation as found (its row
/// decoded, its namespace checked): its version must be `expected_version`
/// ([`Error::VersionConflict`]), and a request holding it refuses the delete
/// ([`Error::Busy`]) unless the caller names that admission's revision.
pub fn check_delete(
    id: ConversationId,
    version: u64,
    revision: Revision,
    active_request: Option<RequestId>,
    expected_version: u64,
    active_revision: Option<Revision>,
) -> Result<(), Error> {
    if version != expected_version {
        return Err(Error::VersionConflict {
            conversation_id: id,
            expected: expected_version,
            actual: version,
        });
    }
    match active_request {
        Some(request_id) if active_revision != Some(revision) => Err(Error::Busy {
            conversation_id: id,
            request_id,
            revision,
        }),
        _ => Ok(()),
    }
}

/// Why a conversation has no row, given its tombstone's namespace if it has
/// one: [`Error::Deleted`] (or, for a tombstone of another namespace than
/// `namespace` when one is given, [`Error::NamespaceMismatch`], as its row
/// was), otherwise [`Error::NotFound`].
pub fn missing_conversation(
    namespace: Option<&Namespace>,
    id: ConversationId,
    tombstone: Option<String>,
) -> Error {
    match (tombstone, namespace) {
        (Some(stored), Some(ns)) if ns.as_str() != stored => Error::NamespaceMismatch {
            conversation_id: id,
            namespace: ns.clone(),
        },
        (Some(_), _) => Error::Deleted {
            conversation_id: id,
        },
        (None, _) => Error::NotFound {
            what: "conversation",
            id: id.to_string(),
        },
    }
}

/// What [`Store::fork_conversation`](super::Store::fork_conversation)
/// created.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ForkOutcome {
    pub conversation_id: ConversationId,
    /// Committed entries copied: the new conversation's transcript length.
    pub entries: u64,
}

/// Whether a fork may keep the first `through_seq` of `length` committed
/// entries of `from`: not none, not more than there are, and no cut inside
/// a tool round (after an assistant message with tool calls, or before a
/// tool result). `boundary` is the transcript from `through_seq - 1` up to
/// `through_seq + 1` (the last entry kept and the first one left out).
/// Every backend judges a fork's cut with it.
///
/// # Errors
/// [`Error::InvalidInput`] naming what is wrong with the cut.
pub fn check_fork_cut(
    from: ConversationId,
    through_seq: u64,
    length: u64,
    boundary: &[TranscriptEntry],
) -> Result<(), Error> {
    if through_seq == 0 {
        return Err(Error::InvalidInput(
            "a fork keeps at least one entry: --through must be 1 or more".into(),
        ));
    }
    if through_seq > length {
        return Err(Error::InvalidInput(format!(
            "conversation {from} has {length} committed entries: cannot fork through {through_seq}"
        )));
    }
    let at = |seq: u64| boundary.iter().find(|e| e.seq == seq).map(|e| &e.message);
    let calls_tools = matches!(at(through_seq - 1), Some(Message::Assistant { tool_calls, .. }) if !tool_calls.is_empty());
    let answers_tool = matches!(at(through_seq), Some(Message::Tool { .. }));
    if calls_tools || answers_tool {
        return Err(Error::InvalidInput(format!(
            "cannot fork conversation {from} through {through_seq}: the cut is inside a tool round (between tool calls and their results)"
        )));
    }
    Ok(())
}
