//! What a store remembers of a conversation after a commit
//! (`Store::claim_memory`) is checked by the claim itself: when another
//! process prunes the conversation whole and creates it again under its id,
//! up to the very revision remembered, the next request is not claimed
//! from memory and the model is shown the new transcript, not the pruned
//! one.

use std::sync::Arc;
use std::time::Duration;

use turnstile_conformance::support::complete_request;
use turnstile_core::admin::{PruneOptions, StoreAdmin};
use turnstile_core::{ConversationId, Message, RequestId, RunContext, Store};
use turnstile_sqlite::SqliteStore;
use turnstile_testkit::session::{agent, ns, session, temp_db, text_reply, usage, ProbeModel};

/// Runs `input` on `store` with a model answering `answer`; returns the
/// context the model was shown.
async fn ask(
    store: &Arc<dyn Store>,
    id: ConversationId,
    input: &str,
    answer: &str,
) -> Vec<Message> {
    let model = ProbeModel::new(vec![text_reply(answer, usage(1, 1))], 0);
    session(agent(model.clone(), Vec::new()), store, id)
        .run(RequestId::new(), input, RunContext::default())
        .await
        .expect("request");
    model.seen().first().cloned().expect("the model was called")
}

#[tokio::test]
async fn a_conversation_pruned_and_created_again_elsewhere_up_to_the_remembered_revision_shows_its_new_transcript(
) {
    let (_dir, path) = temp_db();
    let here: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).await.expect("open"));
    let elsewhere = SqliteStore::open(&path).await.expect("open another");
    let id = ConversationId::new();
    ask(&here, id, "old question", "old answer").await;
    let memory = here.claim_memory().expect("a SQLite store remembers");
    assert!(memory.remembers(id));
    let remembered = here.admission(id).await.expect("admission").revision;

    // Another process prunes it whole and creates it again under its id,
    // then runs it up to the revision this store remembers.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let prune = PruneOptions {
        include_transcripts: true,
        conversations_older_than: Some(Duration::ZERO),
        ..PruneOptions::older_than(Duration::ZERO)
    };
    let report = elsewhere.prune(&prune).await.expect("prune");
    assert_eq!(report.deleted.conversations, 1);
    elsewhere
        .ensure_conversation(&ns(), id)
        .await
        .expect("created again");
    complete_request(&elsewhere, id, "new question", 0, "new answer")
        .await
        .expect("a request elsewhere");
    assert_eq!(
        elsewhere.admission(id).await.expect("admission").revision,
        remembered,
        "the revision this store remembers, in another conversation"
    );
    assert!(memory.remembers(id), "this store did not see the prune");

    let shown = ask(&here, id, "after", "answer").await;
    assert_eq!(
        shown,
        [
            Message::user("new question"),
            Message::assistant("new answer"),
            Message::user("after")
        ]
    );
}
