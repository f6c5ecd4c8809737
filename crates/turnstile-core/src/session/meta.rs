//! The session's conversation metadata: thin wrappers over the store's
//! read and compare-and-swap, in the session's namespace.

use tracing::instrument;

use super::AgentSession;
use crate::error::Error;
use crate::store::{ConversationMeta, MetaUpdate};

impl AgentSession {
    /// The conversation's title, owner and metadata.
    ///
    /// # Errors
    /// [`Error::NotFound`] before the conversation exists,
    /// [`Error::NamespaceMismatch`] if it is another namespace's.
    #[instrument(skip_all, fields(conversation_id = %self.conversation_id), err)]
    pub async fn meta(&self) -> Result<ConversationMeta, Error> {
        self.store
            .conversation_meta(&self.namespace, self.conversation_id)
            .await
    }

    /// Changes the metadata with one compare-and-swap at
    /// `expected_meta_version` (0 creates the conversation if it does not
    /// exist yet), as
    /// [`Store::set_conversation_meta`](crate::store::Store::set_conversation_meta).
    ///
    /// # Errors
    /// [`Error::MetaVersionConflict`] for a stale version,
    /// [`Error::InvalidInput`] for a bound broken; nothing is written.
    #[instrument(skip_all, fields(conversation_id = %self.conversation_id), err)]
    pub async fn set_meta(
        &self,
        expected_meta_version: u64,
        update: &MetaUpdate,
    ) -> Result<ConversationMeta, Error> {
        self.store
            .set_conversation_meta(
                &self.namespace,
                self.conversation_id,
                expected_meta_version,
                update,
            )
            .await
    }
}
