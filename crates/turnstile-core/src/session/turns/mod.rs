//! The turn protocol. Each step is durable before the next begins:
//! 1. write-ahead checkpoint `TurnInFlight` (committed with the claim for a
//!    request's first turn, and with the previous turn's checkpoint after a
//!    tool round, so it costs no commit of its own);
//! 2. model call, answer recorded (`ToolsInFlight`, tool calls journaled);
//! 3. each tool call executed and its result journaled;
//! 4. checkpoint `Ready` with the turn's tool results.
//!
//! A final answer (no tool calls) goes straight to the atomic commit. The
//! loop is a state machine over the checkpoint phase, so a resumed run
//! enters it wherever the run it continues stopped.

use std::collections::HashMap;
use std::future::Future;

use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;

mod model_context;
pub(super) mod spans;
mod stop;

use stop::until_deadline;
pub(in crate::session) use stop::{check_stop, first_turn_may_start, guarded};

use super::compact::Compacted;
use super::reconcile::InDoubt;
use super::stream::Emitter;
use crate::agent::{Agent, ModelRequest, RunContext, ToolContext, ToolError};
use crate::checkpoint::{CheckpointPhase, LoopCheckpoint};
use crate::error::BudgetKind;
use crate::error::{CallInDoubt, Error, ModelError};
use crate::events::Event;
use crate::ids::RunId;
use crate::message::ToolResult;
use crate::message::{Content, Message, ToolCall, VerificationReport};
use crate::store::{
    ApprovalRecord, ApprovalStatus, Fence, JournalStatus, PartLimits, Store, StoredOutcome,
};

/// The most text of one tool output fed back to the model.
pub const MAX_TOOL_OUTPUT_BYTES: usize = 1 << 20;

pub(super) struct RunLoop<'a> {
    pub agent: &'a Agent,
    pub store: &'a dyn Store,
    pub ctx: &'a RunContext,
    pub events: &'a Emitter,
    pub fence: Fence,
    /// What the model is shown: the system prompt and committed context,
    /// then, from `request_start`, the request's messages so far (the user
    /// input first). One list, so that a model call borrows it whole.
    pub context: Vec<Message>,
    pub request_start: usize,
    pub checkpoint: LoopCheckpoint,
    /// Set when resuming inside a tool round: results already journaled by
    /// the run being continued are reused, not executed again.
    pub reuse_journal: bool,
    /// A tool call is executing, or has run and its result is not journaled
    /// yet: a stop now leaves the turn ambiguous.
    pub tool_running: bool,
    /// The call in doubt of the round this run took over in flight, as its
    /// tool reconciled it before the claim.
    pub in_doubt: Option<InDoubt>,
    /// How many of the context's newest images the model is sent.
    pub images: usize,
}

impl RunLoop<'_> {
    /// Runs to the commit. On a stop (budget, deadline, cancellation, model
    /// failure) the run is marked failed and the admission stays held.
    pub async fn run(mut self) -> Result<(StoredOutcome, Vec<Message>), Error> {
        match self.drive().await {
            Ok(outcome) => Ok((outcome, self.context.split_off(self.request_start))),
            Err(error) => {
                // A stop for approval recorded itself, with its calls.
                if matches!(error, Error::AwaitingApproval { .. }) {
                } else if error.stopped_run().is_some() {
                    self.record_stop(&error).await;
                } else if let Error::Store(failure) = &error {
                    self.record_failed_step(failure).await;
                }
                Err(error)
            }
        }
    }

    async fn drive(&mut self) -> Result<StoredOutcome, Error> {
        loop {
            match self.checkpoint.phase {
                CheckpointPhase::Ready => self.begin_turn().await?,
                CheckpointPhase::TurnInFlight | CheckpointPhase::ModelPending => {
                    if let Some(outcome) = self.model_step().await? {
                        return Ok(outcome);
                    }
                }
                CheckpointPhase::ToolsInFlight | CheckpointPhase::ToolsPending => {
                    self.tool_step().await?
                }
                CheckpointPhase::Completed => {
                    return Err(Error::Corrupt {
                        table: "loop_checkpoints",
                        key: format!("{}/{}", self.fence.run_id, self.checkpoint.turn),
                        reason: "an active request's run is already completed".into(),
                    })
                }
            }
        }
    }

    async fn begin_turn(&mut self) -> Result<(), Error> {
        self.checkpoint = self.next_turn()?;
        self.store.begin_turn(&self.fence, &self.checkpoint).await?;
        self.events
            .emit(Event::TurnStarted {
                turn: self.checkpoint.turn,
            })
            .await;
        Ok(())
    }

    /// A run going on from a settled stop (`ModelPending`, `ToolsPending`)
    /// marks its turn in flight again before it calls the model or runs a
    /// tool, so a crash from here on is seen as one.
    async fn back_in_flight(&mut self) -> Result<(), Error> {
        let phase = match self.checkpoint.phase {
            CheckpointPhase::ModelPending => CheckpointPhase::TurnInFlight,
            CheckpointPhase::ToolsPending => CheckpointPhase::ToolsInFlight,
            _ => return Ok(()),
        };
        self.checkpoint.phase = phase;
        self.store.begin_turn(&self.fence, &self.checkpoint).await
    }

    /// The write-ahead checkpoint of the next turn, if the budget, the
    /// deadline and cancellation let it start.
    fn next_turn(&self) -> Result<LoopCheckpoint, Error> {
        let turn = self.checkpoint.turn.saturating_add(1);
        self.check_turn_limit(turn)?;
        self.check_token_budget()?;
        self.check_stop()?;
        Ok(LoopCheckpoint {
            turn,
            phase: CheckpointPhase::TurnInFlight,
            ..self.checkpoint.clone()
        })
    }

    /// Calls the model; commits a final answer, or records tool calls.
    async fn model_step(&mut self) -> Result<Option<StoredOutcome>, Error> {
        // Checked again here for a run resumed into a pending model call
        // (its budget may be lower than the one that wrote the write-ahead).
        self.check_turn_limit(self.checkpoint.turn)?;
        self.check_token_budget()?;
        self.check_stop()?;
        self.back_in_flight().await?;
        let turn = self.checkpoint.turn;
        model_context::load_shown(self.store, &mut self.context, self.images).await?;
        let context = model_context::shown(&self.context, self.images);
        let events = self.events.clone();
        let on_delta = move |text: &str| {
            events.emit_now(Event::TextDelta {
                turn,
                text: text.to_owned(),
            })
        };
        let request = ModelRequest {
            messages: &context,
            tools: &self.agent.specs,
            deltas: self.events.is_active().then_some(&on_delta as _),
            deadline: self.ctx.deadline,
        };
        let span = spans::model_call(self.agent.model.name(), self.fence.conversation_id);
        let response = match self
            .guard(self.agent.model.respond(request).instrument(span.clone()))
            .await?
        {
            Ok(response) => response,
            Err(source) => {
                // A discarded answer's tokens were spent all the same: the
                // stop's settled checkpoint counts them.
                self.checkpoint.usage += source.usage;
                return Err(self.model_failed(source));
            }
        };
        spans::record_usage(&span, &response.usage);
        tracing::debug!(
            turn,
            tool_calls = response.tool_calls.len(),
            "model responded"
        );
        self.events
            .emit(Event::ModelResponded {
                turn,
                usage: response.usage,
                tool_calls: response.tool_calls.len(),
            })
            .await;
        self.checkpoint.usage += response.usage;

        if response.tool_calls.is_empty() {
            let answer = Message::Assistant {
                content: response.content,
                tool_calls: Vec::new(),
                provider_metadata: response.provider_metadata,
            };
            self.checkpoint.phase = CheckpointPhase::Completed;
            self.checkpoint.message_count += 1;
            let outcome = self
                .store
                .commit(&self.fence, &self.checkpoint, &answer)
                .await?;
            self.context.push(answer);
            return Ok(Some(outcome));
        }
        validate_call_ids(&response.tool_calls).map_err(|source| self.model_failed(source))?;
        let assistant = Message::Assistant {
            content: response.content,
            tool_calls: response.tool_calls,
            provider_metadata: response.provider_metadata,
        };
        self.checkpoint.phase = CheckpointPhase::ToolsInFlight;
        self.store
            .record_model_response(&self.fence, &self.checkpoint, &assistant)
            .await?;
        self.context.push(assistant);
        Ok(None)
    }

    /// Answers every tool call of the turn's recorded assistant message.
    async fn tool_step(&mut self) -> Result<(), Error> {
        let turn = self.checkpoint.turn;
        let calls = self.recorded_calls()?;
        let count = calls.len() as u64;
        if let Some(limit) = self.ctx.budget.max_tool_calls {
            let used = self.checkpoint.tool_calls_count;
            if used.saturating_add(count) > limit {
                return Err(self.budget_exceeded(BudgetKind::ToolCalls, used, limit));
            }
        }
        // A run that goes on from a settled stop marks the round in flight
        // again only right before it runs a tool (`answer`): a run that
        // only asks again for approval leaves the turn settled.
        let resuming = self.reuse_journal;
        let mut journaled = self.journaled_results(turn).await?;
        let decisions = self.decisions(turn, &calls, &journaled, resuming).await?;
        let mut answered = Vec::with_capacity(calls.len());
        let mut waiting = Vec::new();
        for (index, call) in calls.into_iter().enumerate() {
            let reconciled = self
                .in_doubt
                .as_mut()
                .and_then(|d| d.take_done(turn, &call.id));
            let (result, reused) = match (journaled.remove(&call.id), reconciled) {
                (Some(result), _) => (result, true),
                // It took effect before the run stopped: journaled, not run.
                (None, Some(result)) => {
                    let result = self.journal_result(turn, &call.id, result).await?;
                    self.tool_running = false;
                    (result, true)
                }
                (None, None) => {
                    let result = match self.answer(index, &call, turn, &decisions).await? {
                        Some(result) => result,
                        None => {
                            waiting.push(call);
                            continue;
                        }
                    };
                    let result = self.journal_result(turn, &call.id, result).await?;
                    self.tool_running = false;
                    (result, false)
                }
            };
            self.events
                .emit(Event::ToolFinished {
                    turn,
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    content: result.content.text().into_owned(),
                    is_error: result.is_error,
                    reused,
                })
                .await;
            answered.push((call, result));
        }
        if !waiting.is_empty() {
            return Err(self.stop_for_approval(&waiting).await);
        }

        if let Some(verifier) = &self.agent.verifier {
            if let Some(report) = self.guard(verifier.verify(turn, &answered)).await? {
                // Reports are stored per turn: the turn is the loop's to set.
                self.checkpoint
                    .verification_reports
                    .push(VerificationReport { turn, ..report });
            }
        }
        let results: Vec<Message> = answered
            .into_iter()
            .map(|(call, result)| Message::tool(call.id, result.content, result.is_error))
            .collect();
        self.checkpoint.phase = CheckpointPhase::Ready;
        self.checkpoint.tool_calls_count = self.checkpoint.tool_calls_count.saturating_add(count);
        self.checkpoint.message_count += results.len() as u64 + 1;
        // The next turn's write-ahead shares this commit when the next turn
        // may start; otherwise `begin_turn` reports why it may not.
        let next = self.next_turn().ok();
        self.store
            .finish_turn(&self.fence, &self.checkpoint, &results, next.as_ref())
            .await?;
        self.context.extend(results);
        self.events
            .emit(Event::CheckpointSaved {
                turn,
                revision: self.fence.revision,
            })
            .await;
        if let Some(next) = next {
            self.checkpoint = next;
            self.events
                .emit(Event::TurnStarted {
                    turn: self.checkpoint.turn,
                })
                .await;
        }
        Ok(())
    }

    /// Answers one call not answered yet: runs it, or says why it does not
    /// run; `None` when it waits for a decision on its approval.
    async fn answer(
        &mut self,
        index: usize,
        call: &ToolCall,
        turn: u32,
        decisions: &HashMap<String, ApprovalRecord>,
    ) -> Result<Option<ToolResult>, Error> {
        let limit = self.agent.limits.max_tool_calls_per_turn;
        if index >= limit as usize {
            self.tool_started(call, turn).await;
            return Ok(Some(error_result(format!(
                "not run: more than {limit} tool calls in one turn"
            ))));
        }
        // A stored decision binds whatever the agent's rules are now (an
        // upgrade, a policy that answers otherwise): a rejected call never
        // runs, and one a human was asked about waits for the answer.
        let decision = decisions.get(&call.id);
        match decision.map(|d| d.status) {
            Some(ApprovalStatus::Approved) => {}
            Some(ApprovalStatus::Rejected) => {
                let reason = decision.and_then(|d| d.reason.as_deref());
                return Ok(Some(error_result(rejection(reason))));
            }
            Some(ApprovalStatus::Awaiting) => return Ok(None),
            None if self.agent.requires_approval(&call.name, &call.arguments) => return Ok(None),
            None => {}
        }
        self.back_in_flight().await?;
        self.tool_started(call, turn).await;
        self.execute(call, turn).await.map(Some)
    }

    async fn tool_started(&self, call: &ToolCall, turn: u32) {
        self.events
            .emit(Event::ToolStarted {
                turn,
                call_id: call.id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            })
            .await;
    }

    /// The approval rows of the turn: read when the run goes on with a
    /// round an earlier run may have asked about, or when a call not
    /// answered yet needs approval.
    async fn decisions(
        &self,
        turn: u32,
        calls: &[ToolCall],
        journaled: &HashMap<String, ToolResult>,
        resuming: bool,
    ) -> Result<HashMap<String, ApprovalRecord>, Error> {
        let unanswered = calls.iter().filter(|c| !journaled.contains_key(&c.id));
        let asks = resuming
            || unanswered
                .clone()
                .any(|call| self.agent.requires_approval(&call.name, &call.arguments));
        if !asks || unanswered.count() == 0 {
            return Ok(HashMap::new());
        }
        let approvals = self.store.approvals(self.fence.request_id, turn).await?;
        Ok(approvals
            .into_iter()
            .map(|a| (a.call_id.clone(), a))
            .collect())
    }

    /// Stops the run at a clean point to wait for decisions on `waiting`
    /// (every other call of the turn is answered and journaled): the calls
    /// journaled as awaiting approval and the turn settled, in one write;
    /// then each is announced. The error the run ends with.
    async fn stop_for_approval(&mut self, waiting: &[ToolCall]) -> Error {
        let settled = LoopCheckpoint {
            phase: CheckpointPhase::ToolsPending,
            ..self.checkpoint.clone()
        };
        let ids: Vec<String> = waiting.iter().map(|c| c.id.clone()).collect();
        let reason = format!("awaiting approval of {} tool call(s)", ids.len());
        let pending = match self
            .store
            .await_approval(&self.fence, &settled, &ids, &reason)
            .await
        {
            Ok(pending) => pending,
            Err(e) => return e,
        };
        self.checkpoint = settled;
        for p in &pending {
            self.events
                .emit(Event::ApprovalRequested {
                    request_id: p.request_id,
                    run_id: p.run_id,
                    call_id: p.call_id.clone(),
                    tool: p.tool.clone(),
                    arguments: p.arguments.clone(),
                    revision: p.revision,
                })
                .await;
        }
        Error::AwaitingApproval {
            request_id: self.fence.request_id,
            run_id: self.fence.run_id,
            revision: self.fence.revision,
            pending,
        }
    }

    /// The tool calls of the assistant message recorded for this turn.
    fn recorded_calls(&self) -> Result<Vec<ToolCall>, Error> {
        let at = usize::try_from(self.checkpoint.message_count).unwrap_or(usize::MAX);
        match self.context[self.request_start..].get(at) {
            Some(Message::Assistant { tool_calls, .. }) if !tool_calls.is_empty() => {
                Ok(tool_calls.clone())
            }
            _ => Err(Error::Corrupt {
                table: "run_messages",
                key: format!(
                    "{}/{}",
                    self.fence.request_id, self.checkpoint.message_count
                ),
                reason: "a tool round without a recorded assistant message with tool calls".into(),
            }),
        }
    }

    async fn journaled_results(&mut self, turn: u32) -> Result<HashMap<String, ToolResult>, Error> {
        if !std::mem::take(&mut self.reuse_journal) {
            return Ok(HashMap::new());
        }
        let journal = self.store.journal(self.fence.request_id, turn).await?;
        Ok(journal
            .into_iter()
            .filter(|e| e.status != JournalStatus::Requested)
            .filter_map(|e| e.result.map(|r| (e.call_id, r)))
            .collect())
    }

    /// Journals a tool's result. An output with images or files the store
    /// refuses (over its part limits) is journaled as an error result
    /// saying why, so the model hears of it and the run goes on.
    async fn journal_result(
        &self,
        turn: u32,
        call_id: &str,
        result: ToolResult,
    ) -> Result<ToolResult, Error> {
        match self
            .store
            .record_tool_result(&self.fence, turn, call_id, &result)
            .await
        {
            Ok(()) => Ok(result),
            Err(Error::InvalidInput(why)) if result.content.attachments().next().is_some() => {
                let refused = error_result(format!("the tool's output was not kept: {why}"));
                self.store
                    .record_tool_result(&self.fence, turn, call_id, &refused)
                    .await?;
                Ok(refused)
            }
            Err(e) => Err(e),
        }
    }

    /// Runs one tool. Whatever goes wrong with the tool becomes an error
    /// result; only cancellation and the deadline stop the run.
    async fn execute(&mut self, call: &ToolCall, turn: u32) -> Result<ToolResult, Error> {
        let Some((tool, check)) = self.agent.tool(&call.name) else {
            return Ok(error_result(format!("unknown tool {:?}", call.name)));
        };
        let tool = tool.clone();
        let arguments: serde_json::Value = match serde_json::from_str(&call.arguments) {
            Ok(arguments) => arguments,
            Err(e) => return Ok(error_result(format!("invalid JSON arguments: {e}"))),
        };
        if let Err(why) = check.check(&arguments) {
            return Ok(error_result(why));
        }
        let context =
            ToolContext::of_call(self.fence.run_id, self.fence.request_id, turn, &call.id);
        // Never start a tool once the run is told to stop.
        self.check_stop()?;
        self.tool_running = true;
        // Spawned so a panic is caught as a JoinError; aborted if this run
        // is dropped, so a dropped stream leaves no tool running.
        let span = spans::tool_call(&call.name, &call.id, self.fence.conversation_id);
        let task = AbortOnDropHandle::new(tokio::spawn(
            async move { tool.call(arguments, context).await }.instrument(span),
        ));
        let timeout = self.agent.limits.tool_timeout;
        let finished =
            until_deadline(self.ctx, &self.fence, tokio::time::timeout(timeout, task)).await?;
        Ok(match finished {
            Err(_) => error_result(format!("tool timed out after {} ms", timeout.as_millis())),
            Ok(Err(join)) if join.is_panic() => error_result("tool panicked".to_owned()),
            Ok(Err(join)) => error_result(format!("tool task failed: {join}")),
            // Never the model's to hear: the turn stays in flight.
            Ok(Ok(Err(e))) if e.is_in_doubt() => {
                return Err(Error::ToolInDoubt {
                    run_id: self.fence.run_id,
                    revision: self.fence.revision,
                    call: Box::new(CallInDoubt {
                        turn,
                        call_id: call.id.clone(),
                        tool: call.name.clone(),
                        message: e.message().to_owned(),
                    }),
                })
            }
            Ok(Ok(output)) => tool_result(output),
        })
    }

    /// Awaits `future` unless the run is cancelled or its deadline passes.
    async fn guard<T>(&self, future: impl Future<Output = T>) -> Result<T, Error> {
        guarded(self.ctx, &self.fence, future).await
    }

    /// Whether `turn` is within the run's turn limit (the turns before it
    /// are the ones used).
    fn check_turn_limit(&self, turn: u32) -> Result<(), Error> {
        let limit = turn_limit(self.agent, self.ctx);
        if turn > limit {
            return Err(self.budget_exceeded(
                BudgetKind::Turns,
                u64::from(turn.saturating_sub(1)),
                u64::from(limit),
            ));
        }
        Ok(())
    }

    fn check_token_budget(&self) -> Result<(), Error> {
        match self.ctx.budget.max_tokens {
            Some(limit) if self.checkpoint.usage.total() >= limit => {
                Err(self.budget_exceeded(BudgetKind::Tokens, self.checkpoint.usage.total(), limit))
            }
            _ => Ok(()),
        }
    }

    fn check_stop(&self) -> Result<(), Error> {
        check_stop(self.ctx, &self.fence)
    }

    fn model_failed(&self, source: ModelError) -> Error {
        Error::Model {
            run_id: self.fence.run_id,
            revision: self.fence.revision,
            source: Box::new(source),
        }
    }

    fn budget_exceeded(&self, kind: BudgetKind, used: u64, limit: u64) -> Error {
        Error::BudgetExceeded {
            run_id: self.fence.run_id,
            revision: self.fence.revision,
            kind,
            used,
            limit,
        }
    }
}

/// The write-ahead of a request's first turn, saved with its claim when
/// the run goes straight to that turn (no summary passes to run first).
pub(super) fn first_turn(run_id: RunId) -> LoopCheckpoint {
    LoopCheckpoint {
        run_id,
        turn: 1,
        phase: CheckpointPhase::TurnInFlight,
        usage: Default::default(),
        tool_calls_count: 0,
        verification_reports: Vec::new(),
        message_count: 1,
        created_at: 0,
    }
}

/// The state of a request before its first turn: its input is its only
/// message; its summary passes are its turns and usage so far.
pub(super) fn start_of(fence: Fence, compacted: Compacted) -> LoopCheckpoint {
    LoopCheckpoint {
        run_id: fence.run_id,
        turn: compacted.passes,
        phase: CheckpointPhase::Ready,
        usage: compacted.usage,
        tool_calls_count: 0,
        verification_reports: Vec::new(),
        message_count: 1,
        created_at: 0,
    }
}

/// The budget a request stopped between turns (`checkpoint`'s phase
/// `Ready`) has already spent, so that its next turn could not start: the
/// kind, what was used and the limit. A run that continued it would stop at
/// once.
pub(super) fn spent_between_turns(
    agent: &Agent,
    ctx: &RunContext,
    checkpoint: &LoopCheckpoint,
) -> Option<(BudgetKind, u64, u64)> {
    if checkpoint.phase != CheckpointPhase::Ready {
        return None;
    }
    let turns = turn_limit(agent, ctx);
    if checkpoint.turn >= turns {
        return Some((
            BudgetKind::Turns,
            u64::from(checkpoint.turn),
            u64::from(turns),
        ));
    }
    let used = checkpoint.usage.total();
    match ctx.budget.max_tokens {
        Some(limit) if used >= limit => Some((BudgetKind::Tokens, used, limit)),
        _ => None,
    }
}

/// The request's turn limit: the caller's budget within the agent's own.
/// Summary passes count as turns of the request.
pub(super) fn turn_limit(agent: &Agent, ctx: &RunContext) -> u32 {
    ctx.budget
        .max_turns
        .map_or(agent.limits.max_turns, |m| m.min(agent.limits.max_turns))
}

/// The result a rejected call gives the model.
fn rejection(reason: Option<&str>) -> String {
    match reason {
        Some(reason) if !reason.is_empty() => {
            format!("not run: the tool call was rejected by the approver: {reason}")
        }
        _ => "not run: the tool call was rejected by the approver".to_owned(),
    }
}

/// What a tool answered, as the result journaled and fed to the model.
pub(super) fn tool_result(output: Result<Content, ToolError>) -> ToolResult {
    match output {
        Err(e) => error_result(e.message().to_owned()),
        Ok(content) => match oversize(&content) {
            Some(why) => error_result(why),
            None => ToolResult {
                content,
                is_error: false,
            },
        },
    }
}

fn error_result(content: String) -> ToolResult {
    ToolResult {
        content: content.into(),
        is_error: true,
    }
}

/// Why a tool's output is too large for the model, if it is: text past
/// [`MAX_TOOL_OUTPUT_BYTES`], or an image or file past the default part
/// limit ([`PartLimits`]).
fn oversize(content: &Content) -> Option<String> {
    let text = content.text().len();
    if text > MAX_TOOL_OUTPUT_BYTES {
        return Some(format!(
            "tool output of {text} bytes exceeds the {MAX_TOOL_OUTPUT_BYTES}-byte limit"
        ));
    }
    let limit = PartLimits::DEFAULT_MAX_PART_BYTES;
    content.attachments().find(|a| a.size() > limit).map(|a| {
        format!(
            "tool output {} exceeds the {limit}-byte limit of a part",
            a.describe()
        )
    })
}

/// Tool call ids key the journal: they must be present and distinct.
fn validate_call_ids(calls: &[ToolCall]) -> Result<(), ModelError> {
    let mut seen = std::collections::HashSet::new();
    for call in calls {
        if call.id.is_empty() || !seen.insert(call.id.as_str()) {
            return Err(ModelError::fatal(format!(
                "malformed tool calls: empty or repeated call id {:?}",
                call.id
            )));
        }
    }
    Ok(())
}
