//! Summary compaction before a request's first turn.
//!
//! Each pass is three durable steps: the pass (input range, transcript
//! version, prompt hash) is recorded in the admission; the summary model is
//! called; the summary row is committed with the pass count and usage. A run
//! that stops anywhere in between is continued from the admission: a
//! committed summary is found (its acknowledgement may have been lost) and
//! never made again; a pass in flight is re-run with the same prompt and
//! counts once. A summary call has no side effect but its cost, so re-running
//! it is never ambiguous.

mod prompt;

pub(super) use prompt::context_message;
pub use prompt::{MaxPasses, DEFAULT_SUMMARY_PROMPT, MAX_SUMMARY_BYTES, SUMMARY_HEADING};

use tracing::Instrument;

use super::stream::Emitter;
use super::turns::{check_stop, guarded, spans, turn_limit};
use super::{AgentSession, SummarySettings};
use crate::agent::{ModelRequest, RunContext};
use crate::error::BudgetKind;
use crate::error::Error;
use crate::events::Event;
use crate::ids::Revision;
use crate::message::{Message, Usage};
use crate::store::{Fence, StoredSummary, SummaryCommit, SummaryPass, TranscriptEntry};

/// The request's state before its first turn.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Compacted {
    /// Summary passes committed: the request's turns so far.
    pub passes: u32,
    /// The request's usage so far: its summary passes'.
    pub usage: Usage,
}

impl AgentSession {
    /// Runs the summary passes the request still needs. A stop (budget,
    /// deadline, cancellation, model error, pass limit, refused summary) or
    /// a pass that failed in the store is recorded on the run, when the
    /// store still takes it; the admission stays held. (There is no turn
    /// checkpoint to settle yet: a pass's progress lives in the admission.)
    pub(super) async fn compact(
        &self,
        fence: &Fence,
        ctx: &RunContext,
        events: &Emitter,
    ) -> Result<Compacted, Error> {
        let Some(settings) = &self.summary else {
            return Ok(Compacted::default());
        };
        let result = self.compact_with(settings, fence, ctx, events).await;
        if let Err(error) = &result {
            let message = match error {
                Error::Store(failure) => Some(format!("a durable step failed: {failure}")),
                stopped if stopped.stopped_run().is_some() => Some(stopped.to_string()),
                _ => None,
            };
            if let Some(message) = message {
                if let Err(e) = self.store.fail_run(fence, &message, None).await {
                    tracing::warn!(run_id = %fence.run_id, error = %e, "could not record run failure");
                }
            }
        }
        result
    }

    async fn compact_with(
        &self,
        settings: &SummarySettings,
        fence: &Fence,
        ctx: &RunContext,
        events: &Emitter,
    ) -> Result<Compacted, Error> {
        let admission = self.store.admission(self.conversation_id).await?;
        let active = match admission.active {
            Some(active)
                if admission.revision == fence.revision && active.run_id == fence.run_id =>
            {
                active
            }
            _ => {
                return Err(Error::Fenced {
                    run_id: fence.run_id,
                    revision: fence.revision,
                })
            }
        };
        let mut state = Compacted {
            passes: active.summary.passes,
            usage: active.usage,
        };
        let mut in_flight = active.summary.pending;
        // The transcript cannot move while the admission is held; the store
        // checks this version again on every summary write anyway.
        let version = self
            .store
            .conversation(&self.namespace, self.conversation_id)
            .await?
            .version;
        let window_start = self.window_start().await?;
        let batch = u64::from(self.policy.summary_batch());
        let mut latest = self.store.latest_summary(self.conversation_id).await?;
        loop {
            let next = latest.as_ref().map_or(0, |s| s.through_seq + 1);
            let remaining = window_start.saturating_sub(next);
            if remaining < batch {
                if let Some(pass) = in_flight {
                    // A recorded pass the transcript no longer calls for.
                    return Err(transcript_moved(fence, pass.transcript_version, version));
                }
                return Ok(state);
            }
            let max_passes = settings.max_passes.get();
            if state.passes >= max_passes {
                return Err(Error::SummaryPassLimitExceeded {
                    run_id: fence.run_id,
                    revision: fence.revision,
                    remaining_entries: remaining,
                    max_passes,
                });
            }
            let turn = state.passes + 1;
            self.check_budget(fence, ctx, &state)?;
            check_stop(ctx, fence)?;

            let entries = self.batch_entries(next, batch).await?;
            let through_seq = entries.last().map_or(next, |e| e.seq);
            let messages = prompt::prompt(
                &settings.agent.system_prompt,
                latest.as_ref().map(|s| s.content.as_str()),
                &entries,
            );
            let pass = SummaryPass {
                from_seq: next,
                through_seq,
                transcript_version: version,
                prompt_sha256: prompt::prompt_sha256(&messages),
            };
            if let Some(recorded) = in_flight.take() {
                if recorded != pass {
                    return Err(transcript_moved(
                        fence,
                        recorded.transcript_version,
                        version,
                    ));
                }
            }
            self.store.record_summary_pass(fence, &pass).await?;
            events
                .emit(Event::SummaryStarted {
                    turn,
                    from_seq: next,
                    through_seq,
                })
                .await;

            let stored = self
                .summarize(settings, fence, ctx, pass, &messages)
                .await?;
            state.passes = turn;
            state.usage += stored.usage;
            events
                .emit(Event::SummaryCommitted {
                    turn,
                    summary_id: stored.id,
                    through_seq,
                    usage: stored.usage,
                })
                .await;
            latest = Some(stored);
        }
    }

    /// The summary model call of a recorded pass, and the commit of its
    /// answer.
    async fn summarize(
        &self,
        settings: &SummarySettings,
        fence: &Fence,
        ctx: &RunContext,
        pass: SummaryPass,
        messages: &[Message],
    ) -> Result<StoredSummary, Error> {
        let request = ModelRequest {
            messages,
            tools: &[],
            deltas: None,
            deadline: ctx.deadline,
        };
        let span = spans::model_call(settings.agent.model.name(), fence.conversation_id);
        let respond = settings
            .agent
            .model
            .respond(request)
            .instrument(span.clone());
        let response = guarded(ctx, fence, respond)
            .await?
            .map_err(|source| Error::Model {
                run_id: fence.run_id,
                revision: fence.revision,
                source: Box::new(source),
            })?;
        spans::record_usage(&span, &response.usage);
        tracing::debug!(
            from_seq = pass.from_seq,
            through_seq = pass.through_seq,
            "summary model responded"
        );
        // The summary is the answer's text; its reasoning is not kept.
        let summary = response.content.text().into_owned();
        prompt::check_output(&summary).map_err(|reason| Error::InvalidSummary {
            run_id: fence.run_id,
            revision: fence.revision,
            reason,
        })?;
        self.store
            .commit_summary(
                fence,
                &SummaryCommit {
                    pass,
                    content: summary,
                    usage: response.usage,
                },
            )
            .await
    }

    /// A pass is a turn of the request and spends its tokens.
    fn check_budget(
        &self,
        fence: &Fence,
        ctx: &RunContext,
        state: &Compacted,
    ) -> Result<(), Error> {
        let exceeded = |kind, used, limit| Error::BudgetExceeded {
            run_id: fence.run_id,
            revision: fence.revision,
            kind,
            used,
            limit,
        };
        let limit = turn_limit(&self.agent, ctx);
        if state.passes >= limit {
            return Err(exceeded(
                BudgetKind::Turns,
                u64::from(state.passes),
                u64::from(limit),
            ));
        }
        match ctx.budget.max_tokens {
            Some(limit) if state.usage.total() >= limit => {
                Err(exceeded(BudgetKind::Tokens, state.usage.total(), limit))
            }
            _ => Ok(()),
        }
    }

    /// Where the window begins: its first user message (as the plain
    /// sliding window does), or the end of a window that has none.
    async fn window_start(&self) -> Result<u64, Error> {
        let window = self
            .store
            .transcript_window(self.conversation_id, self.policy.window())
            .await?;
        Ok(
            match window
                .iter()
                .find(|e| matches!(e.message, Message::User { .. }))
            {
                Some(first_user) => first_user.seq,
                None => window.last().map_or(0, |e| e.seq + 1),
            },
        )
    }

    /// The entries of the batch starting at `from`: `batch` of them, and the
    /// tool results right after them (read on until a non-tool entry). The
    /// batch never reaches the window, which starts at a user message.
    async fn batch_entries(&self, from: u64, batch: u64) -> Result<Vec<TranscriptEntry>, Error> {
        let conversation = self.conversation_id;
        let mut to = from + batch + 1;
        let mut entries = self.store.transcript_range(conversation, from, to).await?;
        let len = loop {
            let len = prompt::batch_len(&entries, batch as usize);
            let transcript_ended = (entries.len() as u64) < to - from;
            if len < entries.len() || transcript_ended {
                break len;
            }
            let more = self
                .store
                .transcript_range(conversation, to, to + batch)
                .await?;
            to += batch;
            entries.extend(more);
        };
        entries.truncate(len);
        let contiguous = entries
            .iter()
            .enumerate()
            .all(|(i, e)| e.seq == from + i as u64);
        if entries.is_empty() || !contiguous {
            return Err(Error::Corrupt {
                table: "transcript",
                key: format!("{conversation}/{from}"),
                reason: "a gap in the committed transcript".into(),
            });
        }
        Ok(entries)
    }
}

/// The transcript (or the summary chain) is not what a recorded pass read:
/// fail closed.
fn transcript_moved(fence: &Fence, expected: u64, actual: u64) -> Error {
    Error::Conflict {
        conversation_id: fence.conversation_id,
        expected: Revision(expected),
        actual: Revision(actual),
    }
}
