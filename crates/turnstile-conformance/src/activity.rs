//! The held admission's activity time (`updated_at`: what `ls --stuck` and
//! `doctor` age a held admission by) moves with each of the owner's durable
//! steps, a tool result included: a turn whose tools run long is not taken
//! for stuck while their results keep arriving.

use std::time::Duration;

use turnstile_core::{CheckpointPhase, ConversationId, Message, StoreAdmin, ToolResult};

use crate::support::{admit, checkpoint, new_conversation, tool_call, TestResult};

/// A store with its operations, as the admin parts of the suite take it.
pub type SharedAdmin = std::sync::Arc<dyn StoreAdmin>;

async fn activity(store: &dyn StoreAdmin, conversation: ConversationId) -> i64 {
    store
        .conversation_summary(conversation, Duration::from_secs(300))
        .await
        .expect("read the conversation")
        .expect("conversation")
        .held
        .expect("held admission")
        .updated_at
}

/// Times are milliseconds: lets the clock move past the last step's.
async fn tick() {
    tokio::time::sleep(Duration::from_millis(20)).await;
}

pub async fn each_owner_step_refreshes_the_held_admissions_activity_time(
    store: SharedAdmin,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let fence = admit(&*store, conversation, "look it up").await?;
    let claimed = activity(&*store, conversation).await;

    tick().await;
    let answered = checkpoint(fence.run_id, 1, CheckpointPhase::ToolsInFlight, 1);
    let assistant = Message::assistant_with_calls("", vec![tool_call("call-1", "{}")]);
    store
        .record_model_response(&fence, &answered, &assistant)
        .await?;
    let after_answer = activity(&*store, conversation).await;
    assert!(
        after_answer > claimed,
        "the model's answer did not move the activity time ({claimed} -> {after_answer})"
    );

    tick().await;
    let result = ToolResult {
        content: "42".into(),
        is_error: false,
    };
    store
        .record_tool_result(&fence, 1, "call-1", &result)
        .await?;
    let after_result = activity(&*store, conversation).await;
    assert!(
        after_result > after_answer,
        "the tool result did not move the activity time ({after_answer} -> {after_result})"
    );
    Ok(())
}
