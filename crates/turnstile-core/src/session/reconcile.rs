//! The call in doubt of a tool round in flight: before a recovery claims
//! the request, the tool of the call that may have run unjournaled is asked
//! whether it took effect ([`Tool::reconcile`](crate::Tool::reconcile)).
//!
//! Tools run one at a time, in order, so at most one call of a round can be
//! in doubt: the first call with no journaled result that does not wait for
//! a decision. The calls after it never started.

use std::time::Duration;

use tokio_util::task::AbortOnDropHandle;

use super::turns::tool_result;
use super::AgentSession;
use crate::agent::{Reconciliation, RunContext, ToolContext};
use crate::checkpoint::LoopCheckpoint;
use crate::error::Error;
use crate::ids::{RequestId, RunId};
use crate::message::{Message, ToolCall, ToolResult};
use crate::store::{ApprovalStatus, JournalStatus, ResolvedRound};

/// What is known of a tool round in flight.
#[derive(Debug)]
pub(super) struct InDoubt {
    /// The round's turn.
    pub turn: u32,
    /// How many of its calls were answered when it was read.
    pub answered: u32,
    /// The call that may have run, and what its tool said; `None` when no
    /// call of the round can have run unjournaled.
    pub call: Option<(String, Verdict)>,
}

/// What happens to the call in doubt.
#[derive(Debug)]
pub(super) enum Verdict {
    /// It took effect: this result is journaled and it does not run.
    Done(ToolResult),
    /// It runs: it took no effect, or its tool is idempotent.
    Run,
    /// Nobody can tell: the resume policy decides.
    Unknown,
}

impl InDoubt {
    /// The round as the claim checks it, when it may go on without a
    /// policy that retries it.
    pub fn resolved(&self) -> Option<ResolvedRound> {
        match self.call {
            Some((_, Verdict::Unknown)) => None,
            _ => Some(ResolvedRound {
                turn: self.turn,
                answered: self.answered,
            }),
        }
    }

    /// The reconciled result of `call_id` at `turn`, taken: journaled in
    /// place of running the call.
    pub fn take_done(&mut self, turn: u32, call_id: &str) -> Option<ToolResult> {
        match self.call.take() {
            Some((id, Verdict::Done(result))) if turn == self.turn && id == call_id => Some(result),
            other => {
                self.call = other;
                None
            }
        }
    }
}

impl AgentSession {
    /// Reconciles the call in doubt of `checkpoint`'s tool round, in flight
    /// when `from_run` stopped. Writes nothing.
    pub(super) async fn in_doubt(
        &self,
        request_id: RequestId,
        from_run: RunId,
        checkpoint: &LoopCheckpoint,
        ctx: &RunContext,
    ) -> Result<InDoubt, Error> {
        let turn = checkpoint.turn;
        let (answered, call) = self.call_in_doubt(request_id, checkpoint).await?;
        let nothing = InDoubt {
            turn,
            answered,
            call: None,
        };
        let Some(call) = call else {
            return Ok(nothing);
        };
        let Some((tool, check)) = self.agent.tool(&call.name) else {
            // Answered "unknown tool" without running.
            return Ok(nothing);
        };
        let arguments: serde_json::Value = match serde_json::from_str(&call.arguments) {
            Ok(arguments) if check.check(&arguments).is_ok() => arguments,
            // Answered with the reason, without running.
            _ => return Ok(nothing),
        };
        let context = ToolContext::of_call(from_run, request_id, turn, &call.id);
        let tool = tool.clone();
        let asked = {
            let tool = tool.clone();
            AbortOnDropHandle::new(tokio::spawn(async move {
                tool.reconcile(arguments, context).await
            }))
        };
        let limit = reconcile_limit(self.agent.limits.tool_timeout, ctx);
        let reconciliation = match tokio::time::timeout(limit, asked).await {
            Ok(Ok(reconciliation)) => reconciliation,
            // A panic or a timeout tells nothing.
            Ok(Err(_)) | Err(_) => Reconciliation::Unknown,
        };
        let verdict = match reconciliation {
            Reconciliation::Done(Err(e)) if e.is_in_doubt() => match tool.idempotent() {
                true => Verdict::Run,
                false => Verdict::Unknown,
            },
            Reconciliation::Done(output) => Verdict::Done(tool_result(output)),
            Reconciliation::NotDone => Verdict::Run,
            Reconciliation::Unknown if tool.idempotent() => Verdict::Run,
            Reconciliation::Unknown => Verdict::Unknown,
        };
        tracing::info!(
            %request_id,
            turn,
            call_id = %call.id,
            tool = %call.name,
            verdict = verdict.name(),
            "reconciled a tool call in doubt"
        );
        Ok(InDoubt {
            turn,
            answered,
            call: Some((call.id, verdict)),
        })
    }

    /// How many calls of the round are answered, and the first with no
    /// journaled result that does not wait for a decision (and is within
    /// the per-turn limit).
    async fn call_in_doubt(
        &self,
        request_id: RequestId,
        checkpoint: &LoopCheckpoint,
    ) -> Result<(u32, Option<ToolCall>), Error> {
        let turn = checkpoint.turn;
        let messages = self
            .store
            .request_messages(request_id, checkpoint.messages_recorded())
            .await?;
        let at = usize::try_from(checkpoint.message_count).unwrap_or(usize::MAX);
        let Some(Message::Assistant { tool_calls, .. }) = messages.into_iter().nth(at) else {
            return Err(Error::Corrupt {
                table: "run_messages",
                key: format!("{request_id}/{at}"),
                reason: "a tool round without a recorded assistant message".into(),
            });
        };
        let journal = self.store.journal(request_id, turn).await?;
        let decisions = self.store.approvals(request_id, turn).await?;
        let limit = self.agent.limits.max_tool_calls_per_turn as usize;
        let answered = |call: &ToolCall| {
            journal
                .iter()
                .any(|e| e.call_id == call.id && e.status != JournalStatus::Requested)
        };
        let waits = |call: &ToolCall| match decisions.iter().find(|d| d.call_id == call.id) {
            Some(decision) => decision.status != ApprovalStatus::Approved,
            None => self.agent.requires_approval(&call.name, &call.arguments),
        };
        let count = journal
            .iter()
            .filter(|e| e.status != JournalStatus::Requested)
            .count();
        let call = tool_calls
            .into_iter()
            .take(limit)
            .find(|call| !answered(call) && !waits(call));
        Ok((u32::try_from(count).unwrap_or(u32::MAX), call))
    }
}

impl Verdict {
    fn name(&self) -> &'static str {
        match self {
            Verdict::Done(_) => "done",
            Verdict::Run => "run",
            Verdict::Unknown => "unknown",
        }
    }
}

/// How long a reconciliation may take: the agent's tool timeout, cut short
/// by the run's deadline.
fn reconcile_limit(tool_timeout: Duration, ctx: &RunContext) -> Duration {
    match ctx.deadline {
        Some(at) => tool_timeout.min(at.saturating_duration_since(tokio::time::Instant::now())),
        None => tool_timeout,
    }
}
