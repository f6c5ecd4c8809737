//! Budgets count the whole request across resumes: a stopped run keeps the
//! admission, a resume with the same budget is refused before it writes, a
//! larger budget finishes with usage and turns summed over every run. The
//! budget is stored with the request: a resume that sets none keeps it, one
//! that sets other limits records the change.

use std::sync::Arc;

use turnstile::store::{BudgetChange, RequestStatus, RunStatus};
use turnstile::{
    AgentLimits, Budget, BudgetKind, CheckpointPhase, ConversationId, Error, RequestId,
    ResumePolicy, RunContext, ScriptedModel, ScriptedReply,
};
use turnstile_testkit::session::*;
use turnstile_testkit::tools::*;

/// Two tool turns and a final answer, each with its own cost.
fn three_turn_script() -> Vec<ScriptedReply> {
    vec![
        tools_reply(vec![call("c1", "count")], usage(10, 1)),
        tools_reply(vec![call("c2", "count")], usage(20, 2)),
        text_reply("finished", usage(30, 3)),
    ]
}

fn turns(max_turns: u32) -> RunContext {
    RunContext::default().with_budget(Budget {
        max_turns: Some(max_turns),
        ..Budget::default()
    })
}

fn tokens(max_tokens: u64) -> RunContext {
    RunContext::default().with_budget(Budget {
        max_tokens: Some(max_tokens),
        ..Budget::default()
    })
}

fn assert_turns_exceeded(err: &Error, expected_used: u64, expected_limit: u64) {
    match err {
        Error::BudgetExceeded {
            kind: BudgetKind::Turns,
            used,
            limit,
            ..
        } => assert_eq!((*used, *limit), (expected_used, expected_limit), "{err}"),
        other => panic!("expected a turns budget error, got {other:?}"),
    }
}

#[tokio::test]
async fn run_that_spends_its_turn_budget_stops_with_admission_held_and_resumes_only_with_more() {
    let store = memory_store().await;
    let model: Arc<ScriptedModel> = scripted(three_turn_script());
    let tool = CountingTool::new("count");
    let conversation_id = ConversationId::new();
    let session = session(
        agent(model.clone(), vec![tool.clone()]),
        &store,
        conversation_id,
    );
    let request_id = RequestId::new();

    // First run: one turn, then the budget is spent.
    let err = expect_err(session.run(request_id, "work", turns(1)).await);
    assert_turns_exceeded(&err, 1, 1);
    let (run1, rev1) = err.stopped_run().expect("stopped run");
    let admission = store.admission(conversation_id).await.unwrap();
    assert_eq!(admission.revision, rev1);
    let active = admission.active.expect("admission held");
    assert_eq!((active.request_id, active.run_id), (request_id, run1));
    assert_eq!(active.usage, usage(10, 1));
    let checkpoint = store.latest_checkpoint(run1).await.unwrap().unwrap();
    assert_eq!(
        (checkpoint.turn, checkpoint.phase),
        (1, CheckpointPhase::Ready)
    );
    assert_eq!(
        store.run(run1).await.unwrap().unwrap().status,
        RunStatus::Failed
    );
    assert_eq!((model.calls(), tool.calls()), (1, 1));

    // Same budget: the spent turn counts, so the resume is refused before
    // it writes anything (pasting it again never loops).
    let err = expect_err(
        session
            .resume_run(run1, turns(1), rev1, ResumePolicy::RejectAmbiguous)
            .await,
    );
    assert_turns_exceeded(&err, 1, 1);
    assert_eq!(err.stopped_run(), Some((run1, rev1)));
    assert_eq!(
        (model.calls(), tool.calls()),
        (1, 1),
        "no work without budget"
    );
    let admission = store.admission(conversation_id).await.unwrap();
    assert_eq!(admission.revision, rev1, "a refused resume writes nothing");
    assert_eq!(admission.active.map(|a| a.run_id), Some(run1));

    // A larger budget finishes the request, counting every run.
    let outcome = session
        .resume_run(run1, turns(3), rev1, ResumePolicy::RejectAmbiguous)
        .await
        .expect("resumed to the end");
    assert!(!outcome.replayed);
    assert_eq!(outcome.final_text, "finished");
    assert_eq!(outcome.turns, 3);
    assert_eq!(outcome.tool_calls, 2);
    assert_eq!(outcome.usage, usage(60, 6));
    assert_eq!((model.calls(), tool.calls()), (3, 2));
    assert_eq!(outcome.messages.len(), 6);
    assert_one_result_per_call(&outcome.messages);
    let run2 = store.run(outcome.run_id).await.unwrap().unwrap();
    assert_eq!(run2.resumed_from, Some(run1));
    assert_eq!(run2.status, RunStatus::Completed);
    let admission = store.admission(conversation_id).await.unwrap();
    assert!(admission.active.is_none());
    assert_eq!(
        store.request(request_id).await.unwrap().unwrap().status,
        RequestStatus::Completed
    );
}

#[tokio::test]
async fn agent_max_turns_limits_a_request_across_resumes() {
    let store = memory_store().await;
    let model = scripted(three_turn_script());
    let tool = CountingTool::new("count");
    let limited = agent(model.clone(), vec![tool.clone()]).with_limits(AgentLimits {
        max_turns: 2,
        ..AgentLimits::default()
    });
    let conversation_id = ConversationId::new();
    let session = session(limited, &store, conversation_id);
    let request_id = RequestId::new();

    // A caller budget larger than the agent's limit does not lift it.
    let err = expect_err(session.run(request_id, "work", turns(10)).await);
    assert_turns_exceeded(&err, 2, 2);
    assert_eq!((model.calls(), tool.calls()), (2, 2));
    let (run, revision) = err.stopped_run().unwrap();
    assert!(store
        .admission(conversation_id)
        .await
        .unwrap()
        .active
        .is_some());

    let err = expect_err(
        session
            .resume_run(
                run,
                RunContext::default(),
                revision,
                ResumePolicy::default(),
            )
            .await,
    );
    assert_turns_exceeded(&err, 2, 2);
    assert_eq!(model.calls(), 2, "resuming does not grant new turns");
}

#[tokio::test]
async fn token_budget_counts_the_seeded_usage_of_a_resumed_run() {
    let store = memory_store().await;
    let model = scripted(three_turn_script());
    let conversation_id = ConversationId::new();
    let session = session(
        agent(model.clone(), vec![CountingTool::new("count")]),
        &store,
        conversation_id,
    );
    let request_id = RequestId::new();

    let err = expect_err(session.run(request_id, "work", tokens(11)).await);
    match err {
        Error::BudgetExceeded {
            kind: BudgetKind::Tokens,
            used,
            limit,
            ..
        } => assert_eq!((used, limit), (11, 11)),
        ref other => panic!("expected a token budget error, got {other:?}"),
    }
    assert_eq!(model.calls(), 1);
    let (run, revision) = err.stopped_run().unwrap();
    let retry = ResumePolicy::RetryInterruptedTurn;
    let err = expect_err(session.resume_run(run, tokens(11), revision, retry).await);
    assert!(
        matches!(
            err,
            Error::BudgetExceeded {
                kind: BudgetKind::Tokens,
                used: 11,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(model.calls(), 1, "seeded usage counts against the budget");
    let (run, revision) = err.stopped_run().unwrap();
    let outcome = session
        .resume_run(run, tokens(1000), revision, retry)
        .await
        .expect("finish");
    assert_eq!(outcome.usage, usage(60, 6));
    assert_eq!(model.calls(), 3);
}

/// The token check runs before any model call, so nothing is in flight when
/// it stops a run: resuming with the default policy must not be refused as
/// ambiguous.
#[tokio::test]
async fn token_budget_stop_is_resumable_with_the_default_policy() {
    let store = memory_store().await;
    let model = scripted(three_turn_script());
    let conversation_id = ConversationId::new();
    let session = session(
        agent(model.clone(), vec![CountingTool::new("count")]),
        &store,
        conversation_id,
    );
    let err = expect_err(session.run(RequestId::new(), "work", tokens(11)).await);
    let (run, revision) = err.stopped_run().unwrap();
    assert_eq!(model.calls(), 1);

    let resumed = session
        .resume_run(run, tokens(1000), revision, ResumePolicy::RejectAmbiguous)
        .await;
    assert!(
        resumed.is_ok(),
        "a token-budget stop made no model call, yet resuming it failed: {resumed:?}"
    );
}

#[tokio::test]
async fn tool_call_budget_stops_the_tool_round_without_running_tools() {
    let store = memory_store().await;
    let model = scripted(three_turn_script());
    let tool = CountingTool::new("count");
    let conversation_id = ConversationId::new();
    let session = session(
        agent(model.clone(), vec![tool.clone()]),
        &store,
        conversation_id,
    );
    let ctx = RunContext::default().with_budget(Budget {
        max_tool_calls: Some(1),
        ..Budget::default()
    });

    let err = expect_err(session.run(RequestId::new(), "work", ctx).await);
    assert!(
        matches!(
            err,
            Error::BudgetExceeded {
                kind: BudgetKind::ToolCalls,
                used: 1,
                limit: 1,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(tool.calls(), 1);
    assert!(store
        .admission(conversation_id)
        .await
        .unwrap()
        .active
        .is_some());
}

#[tokio::test]
async fn a_resume_without_a_budget_keeps_the_one_stored_with_the_request() {
    let store = memory_store().await;
    let model = scripted(three_turn_script());
    let tool = CountingTool::new("count");
    let conversation_id = ConversationId::new();
    let first = session(
        agent(model.clone(), vec![tool.clone()]),
        &store,
        conversation_id,
    );
    let request_id = RequestId::new();
    let err = expect_err(first.run(request_id, "work", turns(1)).await);
    let (run1, rev1) = err.stopped_run().expect("stopped run");
    let stored = store.request(request_id).await.unwrap().unwrap().budget;
    assert_eq!(stored, turns(1).budget);

    // Another session, as another process builds it, sets no budget: the
    // stored one still holds, and the refusal writes nothing.
    let later = session(
        agent(model.clone(), vec![tool.clone()]),
        &store,
        conversation_id,
    );
    let err = expect_err(
        later
            .resume_run(
                run1,
                RunContext::default(),
                rev1,
                ResumePolicy::RejectAmbiguous,
            )
            .await,
    );
    assert_turns_exceeded(&err, 1, 1);
    assert_eq!(err.stopped_run(), Some((run1, rev1)));
    assert_eq!(model.calls(), 1);
    assert_eq!(
        store.admission(conversation_id).await.unwrap().revision,
        rev1
    );
}

#[tokio::test]
async fn a_resume_that_raises_the_budget_records_the_change_and_later_runs_keep_it() {
    let store = memory_store().await;
    let model = scripted(three_turn_script());
    let tool = CountingTool::new("count");
    let conversation_id = ConversationId::new();
    let session = session(
        agent(model.clone(), vec![tool.clone()]),
        &store,
        conversation_id,
    );
    let request_id = RequestId::new();
    let err = expect_err(session.run(request_id, "work", turns(1)).await);
    let (run1, rev1) = err.stopped_run().unwrap();
    assert_eq!(store.run(run1).await.unwrap().unwrap().budget_change, None);

    // Raised to two turns: the new run records the change and stops there.
    let retry = ResumePolicy::RejectAmbiguous;
    let err = expect_err(session.resume_run(run1, turns(2), rev1, retry).await);
    assert_turns_exceeded(&err, 2, 2);
    let (run2, rev2) = err.stopped_run().unwrap();
    assert_eq!(
        store.run(run2).await.unwrap().unwrap().budget_change,
        Some(BudgetChange {
            from: turns(1).budget,
            to: turns(2).budget,
        })
    );
    assert_eq!(
        store.request(request_id).await.unwrap().unwrap().budget,
        turns(2).budget
    );
    assert_eq!(model.calls(), 2);

    // Without a budget, the raised one holds.
    let err = expect_err(
        session
            .resume_run(run2, RunContext::default(), rev2, retry)
            .await,
    );
    assert_turns_exceeded(&err, 2, 2);
    assert_eq!(err.stopped_run(), Some((run2, rev2)));

    // A limit of another kind keeps the stored turns and adds to them.
    let both = RunContext::default().with_budget(both_budget());
    let outcome = session
        .resume_run(run2, both, rev2, retry)
        .await
        .expect("finish");
    assert_eq!(outcome.turns, 3);
    let run3 = store.run(outcome.run_id).await.unwrap().unwrap();
    assert_eq!(
        run3.budget_change.map(|c| (c.from, c.to)),
        Some((turns(2).budget, both_budget()))
    );
}

fn both_budget() -> Budget {
    Budget {
        max_turns: Some(3),
        max_tokens: Some(1_000),
        ..Budget::default()
    }
}
