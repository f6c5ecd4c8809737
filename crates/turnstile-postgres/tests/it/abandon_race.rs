//! An abandon that waits for the owner's step in progress (it holds the
//! admission's row lock) takes that step's messages with it: they were
//! committed after the abandon's statement began, and the move runs in a
//! statement of its own, after the release got the lock.

use std::time::Duration;

use turnstile::{Message, PostgresStore, Store};
use turnstile_conformance::support::{admit, complete_request, new_conversation};
use turnstile_testkit::postgres::durability::inspect_pool;
use turnstile_testkit::postgres::{database_url, fresh_options};

#[tokio::test]
async fn an_abandon_that_waited_for_a_turn_write_moves_its_messages_too() {
    let options = fresh_options();
    let schema = options.schema.clone().expect("schema");
    let store = PostgresStore::connect_with(options).await.expect("connect");
    let conversation = new_conversation(&store).await.expect("conversation");
    complete_request(&store, conversation, "first", 0, "first answer")
        .await
        .expect("a committed request");
    let fence = admit(&store, conversation, "held").await.expect("admitted");

    // The owner's step in progress, as a turn write does it: the admission
    // locked, a message appended after the held request's input.
    let owner = inspect_pool(database_url(), &schema);
    let mut step = owner.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM admissions WHERE conversation_id = $1 FOR UPDATE")
        .bind(conversation.as_uuid())
        .execute(&mut *step)
        .await
        .expect("lock the admission");
    sqlx::query(
        "INSERT INTO transcript (conversation_id, seq, request_id, role, content)
         SELECT $1, transcript_length + 1, $2, 'assistant', 'thinking' FROM conversations
         WHERE conversation_id = $1",
    )
    .bind(conversation.as_uuid())
    .bind(fence.request_id.as_uuid())
    .execute(&mut *step)
    .await
    .expect("the step's message");

    let abandoning = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .abandon(conversation, fence.request_id, fence.revision)
                .await
        })
    };
    // The abandon is waiting for the lock when the step commits.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!abandoning.is_finished());
    step.commit().await.expect("the step commits");
    abandoning
        .await
        .expect("the abandon's task")
        .expect("abandoned");

    let kept = store
        .request_messages(fence.request_id, u64::MAX)
        .await
        .expect("kept messages");
    assert_eq!(
        kept,
        [Message::user("held"), Message::assistant("thinking")]
    );
    let (_, next) = complete_request(&store, conversation, "third", 0, "third answer")
        .await
        .expect("the next request commits after the committed entries");
    assert_eq!((next.first_seq, next.end_seq), (2, 4));
    owner.close().await;
    store.close().await;
}
