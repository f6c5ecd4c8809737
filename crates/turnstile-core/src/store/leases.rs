//! Records of opt-in leases: a live owner renews its admission's lease on a
//! timer, and a held admission whose lease expired may be taken over by
//! another process (`recover_expired`).

use crate::ids::{ConversationId, Namespace, RequestId, Revision, RunId};

/// A held admission whose owner let its lease expire, as
/// [`Store::expired_leases`](super::Store::expired_leases) lists it: what a
/// takeover needs (the run to continue and the revision to compare and swap
/// at).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpiredLease {
    /// The conversation held.
    pub conversation_id: ConversationId,
    /// Its namespace: what a session to take it over is opened in.
    pub namespace: Namespace,
    /// The request holding it.
    pub request_id: RequestId,
    /// The run that owns the admission (status `running`).
    pub run_id: RunId,
    /// The admission's revision: a takeover is a compare-and-swap on it.
    pub revision: Revision,
    /// Unix milliseconds.
    pub lease_expires_at: i64,
}
