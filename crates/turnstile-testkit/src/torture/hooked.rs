//! A store wrapper that lets a test watch or steer every store call
//! ([`Hooked`] and its [`Hook`]), and the hook that traces them for the
//! crash tortures ([`TraceHook`]): `@C + KIND DETAIL` on entering a store
//! call, `@C - KIND` on leaving it. Every call is delegated unchanged, to
//! any [`Store`].

use std::future::Future;
use std::sync::Arc;

use turnstile::store::ExpiredLease;
use turnstile::store::{
    Admission, ApprovalDecision, ApprovalRecord, ClaimMemory, ClaimOutcome, Conversation, Fence,
    JournalEntry, LoggedEvent, NewRequest, PendingApproval, RecoveryClaim, RequestRecord,
    RunRecord, StoredOutcome, StoredSummary, SummaryCommit, SummaryPass, ToolResult,
    TranscriptEntry,
};
use turnstile::{
    ConversationId, Error, LoopCheckpoint, Message, Namespace, RequestId, Revision, RunId, Store,
    Usage,
};

use super::Tracer;

/// One store call, as a [`Hook`] sees it.
#[derive(Clone, Debug)]
pub struct Call {
    pub op: &'static str,
    pub write: bool,
    /// What the torture traces: the request id of a write (the
    /// conversation id for `ensure_conversation`), nothing for a read.
    pub detail: String,
    pub request: Option<RequestId>,
    pub run: Option<RunId>,
    pub turn: Option<u32>,
    pub call_id: Option<String>,
}

impl Call {
    fn read(op: &'static str) -> Self {
        Self {
            op,
            write: false,
            detail: String::new(),
            request: None,
            run: None,
            turn: None,
            call_id: None,
        }
    }

    fn write(op: &'static str, request: RequestId) -> Self {
        Self {
            op,
            write: true,
            detail: request.to_string(),
            request: Some(request),
            run: None,
            turn: None,
            call_id: None,
        }
    }

    fn fenced(op: &'static str, fence: &Fence) -> Self {
        Self {
            run: Some(fence.run_id),
            ..Self::write(op, fence.request_id)
        }
    }

    fn at_turn(self, turn: u32) -> Self {
        Self {
            turn: Some(turn),
            ..self
        }
    }
}

/// Sees every call of a [`Hooked`] store: `enter` before it starts (and may
/// hold it there), `leave` once it returned, with the token `enter` gave.
#[turnstile::async_trait]
pub trait Hook: Send + Sync + 'static {
    async fn enter(&self, call: &Call) -> u64;
    fn leave(&self, call: &Call, token: u64, ok: bool);
}

/// Delegates every call, unchanged, to `inner`, between the hook's `enter`
/// and `leave`.
pub struct Hooked {
    pub inner: Arc<dyn Store>,
    pub hook: Arc<dyn Hook>,
}

impl Hooked {
    /// `inner`, every call of conversation `conversation` traced by
    /// `tracer` (a [`TraceHook`]).
    pub fn traced(inner: Arc<dyn Store>, conversation: usize, tracer: Tracer) -> Self {
        Self {
            inner,
            hook: Arc::new(TraceHook {
                conversation,
                tracer,
            }),
        }
    }

    async fn wrap<T>(
        &self,
        call: Call,
        f: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let token = self.hook.enter(&call).await;
        let result = f.await;
        self.hook.leave(&call, token, result.is_ok());
        result
    }
}

#[turnstile::async_trait]
impl Store for Hooked {
    async fn ensure_conversation(
        &self,
        namespace: &Namespace,
        id: ConversationId,
    ) -> Result<Conversation, Error> {
        let call = Call {
            op: "ensure_conversation",
            write: true,
            detail: id.to_string(),
            ..Call::read("ensure_conversation")
        };
        self.wrap(call, self.inner.ensure_conversation(namespace, id))
            .await
    }

    async fn conversation(
        &self,
        namespace: &Namespace,
        id: ConversationId,
    ) -> Result<Conversation, Error> {
        self.wrap(
            Call::read("conversation"),
            self.inner.conversation(namespace, id),
        )
        .await
    }

    async fn admission(&self, conversation_id: ConversationId) -> Result<Admission, Error> {
        self.wrap(
            Call::read("admission"),
            self.inner.admission(conversation_id),
        )
        .await
    }

    fn claim_memory(&self) -> Option<&ClaimMemory> {
        self.inner.claim_memory()
    }

    async fn claim(&self, claim: &NewRequest) -> Result<ClaimOutcome, Error> {
        let call = Call {
            run: Some(claim.run_id),
            ..Call::write("claim", claim.request_id)
        };
        self.wrap(call, self.inner.claim(claim)).await
    }

    async fn claim_recovery(&self, claim: &RecoveryClaim) -> Result<Fence, Error> {
        let call = Call {
            run: Some(claim.new_run),
            ..Call::write("claim_recovery", claim.request_id)
        };
        self.wrap(call, self.inner.claim_recovery(claim)).await
    }

    async fn request(&self, request_id: RequestId) -> Result<Option<RequestRecord>, Error> {
        self.wrap(Call::read("request"), self.inner.request(request_id))
            .await
    }

    async fn run(&self, run_id: RunId) -> Result<Option<RunRecord>, Error> {
        self.wrap(Call::read("run"), self.inner.run(run_id)).await
    }

    async fn begin_turn(&self, fence: &Fence, checkpoint: &LoopCheckpoint) -> Result<(), Error> {
        let call = Call::fenced("begin_turn", fence).at_turn(checkpoint.turn);
        self.wrap(call, self.inner.begin_turn(fence, checkpoint))
            .await
    }

    async fn record_model_response(
        &self,
        fence: &Fence,
        checkpoint: &LoopCheckpoint,
        assistant: &Message,
    ) -> Result<(), Error> {
        let call = Call::fenced("record_model_response", fence).at_turn(checkpoint.turn);
        self.wrap(
            call,
            self.inner
                .record_model_response(fence, checkpoint, assistant),
        )
        .await
    }

    async fn record_tool_result(
        &self,
        fence: &Fence,
        turn: u32,
        call_id: &str,
        result: &ToolResult,
    ) -> Result<(), Error> {
        let call = Call {
            call_id: Some(call_id.to_owned()),
            ..Call::fenced("record_tool_result", fence).at_turn(turn)
        };
        self.wrap(
            call,
            self.inner.record_tool_result(fence, turn, call_id, result),
        )
        .await
    }

    async fn finish_turn(
        &self,
        fence: &Fence,
        checkpoint: &LoopCheckpoint,
        messages: &[Message],
        next: Option<&LoopCheckpoint>,
    ) -> Result<(), Error> {
        let call = Call::fenced("finish_turn", fence).at_turn(checkpoint.turn);
        self.wrap(
            call,
            self.inner.finish_turn(fence, checkpoint, messages, next),
        )
        .await
    }

    async fn commit(
        &self,
        fence: &Fence,
        checkpoint: &LoopCheckpoint,
        final_message: &Message,
    ) -> Result<StoredOutcome, Error> {
        let call = Call::fenced("commit", fence).at_turn(checkpoint.turn);
        self.wrap(call, self.inner.commit(fence, checkpoint, final_message))
            .await
    }

    async fn fail_run(
        &self,
        fence: &Fence,
        error: &str,
        settled: Option<&LoopCheckpoint>,
    ) -> Result<(), Error> {
        self.wrap(
            Call::fenced("fail_run", fence),
            self.inner.fail_run(fence, error, settled),
        )
        .await
    }

    async fn abandon(
        &self,
        conversation_id: ConversationId,
        request_id: RequestId,
        expected_revision: Revision,
    ) -> Result<Revision, Error> {
        self.wrap(
            Call::write("abandon", request_id),
            self.inner
                .abandon(conversation_id, request_id, expected_revision),
        )
        .await
    }

    async fn transcript_window(
        &self,
        conversation_id: ConversationId,
        limit: u32,
    ) -> Result<Vec<TranscriptEntry>, Error> {
        self.wrap(
            Call::read("transcript_window"),
            self.inner.transcript_window(conversation_id, limit),
        )
        .await
    }

    async fn events_after(
        &self,
        conversation_id: ConversationId,
        after: u64,
        limit: u32,
    ) -> Result<Vec<LoggedEvent>, Error> {
        self.wrap(
            Call::read("events_after"),
            self.inner.events_after(conversation_id, after, limit),
        )
        .await
    }

    async fn transcript_range(
        &self,
        conversation_id: ConversationId,
        from: u64,
        to: u64,
    ) -> Result<Vec<TranscriptEntry>, Error> {
        self.wrap(
            Call::read("transcript_range"),
            self.inner.transcript_range(conversation_id, from, to),
        )
        .await
    }

    async fn latest_checkpoint(&self, run_id: RunId) -> Result<Option<LoopCheckpoint>, Error> {
        self.wrap(
            Call::read("latest_checkpoint"),
            self.inner.latest_checkpoint(run_id),
        )
        .await
    }

    async fn checkpoints(&self, run_id: RunId) -> Result<Vec<LoopCheckpoint>, Error> {
        self.wrap(Call::read("checkpoints"), self.inner.checkpoints(run_id))
            .await
    }

    async fn blob(
        &self,
        sha256: turnstile::BlobHash,
    ) -> Result<Option<std::sync::Arc<[u8]>>, Error> {
        self.wrap(Call::read("blob"), self.inner.blob(sha256)).await
    }

    async fn request_messages(
        &self,
        request_id: RequestId,
        count: u64,
    ) -> Result<Vec<Message>, Error> {
        self.wrap(
            Call::read("request_messages"),
            self.inner.request_messages(request_id, count),
        )
        .await
    }

    async fn journal(&self, request_id: RequestId, turn: u32) -> Result<Vec<JournalEntry>, Error> {
        self.wrap(Call::read("journal"), self.inner.journal(request_id, turn))
            .await
    }

    async fn recovery_usage(&self, request_id: RequestId) -> Result<Usage, Error> {
        self.wrap(
            Call::read("recovery_usage"),
            self.inner.recovery_usage(request_id),
        )
        .await
    }

    async fn latest_summary(
        &self,
        conversation_id: ConversationId,
    ) -> Result<Option<StoredSummary>, Error> {
        self.wrap(
            Call::read("latest_summary"),
            self.inner.latest_summary(conversation_id),
        )
        .await
    }

    async fn record_summary_pass(&self, fence: &Fence, pass: &SummaryPass) -> Result<(), Error> {
        self.wrap(
            Call::fenced("record_summary_pass", fence),
            self.inner.record_summary_pass(fence, pass),
        )
        .await
    }

    async fn commit_summary(
        &self,
        fence: &Fence,
        summary: &SummaryCommit,
    ) -> Result<StoredSummary, Error> {
        self.wrap(
            Call::fenced("commit_summary", fence),
            self.inner.commit_summary(fence, summary),
        )
        .await
    }

    async fn await_approval(
        &self,
        fence: &Fence,
        settled: &LoopCheckpoint,
        call_ids: &[String],
        reason: &str,
    ) -> Result<Vec<PendingApproval>, Error> {
        let call = Call::fenced("await_approval", fence).at_turn(settled.turn);
        self.wrap(
            call,
            self.inner.await_approval(fence, settled, call_ids, reason),
        )
        .await
    }

    async fn approvals(
        &self,
        request_id: RequestId,
        turn: u32,
    ) -> Result<Vec<ApprovalRecord>, Error> {
        self.wrap(
            Call::read("approvals"),
            self.inner.approvals(request_id, turn),
        )
        .await
    }

    async fn pending_approvals(
        &self,
        conversation_id: Option<ConversationId>,
    ) -> Result<Vec<PendingApproval>, Error> {
        self.wrap(
            Call::read("pending_approvals"),
            self.inner.pending_approvals(conversation_id),
        )
        .await
    }

    async fn decide_approval(&self, decision: &ApprovalDecision) -> Result<Revision, Error> {
        let call = Call::write("decide_approval", decision.request_id);
        self.wrap(call, self.inner.decide_approval(decision)).await
    }

    async fn delete_conversation(
        &self,
        namespace: &Namespace,
        id: ConversationId,
        expected_version: u64,
        active_revision: Option<Revision>,
    ) -> Result<turnstile::store::DeleteReport, Error> {
        let call = Call {
            op: "delete_conversation",
            write: true,
            detail: id.to_string(),
            ..Call::read("delete_conversation")
        };
        let deleted =
            self.inner
                .delete_conversation(namespace, id, expected_version, active_revision);
        self.wrap(call, deleted).await
    }

    async fn fork_conversation(
        &self,
        namespace: &Namespace,
        from: ConversationId,
        through_seq: u64,
        new_id: ConversationId,
    ) -> Result<turnstile::store::ForkOutcome, Error> {
        let call = Call {
            op: "fork_conversation",
            write: true,
            detail: new_id.to_string(),
            ..Call::read("fork_conversation")
        };
        let forked = self
            .inner
            .fork_conversation(namespace, from, through_seq, new_id);
        self.wrap(call, forked).await
    }

    async fn renew_lease(&self, fence: &Fence, expires_at: i64) -> Result<(), Error> {
        let call = Call::write("renew_lease", fence.request_id);
        self.wrap(call, self.inner.renew_lease(fence, expires_at))
            .await
    }

    async fn expired_leases(&self, limit: u32) -> Result<Vec<ExpiredLease>, Error> {
        self.wrap(
            Call::read("expired_leases"),
            self.inner.expired_leases(limit),
        )
        .await
    }

    async fn conversation_meta(
        &self,
        namespace: &Namespace,
        id: ConversationId,
    ) -> Result<turnstile::store::ConversationMeta, Error> {
        self.wrap(
            Call::read("conversation_meta"),
            self.inner.conversation_meta(namespace, id),
        )
        .await
    }

    async fn set_conversation_meta(
        &self,
        namespace: &Namespace,
        id: ConversationId,
        expected_meta_version: u64,
        update: &turnstile::store::MetaUpdate,
    ) -> Result<turnstile::store::ConversationMeta, Error> {
        let call = Call {
            op: "set_conversation_meta",
            write: true,
            detail: id.to_string(),
            ..Call::read("set_conversation_meta")
        };
        let set = self
            .inner
            .set_conversation_meta(namespace, id, expected_meta_version, update);
        self.wrap(call, set).await
    }
}

/// The crash tortures' trace of one conversation's store calls: `@C + KIND
/// DETAIL` on entering a store call and `@C - KIND` on leaving it, `KIND`
/// being `write:OP` or `read:OP`.
pub struct TraceHook {
    pub conversation: usize,
    pub tracer: Tracer,
}

#[turnstile::async_trait]
impl Hook for TraceHook {
    async fn enter(&self, call: &Call) -> u64 {
        let kind = if call.write { "write" } else { "read" };
        self.tracer.event(
            self.conversation,
            &format!("+ {kind}:{} {}", call.op, call.detail),
        );
        0
    }

    fn leave(&self, call: &Call, _token: u64, _ok: bool) {
        let kind = if call.write { "write" } else { "read" };
        self.tracer
            .event(self.conversation, &format!("- {kind}:{}", call.op));
    }
}
