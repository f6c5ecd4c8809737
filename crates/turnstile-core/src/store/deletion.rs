//! What deleting and forking a conversation answer
//! ([`Store::delete_conversation`](super::Store::delete_conversation),
//! [`Store::fork_conversation`](super::Store::fork_conversation)).

use serde::Serialize;

use crate::admin::TableCounts;
use crate::ids::ConversationId;

/// What [`Store::delete_conversation`](super::Store::delete_conversation)
/// removed. The conversation's id and its request ids stay behind as
/// tombstones: none of them is ever admitted again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeleteReport {
    /// The deleted conversation.
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

/// What [`Store::fork_conversation`](super::Store::fork_conversation)
/// created.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ForkOutcome {
    /// The new conversation.
    pub conversation_id: ConversationId,
    /// Committed entries copied: the new conversation's transcript length.
    pub entries: u64,
}
