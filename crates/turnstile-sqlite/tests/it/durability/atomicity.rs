//! A commit is one transaction: a failure at any statement leaves nothing.

use turnstile::store::RequestStatus;
use turnstile::{Error, Message, SqliteStore, Store};

use super::raw_pool;
use turnstile_conformance::support::{
    admit, commit_answer, complete_request, new_conversation, tool_call, tool_turn, Snapshot,
    TestResult,
};

#[tokio::test]
async fn commit_failing_at_the_transcript_insert_changes_nothing_and_can_be_retried() -> TestResult
{
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("atomicity.db");
    let store = SqliteStore::open(&path).await?;
    let conversation = new_conversation(&store).await?;
    // One committed request already, so "as before" is not just "empty".
    let (earlier, _) = complete_request(&store, conversation, "earlier", 1, "done").await?;
    let fence = admit(&store, conversation, "question").await?;
    let count = tool_turn(&store, &fence, 1, 1, tool_call("c1", "{}"), "tool says").await?;

    let requests = [earlier.request_id, fence.request_id];
    let runs = [earlier.run_id, fence.run_id];
    let before = Snapshot::take(&store, conversation, &requests, &runs, 2).await?;

    let raw = raw_pool(&path).await?;
    sqlx::query(
        "CREATE TRIGGER fail_transcript BEFORE INSERT ON transcript \
         BEGIN SELECT RAISE(ABORT, 'injected'); END",
    )
    .execute(&raw)
    .await?;

    let failed = commit_answer(&store, &fence, 2, count, "answer").await;
    match &failed {
        Err(e @ Error::Store(_)) => assert!(e.to_string().contains("injected"), "{e}"),
        other => panic!("expected a store error from the trigger, got {other:?}"),
    }
    let after = Snapshot::take(&store, conversation, &requests, &runs, 2).await?;
    assert_eq!(after, before);
    // Spelled out: the statements before the failing insert were undone too.
    let admission = &after.admission;
    assert_eq!(admission.revision, fence.revision);
    assert_eq!(
        admission.active.as_ref().map(|a| a.request_id),
        Some(fence.request_id)
    );
    assert_eq!(after.conversation.version, 1);
    let request = after.requests[1].as_ref().expect("request");
    assert_eq!(
        (request.status, &request.outcome),
        (RequestStatus::Active, &None)
    );
    assert_eq!(
        after.pending[1].len() as u64,
        count,
        "final message not kept"
    );

    sqlx::query("DROP TRIGGER fail_transcript")
        .execute(&raw)
        .await?;
    raw.close().await;
    let outcome = commit_answer(&store, &fence, 2, count, "answer").await?;
    assert_eq!(outcome.conversation_version, 2);
    let transcript = store.transcript_window(conversation, u32::MAX).await?;
    assert_eq!(transcript.len() as u64, outcome.end_seq);
    assert_eq!(
        transcript.last().map(|e| &e.message),
        Some(&Message::assistant("answer"))
    );
    let admission = store.admission(conversation).await?;
    assert_eq!(admission.active, None);
    assert_eq!(admission.revision.0, fence.revision.0 + 1);
    Ok(())
}
