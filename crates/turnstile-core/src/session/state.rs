//! The admission of a conversation as a host sees it after a crash.

use tracing::instrument;

use super::AgentSession;
use crate::checkpoint::LoopCheckpoint;
use crate::error::Error;
use crate::ids::{RequestId, Revision, RunId};
use crate::message::Usage;

/// A conversation's admission: idle, or held by one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdmissionState {
    /// The compare-and-swap token of `resume_run`, `recover_after_owner_exit`
    /// and `abandon`.
    pub revision: Revision,
    /// The request holding the admission; `None` when the conversation is
    /// idle.
    pub active: Option<ActiveRequest>,
}

/// The request holding an admission, and where its owning run stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActiveRequest {
    /// The request holding the admission.
    pub request_id: RequestId,
    /// The run that owns the admission: the one to resume.
    pub run_id: RunId,
    /// The latest persisted usage of the request (summary passes included):
    /// a lower bound, as [`AgentSession::recovery_usage`] says.
    pub usage: Usage,
    /// The owning run's latest checkpoint; `None` before its first turn
    /// started.
    pub checkpoint: Option<LoopCheckpoint>,
}

impl AgentSession {
    /// The conversation's current admission, for a host deciding what to do
    /// after a crash: its revision and, while a request holds it, the
    /// request, its owning run, the latest persisted usage and that run's
    /// latest checkpoint. Each is read as it is now, in its own read: another
    /// owner may move the admission at any time, and the revision is what a
    /// takeover is checked against.
    ///
    /// # Errors
    /// [`Error::NotFound`] for a conversation that does not exist,
    /// [`Error::NamespaceMismatch`] for one of another namespace.
    ///
    /// # Cancel safety
    /// It only reads: dropping the future changes nothing.
    #[instrument(skip_all, fields(conversation_id = %self.conversation_id), err)]
    pub async fn admission(&self) -> Result<AdmissionState, Error> {
        // Both reads at once; the namespace is judged first.
        let (conversation, admission) = tokio::join!(
            self.store
                .conversation(&self.namespace, self.conversation_id),
            self.store.admission(self.conversation_id)
        );
        conversation?;
        let admission = admission?;
        let active = match admission.active {
            Some(active) => Some(ActiveRequest {
                request_id: active.request_id,
                run_id: active.run_id,
                usage: active.usage,
                checkpoint: self.store.latest_checkpoint(active.run_id).await?,
            }),
            None => None,
        };
        Ok(AdmissionState {
            revision: admission.revision,
            active,
        })
    }
}
