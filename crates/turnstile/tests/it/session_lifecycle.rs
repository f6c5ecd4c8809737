//! What a host does with a stopped request: `recovery_usage` to restore its
//! budget, `abandon` to give up on it.

use std::sync::Arc;

use turnstile::store::{RequestStatus, RunStatus, ToolResult};
use turnstile::{
    AgentSession, Budget, ConversationId, Error, RequestId, Revision, RunContext, RunId,
    ScriptedModel, Store, ToolCall, VerificationReport, Verifier,
};
use turnstile_testkit::session::*;
use turnstile_testkit::tools::*;

struct Stopped {
    store: Arc<dyn Store>,
    session: Arc<AgentSession>,
    model: Arc<ScriptedModel>,
    conversation_id: ConversationId,
    request_id: RequestId,
    run_id: RunId,
    revision: Revision,
}

/// A request stopped by its turn budget after two tool turns.
async fn stopped_after_two_turns() -> Stopped {
    let store = memory_store().await;
    let model = scripted(vec![
        tools_reply(vec![call("c1", "count")], usage(100, 10)),
        tools_reply(vec![call("c2", "count")], usage(7, 3)),
        text_reply("done", usage(1, 1)),
    ]);
    let conversation_id = ConversationId::new();
    let session = session(
        agent(model.clone(), vec![CountingTool::new("count")]),
        &store,
        conversation_id,
    );
    let request_id = RequestId::new();
    let ctx = RunContext::default().with_budget(Budget {
        max_turns: Some(2),
        ..Budget::default()
    });
    let err = expect_err(session.run(request_id, "work", ctx).await);
    let (run_id, revision) = err.stopped_run().expect("stopped run");
    Stopped {
        store,
        session,
        model,
        conversation_id,
        request_id,
        run_id,
        revision,
    }
}

#[tokio::test]
async fn recovery_usage_of_a_stopped_request_is_the_sum_of_its_model_calls() {
    let s = stopped_after_two_turns().await;
    assert_eq!(s.model.calls(), 2);
    let expected = s.model.replies()[..2]
        .iter()
        .fold(usage(0, 0), |sum, reply| sum.saturating_add(reply.usage));
    assert_eq!(expected, usage(107, 13));

    let persisted = s.session.recovery_usage(s.request_id).await.expect("usage");
    assert_eq!(persisted, expected);
    let admission = s.store.admission(s.conversation_id).await.unwrap();
    assert_eq!(admission.active.unwrap().usage, expected);
    assert_eq!(
        admission.revision, s.revision,
        "reading usage writes nothing"
    );
}

#[tokio::test]
async fn recovery_usage_of_a_completed_request_is_not_active() {
    let s = stopped_after_two_turns().await;
    let outcome = s
        .session
        .resume_run(s.run_id, more_turns(), s.revision, Default::default())
        .await
        .expect("finish");
    assert_eq!(outcome.usage, usage(108, 14));

    let err = expect_err(s.session.recovery_usage(s.request_id).await);
    assert!(
        matches!(err, Error::NotActive { request_id } if request_id == s.request_id),
        "{err:?}"
    );
}

#[tokio::test]
async fn recovery_usage_of_another_conversations_or_an_unknown_request_is_refused() {
    let s = stopped_after_two_turns().await;
    let other_id = ConversationId::new();
    s.store.ensure_conversation(&ns(), other_id).await.unwrap();
    let other = session(
        agent(s.model.clone(), vec![CountingTool::new("count")]),
        &s.store,
        other_id,
    );

    let err = expect_err(other.recovery_usage(s.request_id).await);
    assert!(
        matches!(err, Error::RequestMismatch { request_id, .. } if request_id == s.request_id),
        "{err:?}"
    );
    let err = expect_err(s.session.recovery_usage(RequestId::new()).await);
    assert!(matches!(err, Error::NotFound { .. }), "{err:?}");
}

#[tokio::test]
async fn abandon_releases_the_conversation_and_burns_the_request_id() {
    let s = stopped_after_two_turns().await;
    let released = s
        .session
        .abandon(s.request_id, s.revision)
        .await
        .expect("abandon");
    assert_eq!(released, Revision(s.revision.0 + 1));
    let admission = s.store.admission(s.conversation_id).await.unwrap();
    assert!(admission.active.is_none());
    assert_eq!(admission.revision, released);

    // The id is burned, whatever the caller tries.
    let err = expect_err(
        s.session
            .run(s.request_id, "work", RunContext::default())
            .await,
    );
    assert!(
        matches!(err, Error::RequestAbandoned { request_id } if request_id == s.request_id),
        "{err:?}"
    );
    let err = expect_err(
        s.session
            .recover_after_owner_exit(
                s.request_id,
                "work",
                RunContext::default(),
                released,
                Default::default(),
            )
            .await,
    );
    assert!(matches!(err, Error::RequestAbandoned { .. }), "{err:?}");
    assert_eq!(
        s.store.request(s.request_id).await.unwrap().unwrap().status,
        RequestStatus::Abandoned
    );

    // Its runs stay inspectable.
    let run = s.store.run(s.run_id).await.unwrap().expect("run kept");
    assert_eq!(run.status, RunStatus::Abandoned);
    assert_eq!(s.store.checkpoints(s.run_id).await.unwrap().len(), 2);

    // A new request runs on the released conversation.
    let calls = s.model.calls();
    let outcome = s
        .session
        .run(RequestId::new(), "next", RunContext::default())
        .await
        .expect("new request");
    assert_eq!(outcome.final_text, "done");
    assert_eq!(s.model.calls(), calls + 3);
    assert_eq!(outcome.conversation_version, 1);
    assert!(
        outcome.messages.iter().all(|m| m.text() != "work"),
        "the abandoned input never reaches the transcript"
    );
}

#[tokio::test]
async fn abandon_with_a_stale_revision_is_a_conflict_and_writes_nothing() {
    let s = stopped_after_two_turns().await;
    let before = state(&s.store, s.conversation_id, s.request_id).await;

    for stale in [Revision(s.revision.0 - 1), Revision(s.revision.0 + 1)] {
        let err = expect_err(s.session.abandon(s.request_id, stale).await);
        match err {
            Error::Conflict {
                expected, actual, ..
            } => assert_eq!((expected, actual), (stale, s.revision)),
            other => panic!("expected Conflict, got {other:?}"),
        }
        assert_eq!(
            state(&s.store, s.conversation_id, s.request_id).await,
            before
        );
    }
    assert_eq!(
        s.store.request(s.request_id).await.unwrap().unwrap().status,
        RequestStatus::Active
    );
}

#[tokio::test]
async fn abandon_of_a_completed_request_is_refused() {
    let store = memory_store().await;
    let model = scripted(vec![text_reply("ok", usage(1, 1))]);
    let conversation_id = ConversationId::new();
    let session = session(agent(model, vec![]), &store, conversation_id);
    let request_id = RequestId::new();
    session
        .run(request_id, "hi", RunContext::default())
        .await
        .unwrap();
    let revision = store.admission(conversation_id).await.unwrap().revision;

    let err = expect_err(session.abandon(request_id, revision).await);
    assert!(matches!(err, Error::NotActive { .. }), "{err:?}");
    assert_eq!(
        store.request(request_id).await.unwrap().unwrap().status,
        RequestStatus::Completed
    );
    assert_eq!(
        store.admission(conversation_id).await.unwrap().revision,
        revision
    );
}

#[tokio::test]
async fn resume_or_recovery_with_another_agent_is_a_configuration_mismatch() {
    let s = stopped_after_two_turns().await;
    let before = state(&s.store, s.conversation_id, s.request_id).await;
    let changed = [
        // Another model name.
        agent(
            Arc::new(ScriptedModel::named(
                "other-model",
                s.model.replies().to_vec(),
            )),
            vec![CountingTool::new("count")],
        ),
        // Another system prompt.
        agent(s.model.clone(), vec![CountingTool::new("count")]).with_system_prompt("be terse"),
        // Another tool set.
        agent(s.model.clone(), vec![CountingTool::new("other_tool")]),
    ];
    for agent in changed {
        let other = session(agent, &s.store, s.conversation_id);
        let err = expect_err(
            other
                .resume_run(
                    s.run_id,
                    RunContext::default(),
                    s.revision,
                    Default::default(),
                )
                .await,
        );
        assert!(
            matches!(err, Error::ConfigurationMismatch { request_id } if request_id == s.request_id),
            "{err:?}"
        );
        let err = expect_err(
            other
                .recover_after_owner_exit(
                    s.request_id,
                    "work",
                    RunContext::default(),
                    s.revision,
                    Default::default(),
                )
                .await,
        );
        assert!(
            matches!(err, Error::ConfigurationMismatch { .. }),
            "{err:?}"
        );
    }
    assert_eq!(
        state(&s.store, s.conversation_id, s.request_id).await,
        before
    );
    assert_eq!(s.model.calls(), 2);
}

/// Reports one verification per tool round.
struct EveryTurn;

#[async_trait::async_trait]
impl Verifier for EveryTurn {
    async fn verify(
        &self,
        turn: u32,
        calls: &[(ToolCall, ToolResult)],
    ) -> Option<VerificationReport> {
        Some(VerificationReport {
            turn,
            passed: calls.iter().all(|(_, r)| !r.is_error),
            detail: format!("{} calls", calls.len()),
        })
    }
}

#[tokio::test]
async fn verification_reports_and_tool_call_count_survive_a_resume() {
    let store = memory_store().await;
    let model = scripted(vec![
        tools_reply(vec![call("c1", "count")], usage(1, 1)),
        tools_reply(vec![call("c2", "count"), call("c3", "nope")], usage(1, 1)),
        text_reply("verified", usage(1, 1)),
    ]);
    let verified =
        agent(model.clone(), vec![CountingTool::new("count")]).with_verifier(Arc::new(EveryTurn));
    let conversation_id = ConversationId::new();
    let session = session(verified, &store, conversation_id);
    let request_id = RequestId::new();
    let ctx = RunContext::default().with_budget(Budget {
        max_turns: Some(1),
        ..Budget::default()
    });
    let err = expect_err(session.run(request_id, "check", ctx).await);
    let (run, revision) = err.stopped_run().unwrap();
    let checkpoint = store.latest_checkpoint(run).await.unwrap().unwrap();
    assert_eq!(checkpoint.verification_reports.len(), 1);
    assert_eq!(checkpoint.tool_calls_count, 1);

    let outcome = session
        .resume_run(run, more_turns(), revision, Default::default())
        .await
        .expect("finish");
    assert_eq!(outcome.tool_calls, 3);
    assert_eq!(
        outcome.verification_reports,
        vec![
            VerificationReport {
                turn: 1,
                passed: true,
                detail: "1 calls".into(),
            },
            VerificationReport {
                turn: 2,
                passed: false,
                detail: "2 calls".into(),
            },
        ]
    );
    let replay = session
        .run(request_id, "check", RunContext::default())
        .await
        .unwrap();
    assert_eq!(replay.verification_reports, outcome.verification_reports);
}

#[tokio::test]
async fn recovery_with_another_input_is_a_mismatch_and_writes_nothing() {
    let s = stopped_after_two_turns().await;
    let before = state(&s.store, s.conversation_id, s.request_id).await;
    let err = expect_err(
        s.session
            .recover_after_owner_exit(
                s.request_id,
                "not the input",
                RunContext::default(),
                s.revision,
                Default::default(),
            )
            .await,
    );
    assert!(matches!(err, Error::RequestMismatch { .. }), "{err:?}");
    assert_eq!(
        state(&s.store, s.conversation_id, s.request_id).await,
        before
    );
}
