//! A run that stopped with a turn in flight: `RejectAmbiguous` refuses to
//! continue it, `RetryInterruptedTurn` re-runs the turn without executing
//! journaled tool calls again.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use turnstile::store::JournalStatus;
use turnstile::{
    CheckpointPhase, ConversationId, Error, Message, RequestId, ResumePolicy, RunContext,
};
use turnstile_testkit::session::*;
use turnstile_testkit::tools::*;

#[tokio::test]
async fn interrupted_tool_round_is_ambiguous_and_retry_skips_journaled_calls() {
    let store = memory_store().await;
    let count = CountingTool::new("count");
    let cancel = StallingTool::new("cancel");
    let model = scripted(vec![
        tools_reply(
            vec![call("c1", "count"), call("c2", "cancel")],
            usage(10, 1),
        ),
        text_reply("done", usage(5, 5)),
    ]);
    let conversation_id = ConversationId::new();
    let session = session(
        agent(model.clone(), vec![count.clone(), cancel.clone()]),
        &store,
        conversation_id,
    );
    let request_id = RequestId::new();

    // The deadline passes while the second tool runs: it is interrupted.
    let deadline = tokio::time::Instant::now() + Duration::from_millis(1_000);
    let err = expect_err(
        session
            .run(
                request_id,
                "go",
                RunContext::default().with_deadline(deadline),
            )
            .await,
    );
    assert!(matches!(err, Error::DeadlineExceeded { .. }), "{err:?}");
    let (run1, rev1) = err.stopped_run().unwrap();
    let checkpoint = store.latest_checkpoint(run1).await.unwrap().unwrap();
    assert_eq!(
        (checkpoint.turn, checkpoint.phase),
        (1, CheckpointPhase::ToolsInFlight)
    );
    let journal = store.journal(request_id, 1).await.unwrap();
    let status = |id: &str| journal.iter().find(|e| e.call_id == id).unwrap().status;
    assert_eq!(status("c1"), JournalStatus::Completed);
    assert_eq!(status("c2"), JournalStatus::Requested);
    assert_eq!((model.calls(), count.calls(), cancel.calls()), (1, 1, 1));

    // RejectAmbiguous: refused before any write or work.
    let before = state(&store, conversation_id, request_id).await;
    let err = expect_err(
        session
            .resume_run(
                run1,
                RunContext::default(),
                rev1,
                ResumePolicy::RejectAmbiguous,
            )
            .await,
    );
    assert!(
        matches!(err, Error::AmbiguousCheckpoint { run_id, turn: 1 } if run_id == run1),
        "{err:?}"
    );
    let err = expect_err(
        session
            .recover_after_owner_exit(
                request_id,
                "go",
                RunContext::default(),
                rev1,
                ResumePolicy::RejectAmbiguous,
            )
            .await,
    );
    assert!(
        matches!(err, Error::AmbiguousCheckpoint { turn: 1, .. }),
        "{err:?}"
    );
    assert_eq!(state(&store, conversation_id, request_id).await, before);
    assert_eq!((model.calls(), count.calls(), cancel.calls()), (1, 1, 1));

    // RetryInterruptedTurn: the recorded answer and c1's result are reused;
    // only c2 runs again, under the same idempotency key.
    let outcome = session
        .resume_run(
            run1,
            RunContext::default(),
            rev1,
            ResumePolicy::RetryInterruptedTurn,
        )
        .await
        .expect("retried turn");
    assert_eq!(outcome.final_text, "done");
    assert_eq!(model.calls(), 2, "turn 1's recorded answer is reused");
    assert_eq!(count.calls(), 1, "journaled call c1 ran again");
    assert_eq!(cancel.calls(), 2);
    let keys = cancel.keys();
    assert_eq!(keys[0], keys[1], "idempotency key changed across resume");
    assert_eq!(outcome.usage, usage(15, 6));
    assert_eq!((outcome.turns, outcome.tool_calls), (2, 2));

    assert_eq!(
        tool_results(&outcome.messages),
        vec![
            ("c1".into(), "count call 1".into(), false),
            ("c2".into(), "cancel call 2".into(), false),
        ]
    );
    assert_one_result_per_call(&outcome.messages);
    assert_eq!(outcome.messages.len(), 5);
    assert_eq!(outcome.messages[0], Message::user("go"));
    let transcript: Vec<Message> = store
        .transcript_window(conversation_id, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.message)
        .collect();
    assert_eq!(transcript, outcome.messages);
}

/// A stop the loop chose during a model call leaves nothing ambiguous: the
/// checkpoint is settled to `ModelPending` and the default policy resumes it.
#[tokio::test]
async fn model_call_past_the_deadline_settles_and_resumes_with_the_default_policy() {
    let store = memory_store().await;
    let model = ProbeModel::new(vec![text_reply("late answer", usage(3, 4))], 1);
    let conversation_id = ConversationId::new();
    let session = session(agent(model.clone(), vec![]), &store, conversation_id);
    let request_id = RequestId::new();

    let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
    let err = expect_err(
        session
            .run(
                request_id,
                "hurry",
                RunContext::default().with_deadline(deadline),
            )
            .await,
    );
    assert!(matches!(err, Error::DeadlineExceeded { .. }), "{err:?}");
    let (run, revision) = err.stopped_run().unwrap();
    let checkpoint = store.latest_checkpoint(run).await.unwrap().unwrap();
    assert_eq!(
        (checkpoint.turn, checkpoint.phase),
        (1, CheckpointPhase::ModelPending)
    );
    assert_eq!(model.calls(), 1);

    let outcome = session
        .resume_run(
            run,
            RunContext::default(),
            revision,
            ResumePolicy::default(),
        )
        .await
        .expect("resumed");
    assert_eq!(outcome.final_text, "late answer");
    assert_eq!(model.calls(), 2);
    assert_eq!(outcome.turns, 1);
    assert_eq!(outcome.usage, usage(3, 4));
}

#[tokio::test]
async fn cancelled_model_call_settles_and_recovery_retries_it_with_the_default_policy() {
    let store = memory_store().await;
    let model = ProbeModel::new(vec![text_reply("answer", usage(1, 2))], 1);
    let conversation_id = ConversationId::new();
    let session = session(agent(model.clone(), vec![]), &store, conversation_id);
    let request_id = RequestId::new();
    let token = CancellationToken::new();

    let (result, ()) = tokio::join!(
        session.run(
            request_id,
            "question",
            RunContext::default().with_cancel(token.clone())
        ),
        async {
            model.entered().await;
            token.cancel();
        }
    );
    let err = expect_err(result);
    assert!(matches!(err, Error::Cancelled { .. }), "{err:?}");
    let (_, revision) = err.stopped_run().unwrap();

    let outcome = session
        .recover_after_owner_exit(
            request_id,
            "question",
            RunContext::default(),
            revision,
            ResumePolicy::default(),
        )
        .await
        .expect("recovered");
    assert_eq!(outcome.final_text, "answer");
    assert_eq!(model.calls(), 2);
    // The retried model call saw the same context as the interrupted one.
    let seen = model.seen();
    assert_eq!(seen[0], seen[1]);
}

#[tokio::test]
async fn failed_model_call_keeps_the_admission_and_resuming_retries_the_model_call() {
    let store = memory_store().await;
    let model = scripted(vec![
        tools_reply(vec![call("c1", "count")], usage(2, 2)),
        text_reply("second try", usage(3, 3)).failing_first(1, "rate limited"),
    ]);
    let count = CountingTool::new("count");
    let conversation_id = ConversationId::new();
    let session = session(
        agent(model.clone(), vec![count.clone()]),
        &store,
        conversation_id,
    );
    let request_id = RequestId::new();

    let err = expect_err(session.run(request_id, "try", RunContext::default()).await);
    match &err {
        Error::Model { source, .. } => {
            assert!(source.retryable);
            assert_eq!(source.message, "rate limited");
        }
        other => panic!("expected a model error, got {other:?}"),
    }
    let (run, revision) = err.stopped_run().unwrap();
    let admission = store.admission(conversation_id).await.unwrap();
    assert_eq!(admission.revision, revision);
    assert_eq!(admission.active.unwrap().usage, usage(2, 2));
    let checkpoint = store.latest_checkpoint(run).await.unwrap().unwrap();
    assert_eq!(
        (checkpoint.turn, checkpoint.phase),
        (2, CheckpointPhase::ModelPending)
    );

    let outcome = session
        .resume_run(
            run,
            RunContext::default(),
            revision,
            ResumePolicy::default(),
        )
        .await
        .expect("retried");
    assert_eq!(outcome.final_text, "second try");
    assert_eq!((model.calls(), count.calls()), (3, 1));
    assert_eq!(outcome.usage, usage(5, 5));
    assert_eq!(outcome.turns, 2);
}

/// A model whose first answer is discarded (cut off at the output limit),
/// spending `discarded` tokens, and that then answers as `then` does.
struct CutOnce {
    discarded: turnstile::Usage,
    cut: AtomicUsize,
    then: Arc<dyn turnstile::Model>,
}

#[turnstile::async_trait]
impl turnstile::Model for CutOnce {
    fn name(&self) -> &str {
        self.then.name()
    }

    async fn respond(
        &self,
        request: turnstile::agent::ModelRequest<'_>,
    ) -> Result<turnstile::agent::ModelResponse, turnstile::ModelError> {
        if self.cut.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(turnstile::ModelError::fatal("cut off at the output limit")
                .with_usage(self.discarded));
        }
        self.then.respond(request).await
    }
}

#[tokio::test]
async fn a_discarded_answers_tokens_count_in_the_runs_usage() {
    let store = memory_store().await;
    let model = Arc::new(CutOnce {
        discarded: usage(40, 8),
        cut: AtomicUsize::new(0),
        then: scripted(vec![text_reply("the whole answer", usage(3, 3))]),
    });
    let conversation_id = ConversationId::new();
    let session = session(agent(model, vec![]), &store, conversation_id);
    let request_id = RequestId::new();

    let err = expect_err(
        session
            .run(request_id, "write", RunContext::default())
            .await,
    );
    let (run, revision) = err.stopped_run().unwrap();
    let checkpoint = store.latest_checkpoint(run).await.unwrap().unwrap();
    assert_eq!(
        (checkpoint.phase, checkpoint.usage),
        (CheckpointPhase::ModelPending, usage(40, 8)),
        "the settled checkpoint counts the discarded answer"
    );
    let admission = store.admission(conversation_id).await.unwrap();
    assert_eq!(admission.active.unwrap().usage, usage(40, 8));

    let outcome = session
        .resume_run(
            run,
            RunContext::default(),
            revision,
            ResumePolicy::default(),
        )
        .await
        .expect("answered");
    assert_eq!(outcome.final_text, "the whole answer");
    assert_eq!(outcome.usage, usage(43, 11));
}

/// Cancellation is a request to stop at the next clean point: a tool call in
/// flight finishes and is journaled, no new call starts, and the default
/// policy resumes the run without running anything twice.
#[tokio::test]
async fn cancel_inside_a_tool_lets_it_finish_and_the_default_policy_resumes() {
    let store = memory_store().await;
    let token = CancellationToken::new();
    let cancel = CancellingTool::new("cancel", token.clone());
    let count = CountingTool::new("count");
    let model = scripted(vec![
        tools_reply(
            vec![call("c1", "cancel"), call("c2", "count")],
            usage(10, 1),
        ),
        text_reply("done", usage(5, 5)),
    ]);
    let conversation_id = ConversationId::new();
    let session = session(
        agent(model.clone(), vec![cancel.clone(), count.clone()]),
        &store,
        conversation_id,
    );
    let request_id = RequestId::new();
    let err = expect_err(
        session
            .run(request_id, "go", RunContext::default().with_cancel(token))
            .await,
    );
    assert!(matches!(err, Error::Cancelled { .. }), "{err:?}");
    let (run, revision) = err.stopped_run().unwrap();
    let checkpoint = store.latest_checkpoint(run).await.unwrap().unwrap();
    assert_eq!(
        (checkpoint.turn, checkpoint.phase),
        (1, CheckpointPhase::ToolsPending)
    );
    let journal = store.journal(request_id, 1).await.unwrap();
    let status = |id: &str| journal.iter().find(|e| e.call_id == id).unwrap().status;
    assert_eq!(
        status("c1"),
        JournalStatus::Completed,
        "the started tool finished"
    );
    assert_eq!(
        status("c2"),
        JournalStatus::Requested,
        "no new tool started"
    );

    let outcome = session
        .resume_run(
            run,
            RunContext::default(),
            revision,
            ResumePolicy::default(),
        )
        .await
        .expect("resumed with the default policy");
    assert_eq!(outcome.final_text, "done");
    assert_eq!((cancel.calls(), count.calls(), model.calls()), (1, 1, 2));
    assert_one_result_per_call(&outcome.messages);
}

/// A run that takes over an ambiguous tool round (`RetryInterruptedTurn`)
/// and stops before it re-runs the call that was in flight keeps the turn
/// ambiguous: the default policy must not then run that call's effect again.
#[tokio::test]
async fn a_takeover_that_stops_before_the_interrupted_call_keeps_the_turn_ambiguous() {
    let store = memory_store().await;
    let count = CountingTool::new("count");
    let stall = StallingTool::new("stall");
    let model = scripted(vec![
        tools_reply(vec![call("c1", "count"), call("c2", "stall")], usage(10, 1)),
        text_reply("done", usage(5, 5)),
    ]);
    let conversation_id = ConversationId::new();
    let session = session(
        agent(model.clone(), vec![count.clone(), stall.clone()]),
        &store,
        conversation_id,
    );
    let request_id = RequestId::new();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(1_000);
    let err = expect_err(
        session
            .run(
                request_id,
                "go",
                RunContext::default().with_deadline(deadline),
            )
            .await,
    );
    let (run1, rev1) = err.stopped_run().unwrap();

    // The takeover stops at once: its tool-call budget is spent.
    let spent = RunContext::default().with_budget(turnstile::Budget {
        max_tool_calls: Some(0),
        ..Default::default()
    });
    let err = expect_err(
        session
            .resume_run(run1, spent, rev1, ResumePolicy::RetryInterruptedTurn)
            .await,
    );
    assert!(matches!(err, Error::BudgetExceeded { .. }), "{err:?}");
    let (run2, rev2) = err.stopped_run().unwrap();
    let checkpoint = store.latest_checkpoint(run2).await.unwrap().unwrap();
    assert_eq!(
        checkpoint.phase,
        CheckpointPhase::ToolsInFlight,
        "not settled"
    );
    let err = expect_err(
        session
            .resume_run(
                run2,
                RunContext::default(),
                rev2,
                ResumePolicy::RejectAmbiguous,
            )
            .await,
    );
    assert!(matches!(err, Error::AmbiguousCheckpoint { .. }), "{err:?}");
    assert_eq!(stall.calls(), 1, "the interrupted call did not run again");
}

/// Its first call cannot tell whether it took effect; later calls answer.
/// Asked afterwards, it knows the first took effect if it `reconciles`.
struct Remote {
    calls: AtomicUsize,
    reconciles: bool,
}

impl Remote {
    fn new(reconciles: bool) -> Arc<Self> {
        Arc::new(Self {
            calls: AtomicUsize::new(0),
            reconciles,
        })
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

#[turnstile::async_trait]
impl turnstile::Tool for Remote {
    fn spec(&self) -> turnstile::ToolSpec {
        turnstile::ToolSpec {
            name: "remote".into(),
            description: "calls a remote service".into(),
            parameters: serde_json::json!({"type": "object"}),
        }
    }

    async fn call(
        &self,
        _: serde_json::Value,
        _: turnstile::ToolContext,
    ) -> Result<turnstile::Content, turnstile::ToolError> {
        match self.calls.fetch_add(1, Ordering::SeqCst) {
            0 => Err(turnstile::ToolError::in_doubt("the connection dropped")),
            _ => Ok("remote done".into()),
        }
    }

    async fn reconcile(
        &self,
        _: serde_json::Value,
        _: turnstile::ToolContext,
    ) -> turnstile::Reconciliation {
        match self.reconciles {
            true => turnstile::Reconciliation::Done(Ok("remote done".into())),
            false => turnstile::Reconciliation::Unknown,
        }
    }
}

#[tokio::test]
async fn a_call_in_doubt_stops_the_run_with_its_turn_in_flight_and_nothing_for_the_model() {
    let store = memory_store().await;
    let remote = Remote::new(false);
    let model = scripted(vec![
        tools_reply(vec![call("r1", "remote")], usage(10, 1)),
        text_reply("done", usage(5, 5)),
    ]);
    let conversation_id = ConversationId::new();
    let session = session(
        agent(model.clone(), vec![remote.clone()]),
        &store,
        conversation_id,
    );
    let request_id = RequestId::new();
    let err = expect_err(session.run(request_id, "go", RunContext::default()).await);
    match &err {
        Error::ToolInDoubt { call, .. } => assert_eq!(
            (call.call_id.as_str(), call.message.as_str()),
            ("r1", "the connection dropped")
        ),
        other => panic!("expected ToolInDoubt, got {other:?}"),
    }
    let (run1, rev1) = err.stopped_run().unwrap();
    let checkpoint = store.latest_checkpoint(run1).await.unwrap().unwrap();
    assert_eq!(
        (checkpoint.turn, checkpoint.phase),
        (1, CheckpointPhase::ToolsInFlight)
    );
    let journal = store.journal(request_id, 1).await.unwrap();
    assert_eq!(journal[0].status, JournalStatus::Requested);
    assert_eq!(model.calls(), 1, "the model never heard of it");

    // As after a crash inside the tool.
    let err = expect_err(
        session
            .resume_run(
                run1,
                RunContext::default(),
                rev1,
                ResumePolicy::RejectAmbiguous,
            )
            .await,
    );
    assert!(
        matches!(err, Error::AmbiguousCheckpoint { turn: 1, .. }),
        "{err:?}"
    );
    let outcome = session
        .resume_run(
            run1,
            RunContext::default(),
            rev1,
            ResumePolicy::RetryInterruptedTurn,
        )
        .await
        .unwrap();
    assert_eq!(outcome.final_text, "done");
    let results = tool_results(&outcome.messages);
    assert_eq!(results[0].1, "remote done");
    assert_eq!(remote.calls(), 2);
}

#[tokio::test]
async fn a_reconciled_call_between_a_journaled_one_a_waiting_one_and_one_not_started() {
    let store = memory_store().await;
    let count = CountingTool::new("count");
    let gated = CountingTool::new("gated");
    let remote = Remote::new(true);
    let model = scripted(vec![
        tools_reply(
            vec![
                call("g1", "gated"),
                call("c1", "count"),
                call("r1", "remote"),
                call("c2", "count"),
            ],
            usage(10, 1),
        ),
        text_reply("done", usage(5, 5)),
    ]);
    let conversation_id = ConversationId::new();
    let agent = agent(model.clone(), vec![count.clone(), remote.clone()])
        .with_tool_requiring_approval(gated.clone());
    let session = session(agent, &store, conversation_id);
    let request_id = RequestId::new();
    // g1 waits for approval, c1 runs, r1 is in doubt: the run stops there.
    let err = expect_err(session.run(request_id, "go", RunContext::default()).await);
    assert!(matches!(err, Error::ToolInDoubt { .. }), "{err:?}");
    assert_eq!((count.calls(), remote.calls()), (1, 1));

    // The default policy asks r1's tool (not g1's: it never ran): done.
    // r1 is journaled as its tool says, c2 runs, and g1 still waits.
    let revision = session.admission().await.unwrap().revision;
    let err = expect_err(
        session
            .recover_after_owner_exit(
                request_id,
                "go",
                RunContext::default(),
                revision,
                ResumePolicy::RejectAmbiguous,
            )
            .await,
    );
    let Error::AwaitingApproval {
        revision, pending, ..
    } = err
    else {
        panic!("expected a stop for approval, got {err:?}");
    };
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].call_id, "g1");
    assert_eq!((count.calls(), remote.calls()), (2, 1));
    let journal = store.journal(request_id, 1).await.unwrap();
    let status = |id: &str| journal.iter().find(|e| e.call_id == id).unwrap().status;
    assert_eq!(status("r1"), JournalStatus::Completed);
    assert_eq!(status("c2"), JournalStatus::Completed);

    let revision = session.approve(request_id, "g1", revision).await.unwrap();
    let outcome = session
        .continue_after_approval(request_id, RunContext::default(), revision)
        .await
        .unwrap();
    assert_eq!(outcome.final_text, "done");
    let results = tool_results(&outcome.messages);
    let ids: Vec<&str> = results.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(ids, ["g1", "c1", "r1", "c2"]);
    assert_eq!(results[2].1, "remote done");
    assert_eq!((gated.calls(), count.calls()), (1, 2));
    assert_eq!(remote.calls(), 1);
}

#[tokio::test]
async fn after_an_agent_upgrade_a_call_in_doubt_is_not_reconciled_and_stays_ambiguous() {
    let store = memory_store().await;
    let remote = Remote::new(true);
    let script = || {
        scripted(vec![
            tools_reply(vec![call("r1", "remote")], usage(10, 1)),
            text_reply("done", usage(5, 5)),
        ])
    };
    let conversation_id = ConversationId::new();
    let before = session(
        agent(script(), vec![remote.clone()]),
        &store,
        conversation_id,
    );
    let request_id = RequestId::new();
    let err = expect_err(before.run(request_id, "go", RunContext::default()).await);
    assert!(matches!(err, Error::ToolInDoubt { .. }), "{err:?}");
    let revision = before.admission().await.unwrap().revision;

    // Another agent (its system prompt changed), accepted as an upgrade:
    // which call was in doubt is not its to say.
    let upgraded = session(
        agent(script(), vec![remote.clone()]).with_system_prompt("another plan"),
        &store,
        conversation_id,
    );
    let upgrade = RunContext::default().with_agent_upgrade(turnstile::AgentUpgrade::Accept);
    let err = expect_err(
        upgraded
            .recover_after_owner_exit(
                request_id,
                "go",
                upgrade,
                revision,
                ResumePolicy::RejectAmbiguous,
            )
            .await,
    );
    assert!(
        matches!(err, Error::AmbiguousCheckpoint { turn: 1, .. }),
        "{err:?}"
    );
    // The agent that ran it reconciles it.
    let outcome = before
        .recover_after_owner_exit(
            request_id,
            "go",
            RunContext::default(),
            revision,
            ResumePolicy::RejectAmbiguous,
        )
        .await
        .unwrap();
    assert_eq!(outcome.final_text, "done");
    assert_eq!(remote.calls(), 1);
}
