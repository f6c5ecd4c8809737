//! The held admission's activity time (`updated_at`: what `ls --stuck` and
//! `doctor` age a held admission by) moves with the owner's durable steps, a
//! tool result included: a turn whose tools run long is not taken for stuck
//! while their results keep arriving.

use std::time::Duration;

use turnstile::store::ToolResult;
use turnstile::{CheckpointPhase, ConversationId, Message, SqliteStore, Store};

use super::support::{admit, checkpoint, new_conversation, tool_call, TestResult};

async fn activity(store: &SqliteStore, conversation: ConversationId) -> i64 {
    store
        .conversation_summary(conversation, Duration::from_secs(300))
        .await
        .unwrap()
        .expect("conversation")
        .held
        .expect("held admission")
        .updated_at
}

#[tokio::test]
async fn a_tool_result_refreshes_the_held_admissions_activity_time() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = SqliteStore::open(dir.path().join("activity.db")).await?;
    let conversation = new_conversation(&store).await?;
    let fence = admit(&store, conversation, "look it up").await?;
    let answered = checkpoint(fence.run_id, 1, CheckpointPhase::ToolsInFlight, 1);
    let assistant = Message::Assistant {
        content: String::new(),
        tool_calls: vec![tool_call("call-1", "{}")],
    };
    store
        .record_model_response(&fence, &answered, &assistant)
        .await?;
    let after_answer = activity(&store, conversation).await;

    // Times are milliseconds: let the clock move past the answer's.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let result = ToolResult {
        content: "42".into(),
        is_error: false,
    };
    store
        .record_tool_result(&fence, 1, "call-1", &result)
        .await?;
    let after_result = activity(&store, conversation).await;
    assert!(
        after_result > after_answer,
        "the tool result did not move the activity time ({after_answer} -> {after_result})"
    );
    Ok(())
}
