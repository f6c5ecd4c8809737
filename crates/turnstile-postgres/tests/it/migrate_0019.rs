//! Migration 0019 on a database written before it: a held request's
//! messages, one naming an image, move from `run_messages` to the
//! transcript's tail, the image keeps its one reference, and the request
//! goes on (here: it is abandoned, and its messages stay its own).

use sqlx::PgPool;
use turnstile::{Attachment, Message, Part, PostgresStore, Revision, Store};
use turnstile_conformance::support::{
    admitted, complete_request, new_conversation, new_request, tool_call, tool_turn,
};
use turnstile_testkit::postgres::durability::inspect_pool;
use turnstile_testkit::postgres::{database_url, fresh_options};

/// The database as the build before 0019 left it: the held request's
/// messages back in `run_messages` (with the run and turn it recorded),
/// no transcript length, 0019 not applied.
const UNDO_0019: [&str; 6] = [
    "ALTER TABLE run_messages ADD COLUMN run_id uuid, ADD COLUMN turn bigint",
    "INSERT INTO run_messages (conversation_id, request_id, seq, run_id, turn, role, content, meta)
     SELECT t.conversation_id, t.request_id, t.seq - c.transcript_length, a.run_id, 1, t.role,
         t.content, t.meta
     FROM transcript t
     JOIN conversations c ON c.conversation_id = t.conversation_id
     JOIN admissions a ON a.conversation_id = t.conversation_id
     WHERE t.seq >= c.transcript_length",
    "DELETE FROM transcript t USING conversations c
     WHERE t.conversation_id = c.conversation_id AND t.seq >= c.transcript_length",
    "ALTER TABLE run_messages ALTER COLUMN run_id SET NOT NULL, ALTER COLUMN turn SET NOT NULL",
    "ALTER TABLE conversations DROP COLUMN transcript_length",
    "DELETE FROM _sqlx_migrations WHERE version = 19",
];

#[tokio::test]
async fn a_held_request_with_an_image_moves_to_the_transcript_tail_and_goes_on() {
    let options = fresh_options();
    let schema = options.schema.clone().expect("schema");
    let store = PostgresStore::connect_with(options.clone())
        .await
        .expect("connect");
    let conversation = new_conversation(&store).await.expect("conversation");
    complete_request(&store, conversation, "first", 0, "first answer")
        .await
        .expect("a committed request");
    let photo = Attachment::new("image/png", vec![7; 3000]).expect("an image");
    let mut claim = new_request(conversation, Revision(2), "look");
    claim.input = Message::user_parts(vec![Part::text("look"), Part::Image(photo.clone())]);
    let fence = admitted(&store, &claim).await.expect("admitted");
    tool_turn(&store, &fence, 1, 1, tool_call("c1", "{}"), "r1")
        .await
        .expect("a tool turn");
    let held = store
        .request_messages(fence.request_id, u64::MAX)
        .await
        .expect("held messages");
    assert_eq!(held.len(), 3);
    assert_eq!(held[0], claim.input);
    let committed = store
        .transcript_window(conversation, 100)
        .await
        .expect("transcript");
    store.close().await;

    let pool = inspect_pool(database_url(), &schema);
    for sql in UNDO_0019 {
        sqlx::query(sql).execute(&pool).await.expect(sql);
    }
    assert_eq!(run_messages(&pool).await, 3);

    let store = PostgresStore::connect_with(options)
        .await
        .expect("migrated");
    assert_eq!(
        store
            .request_messages(fence.request_id, u64::MAX)
            .await
            .expect("held messages"),
        held
    );
    assert_eq!(
        store
            .transcript_window(conversation, 100)
            .await
            .expect("transcript"),
        committed
    );
    assert_eq!(run_messages(&pool).await, 0);
    let loaded = store.blob(photo.sha256()).await.expect("blob");
    assert_eq!(loaded.as_deref(), Some(&[7u8; 3000][..]));

    store
        .abandon(conversation, fence.request_id, fence.revision)
        .await
        .expect("abandoned");
    assert_eq!(
        store
            .request_messages(fence.request_id, u64::MAX)
            .await
            .expect("kept messages"),
        held
    );
    assert_eq!(
        store.blob(photo.sha256()).await.expect("blob").as_deref(),
        Some(&[7u8; 3000][..])
    );
    let (_, next) = complete_request(&store, conversation, "third", 0, "third answer")
        .await
        .expect("the next request");
    assert_eq!((next.first_seq, next.end_seq), (2, 4));
    pool.close().await;
    store.close().await;
}

async fn run_messages(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM run_messages")
        .fetch_one(pool)
        .await
        .expect("count")
}
