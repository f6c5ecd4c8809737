//! The tool abstraction.

use async_trait::async_trait;

use crate::ids::{RequestId, RunId};
use crate::message::{Content, ToolSpec};

/// What a tool call knows about where it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolContext {
    /// The run executing the call.
    pub run_id: RunId,
    /// The request the call belongs to.
    pub request_id: RequestId,
    /// The request's turn that asked for it.
    pub turn: u32,
    /// The call's id, as the model gave it.
    pub call_id: String,
    /// `request/turn/call`: the same for every execution attempt of this call,
    /// across resumes and recoveries. Pass it to external services that
    /// deduplicate, since turnstile cannot fence them.
    pub idempotency_key: String,
}

impl ToolContext {
    /// The context of call `call_id` of `request_id`'s turn `turn`, run by
    /// `run_id`.
    pub(crate) fn of_call(run_id: RunId, request_id: RequestId, turn: u32, call_id: &str) -> Self {
        Self {
            run_id,
            request_id,
            turn,
            call_id: call_id.to_owned(),
            idempotency_key: format!("{request_id}/{turn}/{call_id}"),
        }
    }
}

/// A tool failed. Its message is fed back to the model as an error result,
/// unless the call is in doubt ([`ToolError::in_doubt`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ToolError {
    message: String,
    in_doubt: bool,
}

impl ToolError {
    /// A failure with `message` for the model.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            in_doubt: false,
        }
    }

    /// The call may or may not have taken effect, and nobody can tell now
    /// (its connection to the service that runs it dropped mid-call, say).
    /// Not a result for the model: the run stops with
    /// [`Error::ToolInDoubt`](crate::Error::ToolInDoubt), the call
    /// unjournaled and its turn in flight, as if the process had died there;
    /// a recovery asks [`Tool::reconcile`] first.
    pub fn in_doubt(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            in_doubt: true,
        }
    }

    /// What went wrong.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether it is [`ToolError::in_doubt`].
    pub fn is_in_doubt(&self) -> bool {
        self.in_doubt
    }
}

/// A tool the model may call. Object-safe: agents hold it as `Arc<dyn Tool>`.
#[async_trait]
pub trait Tool: Send + Sync {
    /// Name, description and JSON-schema parameters, as the model sees them.
    fn spec(&self) -> ToolSpec;

    /// Runs the tool on parsed JSON arguments. Its output is text
    /// (`Ok(text.into())`) or parts: text, images and files
    /// (`Ok(Content::new(parts))`), stored with the call's journal entry
    /// and its tool message. Errors, timeouts and panics become error
    /// results for the model; they never crash the run.
    async fn call(
        &self,
        arguments: serde_json::Value,
        context: ToolContext,
    ) -> Result<Content, ToolError>;

    /// Whether a call may simply run again when its run stopped during it:
    /// its effect happens once however often it runs (it has none, or it
    /// deduplicates by [`ToolContext::idempotency_key`]). Such a call runs
    /// again, with the same key, when a recovery under the default
    /// [`ResumePolicy`](crate::ResumePolicy) finds it in doubt and
    /// [`Tool::reconcile`] cannot tell. `false` unless a tool says so.
    fn idempotent(&self) -> bool {
        false
    }

    /// Asked on recovery about a call that was in flight when its run
    /// stopped, before anything runs again: did it take effect? Its
    /// `context` has the call's idempotency key, turn and id, and the run
    /// being continued (which may not be the run that started the call).
    /// [`Reconciliation::Done`] is journaled as the call's result and
    /// nothing runs; [`Reconciliation::NotDone`] runs the call once;
    /// [`Reconciliation::Unknown`], the default, leaves the call to the
    /// resume policy. Bounded by the agent's tool timeout; a timeout, a
    /// panic, or a done call that failed in doubt
    /// ([`ToolError::in_doubt`]) counts as unknown. Not asked after an
    /// agent upgrade: the call is then ambiguous as before.
    async fn reconcile(
        &self,
        arguments: serde_json::Value,
        context: ToolContext,
    ) -> Reconciliation {
        let _ = (arguments, context);
        Reconciliation::Unknown
    }
}

/// What [`Tool::reconcile`] found out about a call in doubt.
#[derive(Clone, Debug, PartialEq)]
pub enum Reconciliation {
    /// The call took effect, and this is what it answered (or how it
    /// failed): journaled as if the call had returned; it does not run.
    Done(Result<Content, ToolError>),
    /// The call took no effect: it runs once.
    NotDone,
    /// The tool cannot tell: the call is ambiguous, unless the tool is
    /// [`Tool::idempotent`] or the resume policy retries it.
    Unknown,
}
