//! Human approval of tool calls through `AgentSession`: the stop, the
//! decisions, continuing, and what waiting costs; the opt-in agent upgrade;
//! the wall-clock deadline stored with the request.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use serde_json::json;
use turnstile::store::{AgentChange, ApprovalStatus, RequestStatus};
use turnstile::{
    Agent, AgentUpgrade, ApprovalPolicy, Budget, ConversationId, Error, Event, RequestId,
    ResumePolicy, Revision, RunContext, Store, ToolCall,
};
use turnstile_testkit::session::*;
use turnstile_testkit::tools::*;

/// `deploy` needs approval, `lookup` does not; the model asks for both in
/// turn 1, then answers.
struct Setup {
    store: Arc<dyn Store>,
    conversation: ConversationId,
    deploy: Arc<CountingTool>,
    lookup: Arc<CountingTool>,
}

impl Setup {
    async fn new() -> Self {
        Self {
            store: memory_store().await,
            conversation: ConversationId::new(),
            deploy: CountingTool::new("deploy"),
            lookup: CountingTool::new("lookup"),
        }
    }

    fn agent(&self) -> Agent {
        let script = vec![
            tools_reply(
                vec![
                    ToolCall::new("d1", "deploy", json!({"env": "prod"})),
                    call("l1", "lookup"),
                ],
                usage(10, 1),
            ),
            text_reply("deployed", usage(20, 2)),
        ];
        Agent::new(scripted(script))
            .with_tool_requiring_approval(self.deploy.clone())
            .with_tool(self.lookup.clone())
    }

    fn session(&self) -> Arc<turnstile::AgentSession> {
        session(self.agent(), &self.store, self.conversation)
    }
}

fn awaiting(error: Error) -> (RequestId, Revision, Vec<turnstile::store::PendingApproval>) {
    match error {
        Error::AwaitingApproval {
            request_id,
            revision,
            pending,
            ..
        } => (request_id, revision, pending),
        other => panic!("expected AwaitingApproval, got {other:?}"),
    }
}

#[tokio::test]
async fn a_call_that_needs_approval_stops_the_run_after_the_calls_that_need_none() {
    let setup = Setup::new().await;
    let session = setup.session();
    let request = RequestId::new();
    let error = expect_err(session.run(request, "ship it", RunContext::default()).await);
    let (request_id, revision, pending) = awaiting(error);
    assert_eq!(request_id, request);
    assert_eq!(pending.len(), 1);
    assert_eq!(
        (pending[0].call_id.as_str(), pending[0].tool.as_str()),
        ("d1", "deploy")
    );
    assert_eq!(pending[0].arguments, r#"{"env":"prod"}"#);
    assert_eq!(pending[0].revision, revision);
    assert_eq!(
        setup.lookup.calls(),
        1,
        "the call that needs no approval ran"
    );
    assert_eq!(setup.deploy.calls(), 0, "the gated call did not run");
    let admission = setup.store.admission(setup.conversation).await.unwrap();
    assert_eq!(admission.revision, revision);
    assert_eq!(
        admission.active.map(|a| a.request_id),
        Some(request),
        "the admission stays held"
    );
    assert_eq!(session.pending_approvals().await.unwrap(), pending);
    let latest = setup
        .store
        .latest_checkpoint(pending[0].run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(latest.phase, turnstile::CheckpointPhase::ToolsPending);

    // Nothing decided yet: continuing refuses and writes nothing.
    let still = expect_err(
        session
            .continue_after_approval(request, RunContext::default(), revision)
            .await,
    );
    assert_eq!(awaiting(still).2, pending);
    assert_eq!(
        setup
            .store
            .admission(setup.conversation)
            .await
            .unwrap()
            .revision,
        revision
    );

    let revision = session.approve(request, "d1", revision).await.unwrap();
    let outcome = session
        .continue_after_approval(request, RunContext::default(), revision)
        .await
        .unwrap();
    assert_eq!(outcome.final_text.as_str(), "deployed");
    assert_eq!(setup.deploy.calls(), 1, "approved: runs once");
    assert_eq!(
        setup.lookup.calls(),
        1,
        "the journaled call is not run again"
    );
    assert_eq!(outcome.turns, 2);
    assert_eq!(outcome.tool_calls, 2);
    assert_eq!(outcome.usage, usage(30, 3), "waiting cost no model call");
    assert_one_result_per_call(&outcome.messages);
    let approvals = setup.store.approvals(request, 1).await.unwrap();
    assert_eq!(approvals[0].status, ApprovalStatus::Approved);
    assert!(session.pending_approvals().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_rejected_call_never_runs_and_the_model_is_given_the_reason() {
    let setup = Setup::new().await;
    let model = scripted(vec![
        tools_reply(
            vec![ToolCall::new("d1", "deploy", json!({"env": "prod"}))],
            usage(10, 1),
        ),
        text_reply("not deployed", usage(20, 2)),
    ]);
    let agent = Agent::new(model.clone()).with_tool_requiring_approval(setup.deploy.clone());
    let session = session(agent, &setup.store, setup.conversation);
    let request = RequestId::new();
    let (_, revision, _) = awaiting(expect_err(
        session.run(request, "ship it", RunContext::default()).await,
    ));
    let revision = session
        .reject(request, "d1", revision, "freeze until Monday")
        .await
        .unwrap();
    let outcome = session
        .continue_after_approval(request, RunContext::default(), revision)
        .await
        .unwrap();
    assert_eq!(setup.deploy.calls(), 0, "a rejected call never runs");
    assert_eq!(
        tool_results(&outcome.messages),
        vec![(
            "d1".to_owned(),
            "not run: the tool call was rejected by the approver: freeze until Monday".to_owned(),
            true
        )]
    );
    assert_eq!(outcome.final_text.as_str(), "not deployed");
    let approvals = setup.store.approvals(request, 1).await.unwrap();
    assert_eq!(approvals[0].status, ApprovalStatus::Rejected);
    assert_eq!(approvals[0].reason.as_deref(), Some("freeze until Monday"));
}

#[tokio::test]
async fn decisions_are_compare_and_swaps_one_racing_approver_wins() {
    let setup = Setup::new().await;
    let session = setup.session();
    let request = RequestId::new();
    let (_, revision, _) = awaiting(expect_err(
        session.run(request, "ship it", RunContext::default()).await,
    ));
    let (a, b) = (setup.session(), setup.session());
    let (first, second) = tokio::join!(
        a.approve(request, "d1", revision),
        b.reject(request, "d1", revision, "no")
    );
    let wins = [first.is_ok(), second.is_ok()];
    assert_eq!(
        wins.iter().filter(|w| **w).count(),
        1,
        "{first:?} {second:?}"
    );
    for loser in [first, second].into_iter().filter_map(Result::err) {
        assert!(
            matches!(
                loser,
                Error::Conflict { .. } | Error::NoPendingApproval { .. }
            ),
            "{loser:?}"
        );
    }
    // Stale and repeated decisions are refused.
    assert!(matches!(
        session.approve(request, "d1", revision).await,
        Err(Error::Conflict { .. })
    ));
    let now = setup
        .store
        .admission(setup.conversation)
        .await
        .unwrap()
        .revision;
    assert!(matches!(
        session.approve(request, "d1", now).await,
        Err(Error::NoPendingApproval { .. })
    ));
    assert!(matches!(
        session.approve(request, "l1", now).await,
        Err(Error::NoPendingApproval { .. })
    ));
    assert!(matches!(
        session.reject(request, "d1", now, &"x".repeat(5000)).await,
        Err(Error::InvalidInput(_))
    ));
    assert_eq!(
        setup
            .store
            .admission(setup.conversation)
            .await
            .unwrap()
            .revision,
        now
    );
}

#[tokio::test]
async fn resume_and_recover_continue_after_approval_and_the_stream_announces_each_call() {
    let setup = Setup::new().await;
    let session = setup.session();
    let request = RequestId::new();
    let events: Vec<_> = session
        .stream(request, "ship it", RunContext::default())
        .collect()
        .await;
    let asked: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Ok(Event::ApprovalRequested {
                call_id,
                tool,
                arguments,
                revision,
                run_id,
                ..
            }) => Some((
                call_id.clone(),
                tool.clone(),
                arguments.clone(),
                *revision,
                *run_id,
            )),
            _ => None,
        })
        .collect();
    assert_eq!(asked.len(), 1);
    let (call_id, tool, arguments, revision, run_id) = asked[0].clone();
    assert_eq!((call_id.as_str(), tool.as_str()), ("d1", "deploy"));
    assert_eq!(arguments, r#"{"env":"prod"}"#);
    assert!(matches!(
        events.last(),
        Some(Err(Error::AwaitingApproval { .. }))
    ));

    // Resumed before any decision: the new run asks again, runs nothing.
    let error = expect_err(
        session
            .resume_run(
                run_id,
                RunContext::default(),
                revision,
                ResumePolicy::RejectAmbiguous,
            )
            .await,
    );
    let (_, revision, pending) = awaiting(error);
    assert_eq!(setup.deploy.calls(), 0);
    assert_eq!(setup.lookup.calls(), 1);
    let revision = session.approve(request, "d1", revision).await.unwrap();
    let outcome = session
        .recover_after_owner_exit(
            request,
            "ship it",
            RunContext::default(),
            revision,
            ResumePolicy::RejectAmbiguous,
        )
        .await
        .unwrap();
    assert_eq!(outcome.final_text.as_str(), "deployed");
    assert_eq!((setup.deploy.calls(), setup.lookup.calls()), (1, 1));
    assert_ne!(outcome.run_id, pending[0].run_id);
}

#[tokio::test]
async fn waiting_for_approval_costs_no_turn_or_token_budget() {
    let setup = Setup::new().await;
    let session = setup.session();
    let request = RequestId::new();
    // No more than the request needs: 2 turns, 2 tool calls, and tokens
    // for turn 2 to start (11 spent by turn 1).
    let budget = Budget {
        max_turns: Some(2),
        max_tokens: Some(23),
        max_tool_calls: Some(2),
    };
    let ctx = || RunContext::default().with_budget(budget);
    let (_, mut revision, _) = awaiting(expect_err(session.run(request, "ship it", ctx()).await));
    // Asked twice more before the decision.
    for _ in 0..2 {
        let run = setup
            .store
            .admission(setup.conversation)
            .await
            .unwrap()
            .active
            .unwrap()
            .run_id;
        let error = expect_err(
            session
                .resume_run(run, ctx(), revision, ResumePolicy::RejectAmbiguous)
                .await,
        );
        revision = awaiting(error).1;
    }
    let revision = session.approve(request, "d1", revision).await.unwrap();
    let outcome = session
        .continue_after_approval(request, ctx(), revision)
        .await
        .unwrap();
    assert_eq!(outcome.turns, 2);
    assert_eq!(outcome.usage, usage(30, 3));
    assert_eq!(
        setup.store.request(request).await.unwrap().unwrap().status,
        RequestStatus::Completed
    );
}

/// Needs approval for `lookup` calls that ask about secrets.
struct SecretsPolicy;

impl ApprovalPolicy for SecretsPolicy {
    fn name(&self) -> &str {
        "secrets-v1"
    }

    fn requires_approval(&self, tool: &str, arguments: &serde_json::Value) -> bool {
        tool == "lookup" && arguments["topic"] == "secrets"
    }
}

#[tokio::test]
async fn a_policy_on_arguments_gates_only_the_calls_it_names() {
    let setup = Setup::new().await;
    let script = vec![
        tools_reply(
            vec![
                ToolCall::new("weather", "lookup", json!({"topic": "weather"})),
                ToolCall::new("secret", "lookup", json!({"topic": "secrets"})),
            ],
            usage(1, 1),
        ),
        text_reply("done", usage(1, 1)),
    ];
    let agent = Agent::new(scripted(script))
        .with_tool(setup.lookup.clone())
        .with_approval_policy(Arc::new(SecretsPolicy));
    let plain = Agent::new(scripted(Vec::new())).with_tool(setup.lookup.clone());
    assert_ne!(
        agent.fingerprint(),
        plain.fingerprint(),
        "the policy is planned"
    );
    let session = session(agent, &setup.store, setup.conversation);
    let request = RequestId::new();
    let (_, revision, pending) = awaiting(expect_err(
        session.run(request, "look", RunContext::default()).await,
    ));
    assert_eq!(
        pending
            .iter()
            .map(|p| p.call_id.as_str())
            .collect::<Vec<_>>(),
        ["secret"]
    );
    assert_eq!(setup.lookup.calls(), 1);
    let revision = session.approve(request, "secret", revision).await.unwrap();
    session
        .continue_after_approval(request, RunContext::default(), revision)
        .await
        .unwrap();
    assert_eq!(setup.lookup.calls(), 2);
}

#[tokio::test]
async fn approval_rules_are_part_of_the_agent_fingerprint() {
    // (That an agent without rules keeps the fingerprint it had before
    // approvals existed is proved by `durability::compat`, which resumes a
    // request held by the old code.)
    let gated =
        Agent::new(scripted(Vec::new())).with_tool_requiring_approval(CountingTool::new("deploy"));
    let plain = Agent::new(scripted(Vec::new())).with_tool(CountingTool::new("deploy"));
    let also_gated =
        Agent::new(scripted(Vec::new())).with_tool_requiring_approval(CountingTool::new("deploy"));
    assert_ne!(gated.fingerprint(), plain.fingerprint());
    assert_eq!(gated.fingerprint(), also_gated.fingerprint());
}

#[tokio::test]
async fn an_upgraded_agent_is_refused_by_default_and_recorded_when_accepted() {
    let setup = Setup::new().await;
    let session = setup.session();
    let request = RequestId::new();
    let (_, revision, pending) = awaiting(expect_err(
        session.run(request, "ship it", RunContext::default()).await,
    ));
    let old = session.agent().fingerprint();

    // The upgrade: a new system prompt, and deploy needs no approval now.
    // (A scripted model answers by turn: turn 1's answer is recorded.)
    let script = vec![
        text_reply("unused", usage(0, 0)),
        text_reply("deployed v2", usage(5, 5)),
    ];
    let upgraded_agent = Agent::new(scripted(script))
        .with_system_prompt("v2")
        .with_tool(setup.deploy.clone())
        .with_tool(setup.lookup.clone());
    let new = upgraded_agent.fingerprint();
    let upgraded =
        turnstile_testkit::session::session(upgraded_agent, &setup.store, setup.conversation);
    let before = state(&setup.store, setup.conversation, request).await;
    assert!(matches!(
        upgraded
            .resume_run(
                pending[0].run_id,
                RunContext::default(),
                revision,
                ResumePolicy::RejectAmbiguous
            )
            .await,
        Err(Error::ConfigurationMismatch { .. })
    ));
    assert_eq!(
        state(&setup.store, setup.conversation, request).await,
        before
    );

    let ctx = RunContext::default().with_agent_upgrade(AgentUpgrade::Accept);
    let events: Vec<_> = upgraded
        .resume_stream(
            pending[0].run_id,
            ctx,
            revision,
            ResumePolicy::RejectAmbiguous,
        )
        .collect()
        .await;
    let changed = events.iter().find_map(|e| match e {
        Ok(Event::AgentChanged { run_id, from, to }) => Some((*run_id, from.clone(), to.clone())),
        _ => None,
    });
    let (run_id, from, to) = changed.expect("AgentChanged event");
    assert_eq!((from.as_str(), to.as_str()), (old.as_str(), new.as_str()));
    let run = setup.store.run(run_id).await.unwrap().unwrap();
    assert_eq!(
        run.agent_change,
        Some(AgentChange {
            from: old,
            to: new.clone()
        })
    );
    // The new agent needs no approval for `deploy`, but a human was asked:
    // the call waits for the answer all the same.
    let revision = match events.last() {
        Some(Err(Error::AwaitingApproval { revision, .. })) => *revision,
        other => panic!("expected AwaitingApproval, got {other:?}"),
    };
    assert_eq!(setup.deploy.calls(), 0);
    let revision = upgraded.approve(request, "d1", revision).await.unwrap();
    let outcome = upgraded
        .continue_after_approval(request, RunContext::default(), revision)
        .await
        .unwrap();
    assert_eq!(outcome.final_text.as_str(), "deployed v2");
    assert_eq!(setup.deploy.calls(), 1);
}

#[tokio::test]
async fn a_rejected_call_stays_rejected_under_an_agent_that_would_not_ask() {
    let setup = Setup::new().await;
    let session = setup.session();
    let request = RequestId::new();
    let (_, revision, _) = awaiting(expect_err(
        session.run(request, "ship it", RunContext::default()).await,
    ));
    let revision = session.reject(request, "d1", revision, "no").await.unwrap();
    // Continued by an agent without the approval rule (accepted upgrade).
    let script = vec![
        text_reply("unused", usage(0, 0)),
        text_reply("not deployed", usage(5, 5)),
    ];
    let agent = Agent::new(scripted(script))
        .with_tool(setup.deploy.clone())
        .with_tool(setup.lookup.clone());
    let upgraded = turnstile_testkit::session::session(agent, &setup.store, setup.conversation);
    let ctx = RunContext::default().with_agent_upgrade(AgentUpgrade::Accept);
    let outcome = upgraded
        .continue_after_approval(request, ctx, revision)
        .await
        .unwrap();
    assert_eq!(setup.deploy.calls(), 0, "a rejected call never runs");
    assert!(tool_results(&outcome.messages).contains(&(
        "d1".to_owned(),
        "not run: the tool call was rejected by the approver: no".to_owned(),
        true
    )));
}

#[tokio::test]
async fn asking_again_leaves_the_turn_settled() {
    let setup = Setup::new().await;
    let session = setup.session();
    let request = RequestId::new();
    let (_, revision, pending) = awaiting(expect_err(
        session.run(request, "ship it", RunContext::default()).await,
    ));
    let error = expect_err(
        session
            .resume_run(
                pending[0].run_id,
                RunContext::default(),
                revision,
                ResumePolicy::RejectAmbiguous,
            )
            .await,
    );
    let (_, _, again) = awaiting(error);
    let asking = again[0].run_id;
    assert_ne!(
        asking, pending[0].run_id,
        "listed under the run that holds it now"
    );
    // The run that only asked never marked the round in flight: a crash
    // while it asked leaves nothing ambiguous.
    let phases: Vec<_> = setup
        .store
        .checkpoints(asking)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.phase)
        .collect();
    assert_eq!(phases, [turnstile::CheckpointPhase::ToolsPending]);
}

#[tokio::test]
async fn a_wall_clock_deadline_is_stored_and_binds_every_later_run() {
    let setup = Setup::new().await;
    let session = setup.session();
    let request = RequestId::new();
    let deadline = SystemTime::now() + Duration::from_millis(1_500);
    let ctx = RunContext::default().with_deadline_at(deadline);
    let (_, revision, _) = awaiting(expect_err(session.run(request, "ship it", ctx).await));
    let stored = setup.store.request(request).await.unwrap().unwrap();
    let millis = deadline
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert_eq!(stored.deadline_at, Some(millis));
    let revision = session.approve(request, "d1", revision).await.unwrap();
    tokio::time::sleep_until(tokio::time::Instant::now() + Duration::from_millis(1_600)).await;
    // A continuation that gives no deadline of its own stops at the stored
    // one, before any tool runs.
    let error = expect_err(
        session
            .continue_after_approval(request, RunContext::default(), revision)
            .await,
    );
    assert!(matches!(error, Error::DeadlineExceeded { .. }), "{error:?}");
    assert_eq!(setup.deploy.calls(), 0);
}
