//! The session's metadata: set before the first request (creating the
//! conversation), changed while a stopped run holds the admission without
//! fencing it, and kept through the commit that follows.

use turnstile::store::MetaUpdate;
use turnstile::{Budget, ConversationId, Error, RequestId, ResumePolicy, RunContext};
use turnstile_testkit::session::*;
use turnstile_testkit::tools::*;

fn titled(title: &str) -> MetaUpdate {
    MetaUpdate {
        title: Some(Some(title.to_owned())),
        ..MetaUpdate::default()
    }
}

#[tokio::test]
async fn labelling_a_held_conversation_fences_no_run_and_survives_its_commit() {
    let store = memory_store().await;
    let model = scripted(vec![
        tools_reply(vec![call("c1", "count")], usage(1, 1)),
        text_reply("done", usage(1, 1)),
    ]);
    let tool = CountingTool::new("count");
    let conversation_id = ConversationId::new();
    let session = session(agent(model, vec![tool]), &store, conversation_id);
    assert!(matches!(session.meta().await, Err(Error::NotFound { .. })));
    let created = session.set_meta(0, &titled("first")).await.unwrap();
    assert_eq!(created.meta_version, 1);

    // One turn, then the budget stops the run with the admission held.
    let one_turn = RunContext::default().with_budget(Budget {
        max_turns: Some(1),
        ..Budget::default()
    });
    let stopped = session
        .run(RequestId::new(), "work", one_turn)
        .await
        .expect_err("the budget stops it");
    let (run, revision) = stopped.stopped_run().expect("a stopped run");
    let relabelled = session.set_meta(1, &titled("second")).await.unwrap();
    assert_eq!(
        store.admission(conversation_id).await.unwrap().revision,
        revision
    );
    let stale = session.set_meta(1, &titled("third")).await;
    assert!(
        matches!(stale, Err(Error::MetaVersionConflict { actual: 2, .. })),
        "{stale:?}"
    );

    // The run resumes at the revision it had and commits; the label stays.
    let outcome = session
        .resume_run(run, more_turns(), revision, ResumePolicy::RejectAmbiguous)
        .await
        .expect("resumed to the end");
    assert_eq!(outcome.final_text, "done");
    assert_eq!(session.meta().await.unwrap(), relabelled);
}
