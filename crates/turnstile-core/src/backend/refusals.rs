//! Why a step refused: each backend finds that its compare-and-swap or its
//! guard matched nothing, reads the rows as they are now, and lets these
//! functions name the refusal, so every backend answers the same error for
//! the same state.

use crate::error::Error;
use crate::ids::{ConversationId, Namespace, RequestId, Revision};
use crate::message::Message;
use crate::store::{Admission, ApprovalDecision, Fence, TranscriptEntry};

/// What a failed compare-and-swap on the admission wanted: an idle one (a
/// claim) or an active one (a recovery claim, an abandon).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wanted {
    /// A claim of an idle admission by a new request.
    Idle,
    /// A takeover of an active admission: a recovery claim or an abandon.
    Active,
}

/// Why a compare-and-swap on the admission matched no row, given the
/// admission as it is now: `Busy` (another request holds it, or this one at
/// the expected revision), `NotActive` (nothing to take over), or
/// `Conflict` (the revision moved).
pub fn cas_refusal(
    admission: Admission,
    wanted: Wanted,
    request_id: RequestId,
    expected: Revision,
) -> Error {
    let conversation_id = admission.conversation_id;
    match admission.active {
        None if wanted == Wanted::Active => Error::NotActive { request_id },
        Some(active) if active.request_id != request_id || admission.revision == expected => {
            Error::Busy {
                conversation_id,
                request_id: active.request_id,
                revision: admission.revision,
            }
        }
        _ => Error::Conflict {
            conversation_id,
            expected,
            actual: admission.revision,
        },
    }
}

/// Why a decision on an approval matched no awaiting call, given the
/// admission as it is now and whether its run has stopped: `NotActive` (the
/// request holds no admission), `Conflict` (the revision moved), `Busy` (a
/// run of the request is going on: decide once it stops), or
/// `NoPendingApproval` (the call awaits no decision).
pub fn decision_refusal(
    admission: Admission,
    owner_stopped: bool,
    decision: &ApprovalDecision,
) -> Error {
    let request_id = decision.request_id;
    match admission.active {
        Some(active) if active.request_id == request_id => {
            if admission.revision != decision.expected_revision {
                Error::Conflict {
                    conversation_id: admission.conversation_id,
                    expected: decision.expected_revision,
                    actual: admission.revision,
                }
            } else if !owner_stopped {
                Error::Busy {
                    conversation_id: admission.conversation_id,
                    request_id,
                    revision: admission.revision,
                }
            } else {
                Error::NoPendingApproval {
                    request_id,
                    call_id: decision.call_id.clone(),
                }
            }
        }
        _ => Error::NotActive { request_id },
    }
}

/// Whether `fence` still owns the admission: its run at its revision.
pub fn owns(admission: &Admission, fence: &Fence) -> bool {
    admission.revision == fence.revision
        && admission
            .active
            .as_ref()
            .is_some_and(|active| active.run_id == fence.run_id)
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
