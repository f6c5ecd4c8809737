//! What a store remembers of a conversation after a commit, so that the
//! conversation's next request can claim without reading first.
//!
//! A new request reads its claim's context (the conversation, whether the
//! request is known, the admission and the model's window) and then claims
//! at the revision it read. After a session commits, it knows all of that
//! for the next request: the admission is idle at the revision after the
//! commit's, and the window is the one it read with the request's messages
//! added. The next request of the conversation, from any session on the
//! same store, claims at that revision with that window and skips the read.
//! The claim's compare-and-swap is what makes that safe: any change of the
//! admission since (another request, a deletion, an approval, a change of
//! agent or budget) moves the revision, and a conversation pruned whole and
//! created again under its id, whose revisions count from 0 again, has
//! another creation time, which the claim checks too
//! ([`NewRequest::expected_created_at`](super::NewRequest::expected_created_at)).
//! Either way the claim is refused and writes nothing, and the session
//! reads as it always did. A request id that is
//! known already is answered by the claim as the read would have answered
//! it ([`ClaimOutcome::Existing`](super::ClaimOutcome::Existing)).
//!
//! A remembered entry is taken, not copied: two requests of one
//! conversation never both claim from it. Windows whose messages name
//! images or files are not remembered (their stored form is a reference,
//! not the bytes the session holds). The memory is bounded in bytes; past
//! the bound it forgets the longest-unused conversations.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::backend::{decode_message, message_columns, Row, StepBlobs};
use crate::error::Error;
use crate::ids::{ConversationId, Namespace, Revision};
use crate::message::Message;

/// The bytes of message text a store keeps at most, over all remembered
/// conversations.
const MAX_BYTES: usize = 16 << 20;

/// Per-store memory of conversations' states after their last commit
/// through it (see the module docs). A store that keeps one returns it from
/// [`Store::claim_memory`](super::Store::claim_memory).
#[derive(Debug, Default)]
pub struct ClaimMemory {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    conversations: HashMap<ConversationId, Remembered>,
    bytes: usize,
    /// Counts uses, to forget the longest-unused conversation first.
    clock: u64,
}

#[derive(Debug)]
struct Remembered {
    namespace: Namespace,
    revision: Revision,
    /// When the conversation was created: one created again under its id
    /// after a prune counts its revisions from 0 again.
    created_at: i64,
    /// The window's size asked for when it was read.
    limit: u32,
    /// The last `limit` committed entries' messages (fewer when the
    /// conversation has fewer), oldest first, as a read returns them.
    window: Vec<Message>,
    /// What each message of `window` costs to keep.
    sizes: Vec<usize>,
    bytes: usize,
    used: u64,
}

/// A conversation's state as remembered: claim at `revision` with `window`.
#[derive(Debug)]
pub struct Recalled {
    /// The admission's revision after the last commit.
    pub revision: Revision,
    /// When the conversation was created (the claim checks it with the
    /// revision, [`NewRequest::expected_created_at`](super::NewRequest::expected_created_at)).
    pub created_at: i64,
    /// The model's window after it, oldest first.
    pub window: Vec<Message>,
    /// What each message of `window` costs to keep, when known (a window
    /// the memory handed out): measured once, not at every commit.
    sizes: Vec<usize>,
}

impl Recalled {
    /// A state read from the database rather than remembered.
    pub fn read(revision: Revision, created_at: i64, window: Vec<Message>) -> Self {
        Self {
            revision,
            created_at,
            window,
            sizes: Vec::new(),
        }
    }
}

impl ClaimMemory {
    /// Takes what is remembered of `conversation_id` for a claim in
    /// `namespace` with a window of `limit` entries; `None` when nothing
    /// matching is.
    pub fn take(
        &self,
        namespace: &Namespace,
        conversation_id: ConversationId,
        limit: u32,
    ) -> Option<Recalled> {
        let mut inner = self.lock();
        let remembered = inner.conversations.remove(&conversation_id)?;
        inner.bytes -= remembered.bytes;
        (remembered.namespace == *namespace && remembered.limit == limit).then_some(Recalled {
            revision: remembered.revision,
            created_at: remembered.created_at,
            window: remembered.window,
            sizes: remembered.sizes,
        })
    }

    /// Forgets `conversation_id` (deleted, or its last request not one to
    /// remember).
    pub fn forget(&self, conversation_id: ConversationId) {
        let mut inner = self.lock();
        if let Some(gone) = inner.conversations.remove(&conversation_id) {
            inner.bytes -= gone.bytes;
        }
    }

    /// Remembers `conversation_id` after a commit that left its admission
    /// idle at `after.revision`: the window read for the request
    /// (`after.window`, the last `limit` entries before it) followed by the
    /// messages the request added. Messages are kept as a read would return
    /// them; a request whose messages name images or files is not
    /// remembered.
    pub fn remember(
        &self,
        namespace: &Namespace,
        conversation_id: ConversationId,
        limit: u32,
        after: Recalled,
        added: &[Message],
    ) {
        let Recalled {
            revision,
            created_at,
            mut window,
            mut sizes,
        } = after;
        let Ok(Some(added)) = as_read(conversation_id, added) else {
            self.forget(conversation_id);
            return;
        };
        if sizes.len() != window.len() {
            sizes = window.iter().map(size_of_read).collect();
        }
        for (message, size) in added {
            window.push(message);
            sizes.push(size);
        }
        let excess = window.len().saturating_sub(limit as usize);
        window.drain(..excess);
        sizes.drain(..excess);
        let bytes = sizes.iter().sum::<usize>();
        if bytes > MAX_BYTES / 16 {
            self.forget(conversation_id);
            return;
        }
        let mut inner = self.lock();
        inner.clock += 1;
        let used = inner.clock;
        let remembered = Remembered {
            namespace: namespace.clone(),
            revision,
            created_at,
            limit,
            window,
            sizes,
            bytes,
            used,
        };
        if let Some(old) = inner.conversations.insert(conversation_id, remembered) {
            inner.bytes -= old.bytes;
        }
        inner.bytes += bytes;
        if inner.bytes > MAX_BYTES {
            // Down to three quarters of the bound at once, so that a full
            // memory sorts its entries once per many commits, not per commit.
            let mut by_use: Vec<(u64, ConversationId)> = inner
                .conversations
                .iter()
                .map(|(id, r)| (r.used, *id))
                .collect();
            by_use.sort_unstable();
            for (_, oldest) in by_use {
                if inner.bytes <= MAX_BYTES / 4 * 3 {
                    break;
                }
                if let Some(gone) = inner.conversations.remove(&oldest) {
                    inner.bytes -= gone.bytes;
                }
            }
        }
    }

    /// Forgets every conversation (a prune deleted some of them whole).
    pub fn clear(&self) {
        let mut inner = self.lock();
        inner.conversations.clear();
        inner.bytes = 0;
    }

    /// Whether a claim of `conversation_id` may be made from memory now.
    pub fn remembers(&self, conversation_id: ConversationId) -> bool {
        self.lock().conversations.contains_key(&conversation_id)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The map is consistent after every statement that changes it: a
        // panic elsewhere while it was held leaves nothing half-done.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// `messages` as a read of the transcript returns them (stored and decoded
/// again), each with what it costs to keep (its stored columns' bytes);
/// `None` when one names an image or a file.
fn as_read(
    conversation_id: ConversationId,
    messages: &[Message],
) -> Result<Option<Vec<(Message, usize)>>, Error> {
    if StepBlobs::of(messages).is_some() {
        return Ok(None);
    }
    let row = Row {
        table: "transcript",
        key: &conversation_id,
    };
    messages
        .iter()
        .map(|message| {
            let (role, content, meta) = message_columns(message)?;
            let size = KEPT + role.len() + content.len() + meta.as_ref().map_or(0, String::len);
            Ok((decode_message(&row, &role, content, meta.as_deref())?, size))
        })
        .collect::<Result<Vec<_>, Error>>()
        .map(Some)
}

/// What a message itself costs to keep beside its text.
const KEPT: usize = std::mem::size_of::<Message>();

/// About what a message of a window read from the database costs to keep:
/// its text, or its JSON when it is more than text. Measured once per read
/// window; the messages a request adds are measured by their stored columns.
fn size_of_read(message: &Message) -> usize {
    let plain = match message {
        Message::Assistant {
            tool_calls,
            provider_metadata,
            ..
        } if !tool_calls.is_empty() || provider_metadata.is_some() => None,
        _ => message.content().as_plain_text(),
    };
    KEPT + plain.map_or_else(
        || serde_json::to_string(message).map_or(0, |json| json.len()),
        str::len,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns() -> Namespace {
        Namespace::new("tests").expect("namespace")
    }

    fn after(revision: u64, window: Vec<Message>) -> Recalled {
        Recalled::read(Revision(revision), 7, window)
    }

    #[test]
    fn a_remembered_window_keeps_the_last_entries_and_is_taken_once() {
        let memory = ClaimMemory::default();
        let id = ConversationId::new();
        let window = vec![Message::user("a"), Message::assistant("b")];
        let added = [Message::user("c"), Message::assistant("d")];
        memory.remember(&ns(), id, 3, after(4, window), &added);
        let recalled = memory.take(&ns(), id, 3).expect("remembered");
        assert_eq!(recalled.revision, Revision(4));
        assert_eq!(
            recalled.window,
            vec![
                Message::assistant("b"),
                Message::user("c"),
                Message::assistant("d")
            ]
        );
        assert!(memory.take(&ns(), id, 3).is_none(), "taken, not copied");
    }

    #[test]
    fn another_namespace_or_window_size_recalls_nothing() {
        let memory = ClaimMemory::default();
        let id = ConversationId::new();
        let other = Namespace::new("other").expect("namespace");
        memory.remember(&ns(), id, 50, after(2, vec![]), &[Message::user("a")]);
        assert!(memory.take(&other, id, 50).is_none());
        memory.remember(&ns(), id, 50, after(2, vec![]), &[Message::user("a")]);
        assert!(memory.take(&ns(), id, 10).is_none());
        assert_eq!(
            memory.lock().bytes,
            0,
            "what was taken is no longer counted"
        );
    }

    #[test]
    fn past_its_bound_the_memory_forgets_the_longest_unused() {
        let memory = ClaimMemory::default();
        let text = "x".repeat(MAX_BYTES / 64);
        let ids: Vec<ConversationId> = (0..80).map(|_| ConversationId::new()).collect();
        for id in &ids {
            memory.remember(&ns(), *id, 50, after(2, vec![]), &[Message::user(&text)]);
        }
        assert!(memory.lock().bytes <= MAX_BYTES);
        assert!(
            memory.take(&ns(), ids[0], 50).is_none(),
            "the first is forgotten"
        );
        assert!(
            memory.take(&ns(), ids[79], 50).is_some(),
            "the last is kept"
        );
    }
}
