//! Requests that wait for a human's approval of tool calls. Their admission
//! is held by a stopped run, which the store counts as stuck; but nothing
//! is wrong with them: they wait for `approve` / `reject`. `ls`, `show` and
//! `doctor` show them as "awaiting approval" and count them apart from the
//! stuck ones.

use std::collections::HashSet;

use serde_json::Value;

use crate::cli::exit::CliError;
use turnstile::admin::HeldAdmission;
use turnstile::ids::{ConversationId, RequestId};
use turnstile::StoreAdmin;

/// The requests with tool calls awaiting a decision.
pub(super) struct Awaiting(HashSet<RequestId>);

impl Awaiting {
    /// Those of one conversation, or of all.
    pub(super) async fn read(
        store: &dyn StoreAdmin,
        conversation: Option<ConversationId>,
    ) -> Result<Self, CliError> {
        let pending = store.pending_approvals(conversation).await?;
        Ok(Self(pending.iter().map(|p| p.request_id).collect()))
    }

    /// How many requests wait.
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether `held` is held by a request that waits for approval.
    pub(super) fn holds(&self, held: Option<&HeldAdmission>) -> bool {
        held.is_some_and(|held| self.0.contains(&held.request_id))
    }

    /// A listing or a conversation as `--json` writes it, with every
    /// `held` admission saying `awaiting_approval` (and, when it is, not
    /// `stuck`).
    pub(super) fn annotated(&self, value: &impl serde::Serialize) -> Result<Value, CliError> {
        let mut value = serde_json::to_value(value)
            .map_err(|e| CliError::Failed(format!("cannot encode the output as json: {e}")))?;
        self.annotate(&mut value);
        Ok(value)
    }

    fn annotate(&self, value: &mut Value) {
        match value {
            Value::Array(items) => items.iter_mut().for_each(|item| self.annotate(item)),
            Value::Object(fields) => {
                for (key, field) in fields.iter_mut() {
                    match (key.as_str(), field) {
                        ("held", Value::Object(held)) => {
                            let awaiting = held
                                .get("request_id")
                                .and_then(Value::as_str)
                                .and_then(|id| id.parse::<RequestId>().ok())
                                .is_some_and(|id| self.0.contains(&id));
                            if awaiting {
                                held.insert("stuck".into(), Value::Bool(false));
                            }
                            held.insert("awaiting_approval".into(), Value::Bool(awaiting));
                        }
                        (_, field) => self.annotate(field),
                    }
                }
            }
            _ => {}
        }
    }
}
