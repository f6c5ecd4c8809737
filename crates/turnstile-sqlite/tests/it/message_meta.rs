//! A claim's input and a commit's final answer reach the store as a
//! message's columns (migration 0013): every field of the message, its
//! `meta` included, arrives as sent, through the claim and the commit that
//! run alone. (`group_commit.rs` checks the same through shared statements.)

use turnstile::store::{ClaimOutcome, NewRequest};
use turnstile::{CheckpointPhase, Message, SqliteStore, Store};
use turnstile_conformance::support::{
    checkpoint, new_conversation, new_request, tool_call, TestResult,
};

#[tokio::test]
async fn an_input_and_an_answer_with_meta_arrive_whole() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = SqliteStore::open(dir.path().join("meta.db")).await?;
    let conversation = new_conversation(&store).await?;
    let revision = store.admission(conversation).await?.revision;
    let input = Message::tool("call-0", "a result: \u{0} \\ \" é 😀", true);
    let claim = NewRequest {
        input: input.clone(),
        ..new_request(conversation, revision, "a result")
    };
    let ClaimOutcome::Admitted(fence) = store.claim(&claim).await? else {
        panic!("not admitted");
    };
    assert_eq!(
        store.request_messages(claim.request_id, u64::MAX).await?,
        vec![input.clone()]
    );
    let answer = Message::assistant_with_calls(
        "calling: \u{202e} é",
        vec![tool_call("call-1", r#"{"b": 2, "a": "\u0000"}"#)],
    );
    let last = checkpoint(fence.run_id, 1, CheckpointPhase::Ready, 2);
    let outcome = store.commit(&fence, &last, &answer).await?;
    assert_eq!((outcome.first_seq, outcome.end_seq), (0, 2));
    let transcript = store.transcript_window(conversation, u32::MAX).await?;
    let messages: Vec<&Message> = transcript.iter().map(|e| &e.message).collect();
    assert_eq!(messages, vec![&input, &answer]);
    Ok(())
}
