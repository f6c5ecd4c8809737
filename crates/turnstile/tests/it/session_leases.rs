//! Opt-in leases in one process: a leased run renews while it works and
//! its commit drops the lease; a renewal that is fenced stops a run whose
//! tool never returns; `recover_expired` takes each lapsed request over
//! once and leaves the rest alone.

use std::sync::Arc;
use std::time::Duration;

use turnstile::admin::ListFilter;
use turnstile::{
    recover_expired, AgentSession, ConversationId, Error, LeasePolicy, RequestId, ResumePolicy,
    RunContext, SqliteStore, Store, StoreAdmin,
};
use turnstile_core::backend::now_ms;
use turnstile_testkit::session::*;
use turnstile_testkit::tools::*;

fn lease(renew_ms: u64, ttl_ms: u64) -> LeasePolicy {
    LeasePolicy::new(
        Duration::from_millis(renew_ms),
        Duration::from_millis(ttl_ms),
    )
    .unwrap()
}

fn leased(session: Arc<AgentSession>, policy: LeasePolicy) -> Arc<AgentSession> {
    Arc::new(Arc::try_unwrap(session).ok().unwrap().with_lease(policy))
}

/// The lease every held admission of the store holds, expired or not.
async fn leases(store: &SqliteStore) -> Vec<(ConversationId, i64)> {
    let page = store
        .list_conversations(&ListFilter::default())
        .await
        .unwrap();
    page.conversations
        .into_iter()
        .filter_map(|c| Some((c.id, c.held?.lease_expires_at?)))
        .collect()
}

#[test]
fn a_lease_must_outlive_its_renewal_interval() {
    for (renew, ttl) in [(0, 100), (100, 100), (200, 100)] {
        let refused = LeasePolicy::new(Duration::from_millis(renew), Duration::from_millis(ttl));
        assert!(
            matches!(refused, Err(Error::InvalidInput(_))),
            "{refused:?}"
        );
    }
    let default = LeasePolicy::default();
    assert_eq!(
        (default.renew_every(), default.ttl()),
        (Duration::from_secs(10), Duration::from_secs(30))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_run_renews_while_it_works_and_its_commit_drops_the_lease() {
    let admin = SqliteStore::in_memory().await.unwrap();
    let store: Arc<dyn Store> = Arc::new(admin.clone());
    let block = BlockingTool::new("block", 1);
    let model = scripted(vec![
        tools_reply(vec![call("b1", "block")], usage(1, 1)),
        text_reply("answer", usage(1, 1)),
    ]);
    let conversation = ConversationId::new();
    let owner = leased(
        session(agent(model, vec![block.clone()]), &store, conversation),
        lease(50, 400),
    );
    let run = {
        let owner = owner.clone();
        tokio::spawn(async move {
            owner
                .run(RequestId::new(), "work", RunContext::default())
                .await
        })
    };
    block.entered().await;
    let first = leases(&admin).await;
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].0, conversation);
    assert!(first[0].1 > now_ms(), "the lease holds: {first:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let later = leases(&admin).await;
    assert!(later[0].1 > first[0].1, "renewed: {first:?} then {later:?}");
    assert!(store.expired_leases(10).await.unwrap().is_empty());

    block.release();
    let outcome = run.await.unwrap().unwrap();
    assert_eq!(outcome.final_text, "answer");
    assert!(leases(&admin).await.is_empty());

    // A session without a lease takes none.
    let plain_block = BlockingTool::new("block", 1);
    let model = scripted(vec![
        tools_reply(vec![call("b1", "block")], usage(1, 1)),
        text_reply("answer", usage(1, 1)),
    ]);
    let plain = session(
        agent(model, vec![plain_block.clone()]),
        &store,
        conversation,
    );
    let run = tokio::spawn(async move {
        plain
            .run(RequestId::new(), "again", RunContext::default())
            .await
    });
    plain_block.entered().await;
    assert!(leases(&admin).await.is_empty());
    plain_block.release();
    run.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_renewal_is_fenced_stops_though_its_tool_never_returns() {
    let store = memory_store().await;
    // Only the first execution blocks (and is never released).
    let block = BlockingTool::new("block", 1);
    let model = scripted(vec![
        tools_reply(vec![call("b1", "block")], usage(1, 1)),
        text_reply("recovered", usage(1, 1)),
    ]);
    let agent = agent(model, vec![block.clone()]);
    let conversation = ConversationId::new();
    let owner = leased(session(agent.clone(), &store, conversation), lease(50, 400));
    let host = session(agent, &store, conversation);
    let request = RequestId::new();
    let zombie = {
        let owner = owner.clone();
        tokio::spawn(async move { owner.run(request, "work", RunContext::default()).await })
    };
    block.entered().await;
    let admission = store.admission(conversation).await.unwrap();
    let run_a = admission.active.as_ref().unwrap().run_id;
    let outcome = host
        .resume_run(
            run_a,
            RunContext::default(),
            admission.revision,
            ResumePolicy::RetryInterruptedTurn,
        )
        .await
        .unwrap();
    assert_eq!(outcome.final_text, "recovered");

    let stopped = tokio::time::timeout(Duration::from_secs(5), zombie)
        .await
        .expect("the fenced run stopped")
        .unwrap();
    assert!(
        matches!(stopped, Err(Error::Fenced { run_id, revision })
            if run_id == run_a && revision == admission.revision),
        "{stopped:?}"
    );
    assert_eq!(block.calls(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_expired_takes_each_lapsed_request_over_once_and_leaves_the_rest_alone() {
    let (_dir, path) = temp_db();
    let store = file_store(&path).await;
    let script = || {
        scripted(vec![
            tools_reply(vec![call("b1", "block")], usage(1, 1)),
            text_reply("recovered", usage(1, 1)),
        ])
    };
    // Three owners stop driving inside a tool (their futures are dropped),
    // so their leases lapse; the third belongs to nobody's recoverer.
    let mut owners = Vec::new();
    for _ in 0..3 {
        let block = BlockingTool::new("block", 1);
        let conversation = ConversationId::new();
        let owner = leased(
            session(agent(script(), vec![block.clone()]), &store, conversation),
            lease(50, 200),
        );
        let run = tokio::spawn(async move {
            owner
                .run(RequestId::new(), "work", RunContext::default())
                .await
        });
        block.entered().await;
        run.abort();
        owners.push(conversation);
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    let ignored = owners[2];

    // Two recoverers, as two processes would run them, at once.
    let other_store = file_store(&path).await;
    let recoverer = |store: Arc<dyn Store>| async move {
        let for_store = store.clone();
        recover_expired(
            store.as_ref(),
            move |expired| {
                (expired.conversation_id != ignored).then(|| {
                    let block = BlockingTool::new("block", 0);
                    AgentSession::new(
                        agent(script(), vec![block]),
                        for_store.clone(),
                        expired.conversation_id,
                        ns(),
                        turnstile::ContextPolicy::default(),
                    )
                    .with_lease(lease(50, 200))
                })
            },
            RunContext::default(),
            ResumePolicy::RetryInterruptedTurn,
            10,
        )
        .await
        .unwrap()
    };
    let (a, b) = tokio::join!(recoverer(store.clone()), recoverer(other_store));
    let mut recovered = Vec::new();
    for r in a.iter().chain(b.iter()) {
        assert_ne!(r.lease.conversation_id, ignored);
        match &r.result {
            Ok(outcome) if !outcome.replayed => {
                assert_eq!(outcome.final_text, "recovered");
                recovered.push(r.lease.conversation_id);
            }
            // The other recoverer got there first.
            Ok(_) | Err(Error::Conflict { .. } | Error::Busy { .. } | Error::NotActive { .. }) => {}
            Err(e) => panic!("unexpected error: {e:?}"),
        }
    }
    recovered.sort();
    let mut want = owners[..2].to_vec();
    want.sort();
    assert_eq!(
        recovered, want,
        "each lapsed request recovered exactly once"
    );
    for conversation in &owners[..2] {
        assert!(store
            .admission(*conversation)
            .await
            .unwrap()
            .active
            .is_none());
    }
    // The ignored one is still held, its lease lapsed.
    let left = store.expired_leases(10).await.unwrap();
    assert_eq!(
        left.iter().map(|l| l.conversation_id).collect::<Vec<_>>(),
        [ignored]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_expired_refuses_a_session_of_another_conversation_and_writes_nothing() {
    let store = memory_store().await;
    let block = BlockingTool::new("block", 1);
    let model = scripted(vec![tools_reply(vec![call("b1", "block")], usage(1, 1))]);
    let conversation = ConversationId::new();
    let owner = leased(
        session(
            agent(model.clone(), vec![block.clone()]),
            &store,
            conversation,
        ),
        lease(50, 200),
    );
    let run = tokio::spawn(async move {
        owner
            .run(RequestId::new(), "work", RunContext::default())
            .await
    });
    block.entered().await;
    run.abort();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let before = store.admission(conversation).await.unwrap();

    let elsewhere = ConversationId::new();
    let recoveries = recover_expired(
        store.as_ref(),
        |_| {
            Some(
                Arc::try_unwrap(session(agent(model.clone(), vec![]), &store, elsewhere))
                    .ok()
                    .unwrap(),
            )
        },
        RunContext::default(),
        ResumePolicy::RetryInterruptedTurn,
        10,
    )
    .await
    .unwrap();
    assert_eq!(recoveries.len(), 1);
    assert!(
        matches!(recoveries[0].result, Err(Error::InvalidInput(_))),
        "{:?}",
        recoveries[0].result
    );
    assert_eq!(store.admission(conversation).await.unwrap(), before);
}
