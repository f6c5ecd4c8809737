//! The session scenarios that matter most, on PostgreSQL: admission, busy
//! and replay; a replaced owner fenced; a failed run resumed by another
//! store (another pool, as another process would have) with its usage
//! carried over; summaries; refusals that write nothing.

use std::sync::Arc;

use turnstile::{
    Agent, AgentSession, Budget, BudgetKind, ContextPolicy, ConversationId, Error, MaxPasses,
    RequestId, ResumePolicy, RunContext, Store,
};
use turnstile_testkit::postgres::{fresh_options, fresh_store};
use turnstile_testkit::session::*;
use turnstile_testkit::tools::*;

async fn pg() -> Arc<dyn Store> {
    Arc::new(fresh_store().await)
}

/// A second store on the same schema: what another process would open.
async fn same_schema(options: &turnstile::PostgresOptions) -> Arc<dyn Store> {
    Arc::new(
        turnstile::PostgresStore::connect_with(options.clone())
            .await
            .expect("connect again"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_conversation_is_busy_a_reused_id_is_refused_and_a_retry_replays() {
    let store = pg().await;
    let tool = BlockingTool::new("wait", 1);
    let model = scripted(vec![
        tools_reply(vec![call("c1", "wait")], usage(10, 2)),
        text_reply("done", usage(12, 3)),
    ]);
    let conversation = ConversationId::new();
    let session = session(
        agent(model.clone(), vec![tool.clone()]),
        &store,
        conversation,
    );
    let request = RequestId::new();
    let running = {
        let session = session.clone();
        tokio::spawn(async move { session.run(request, "hold", RunContext::default()).await })
    };
    tool.entered().await;

    let other = session
        .run(RequestId::new(), "me too", RunContext::default())
        .await;
    assert!(
        matches!(&other, Err(Error::Busy { request_id, .. }) if *request_id == request),
        "{other:?}"
    );
    let before = state(&store, conversation, request).await;
    let reused = session
        .run(request, "other input", RunContext::default())
        .await;
    assert!(
        matches!(reused, Err(Error::RequestMismatch { .. })),
        "{reused:?}"
    );
    assert_eq!(state(&store, conversation, request).await, before);

    tool.release();
    let outcome = running.await.expect("join").expect("run");
    assert_eq!((outcome.final_text.as_str(), outcome.turns), ("done", 2));
    let again = session
        .run(request, "hold", RunContext::default())
        .await
        .expect("replay");
    assert!(again.replayed);
    assert_eq!(again.final_text, "done");
    assert_eq!(model.calls(), 2, "a replay calls no model");
    assert_eq!(tool.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_owner_is_fenced_and_its_late_writes_change_nothing() {
    let options = fresh_options();
    let first_store = same_schema(&options).await;
    let second_store = same_schema(&options).await;
    let conversation = ConversationId::new();
    let tool = BlockingTool::new("slow", 1);
    let first = session(
        agent(
            scripted(vec![
                tools_reply(vec![call("c1", "slow")], usage(5, 1)),
                text_reply("first owner", usage(5, 1)),
            ]),
            vec![tool.clone()],
        ),
        &first_store,
        conversation,
    );
    let request = RequestId::new();
    let owner = {
        let first = first.clone();
        tokio::spawn(async move { first.run(request, "go", RunContext::default()).await })
    };
    tool.entered().await;

    // Another process takes the request over while the owner's tool runs.
    let counting = CountingTool::new("slow");
    let second = session(
        agent(
            // Scripts answer by turn: turn 1's answer is stored already.
            scripted(vec![
                tools_reply(vec![call("c1", "slow")], usage(5, 1)),
                text_reply("second owner", usage(7, 2)),
            ]),
            vec![counting.clone()],
        ),
        &second_store,
        conversation,
    );
    let revision = second_store
        .admission(conversation)
        .await
        .expect("admission")
        .revision;
    let recovered = second
        .recover_after_owner_exit(
            request,
            "go",
            RunContext::default(),
            revision,
            ResumePolicy::RetryInterruptedTurn,
        )
        .await
        .expect("recover");
    assert_eq!(recovered.final_text, "second owner");

    tool.release();
    let late = owner.await.expect("join");
    assert!(matches!(late, Err(Error::Fenced { .. })), "{late:?}");
    let transcript = second_store
        .transcript_window(conversation, 100)
        .await
        .expect("transcript");
    let answers: Vec<_> = transcript
        .iter()
        .filter(|e| e.message.role() == "assistant" && e.message.tool_calls().is_empty())
        .map(|e| e.message.text())
        .collect();
    assert_eq!(answers, ["second owner"], "only the new owner's answer");
    assert_one_result_per_call(
        &transcript
            .iter()
            .map(|e| e.message.clone())
            .collect::<Vec<_>>(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_run_resumes_from_another_store_with_its_usage_carried_over() {
    let options = fresh_options();
    let conversation = ConversationId::new();
    let request = RequestId::new();
    let tool = CountingTool::new("count");
    let replies = || {
        vec![
            tools_reply(vec![call("c1", "count")], usage(10, 2)),
            text_reply("finished", usage(20, 4)),
        ]
    };
    let stopped = {
        let store = same_schema(&options).await;
        let session = session(
            agent(scripted(replies()), vec![tool.clone()]),
            &store,
            conversation,
        );
        let ctx = RunContext::default().with_budget(Budget {
            max_turns: Some(1),
            ..Budget::default()
        });
        session.run(request, "work", ctx).await
    };
    let err = expect_err(stopped);
    assert!(
        matches!(
            err,
            Error::BudgetExceeded {
                kind: BudgetKind::Turns,
                ..
            }
        ),
        "{err:?}"
    );
    let (run_id, revision) = err.stopped_run().expect("stopped run");

    let store = same_schema(&options).await;
    assert_eq!(
        store.recovery_usage(request).await.expect("usage"),
        usage(10, 2)
    );
    // Scripts answer by turn; the first turn's answer is stored, so the
    // second model is called once, for the second turn.
    let model = scripted(replies());
    let session = session(
        agent(model.clone(), vec![tool.clone()]),
        &store,
        conversation,
    );
    let outcome = session
        .resume_run(
            run_id,
            more_turns(),
            revision,
            ResumePolicy::RejectAmbiguous,
        )
        .await
        .expect("resume");
    assert_eq!(outcome.final_text, "finished");
    assert_eq!(
        outcome.usage,
        usage(30, 6),
        "usage carried over, counted once"
    );
    assert_eq!((outcome.turns, outcome.tool_calls), (2, 1));
    assert_eq!(tool.calls(), 1, "the journaled call did not run again");
    assert_eq!(model.calls(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn older_entries_are_summarized_once_and_the_summary_is_kept() {
    let store = pg().await;
    let conversation = ConversationId::new();
    let answers: Vec<_> = (0..6)
        .map(|i| text_reply(&format!("answer {i}"), usage(1, 1)))
        .collect();
    let summarizer = scripted(vec![text_reply("the story so far", usage(3, 1))]);
    let session = AgentSession::new(
        agent(scripted(answers), vec![]),
        store.clone(),
        conversation,
        ns(),
        ContextPolicy::new(4)
            .and_then(|p| p.with_summary_batch(4))
            .expect("policy"),
    )
    .with_summary_agent(
        Agent::new(summarizer.clone()),
        MaxPasses::new(1).expect("passes"),
    );
    for i in 0..6 {
        session
            .run(
                RequestId::new(),
                &format!("question {i}"),
                RunContext::default(),
            )
            .await
            .expect("run");
    }
    let summary = store
        .latest_summary(conversation)
        .await
        .expect("summary")
        .expect("a summary was made");
    assert_eq!(summary.content, "the story so far");
    assert_eq!(summary.from_seq, 0);
    assert!(summary.through_seq >= 3, "{summary:?}");
    assert!(summarizer.calls() >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_typed_and_write_nothing() {
    let store = pg().await;
    let conversation = ConversationId::new();
    let model = scripted(vec![text_reply("ok", usage(1, 1))]);
    let session = session(agent(model.clone(), vec![]), &store, conversation);
    let request = RequestId::new();
    session
        .run(request, "first", RunContext::default())
        .await
        .expect("run");

    // The same request id in another conversation is that request.
    let elsewhere = turnstile_testkit::session::session(
        agent(model.clone(), vec![]),
        &store,
        ConversationId::new(),
    );
    let before = store.request(request).await.expect("request");
    let reused = elsewhere.run(request, "first", RunContext::default()).await;
    assert!(reused.is_err(), "{reused:?}");
    assert_eq!(store.request(request).await.expect("request"), before);

    // A conversation of another namespace is refused without its content.
    let other_ns = AgentSession::new(
        agent(model.clone(), vec![]),
        store.clone(),
        conversation,
        turnstile::Namespace::new("someone-else").expect("namespace"),
        ContextPolicy::default(),
    );
    let refused = other_ns
        .run(RequestId::new(), "peek", RunContext::default())
        .await;
    assert!(
        matches!(refused, Err(Error::NamespaceMismatch { .. })),
        "{refused:?}"
    );
    assert_eq!(model.calls(), 1, "no refusal called the model");
    let transcript = store
        .transcript_window(conversation, 10)
        .await
        .expect("transcript");
    assert_eq!(transcript.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_pruned_and_created_again_elsewhere_up_to_the_remembered_revision_shows_its_new_transcript(
) -> turnstile_conformance::support::TestResult {
    let options = fresh_options();
    let here = Arc::new(turnstile::PostgresStore::connect_with(options.clone()).await?);
    let elsewhere = Arc::new(turnstile::PostgresStore::connect_with(options).await?);
    turnstile_conformance::claim_memory::a_conversation_pruned_and_created_again_elsewhere_up_to_the_remembered_revision_shows_its_new_transcript(here, elsewhere).await
}
