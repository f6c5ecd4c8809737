//! `ls --stuck` lists held admissions oldest activity first, and those
//! whose activity fell in the same millisecond by conversation id, so a
//! listing and its pages have one order on every backend.
//!
//! Not part of [`suite!`](crate::suite): through the store two writes
//! rarely share a millisecond, so each backend's own test sets the
//! activity times with a connection of its own and calls this case with
//! that setter.

use std::future::Future;
use std::time::Duration;

use turnstile_core::admin::ListFilter;
use turnstile_core::{ConversationId, Error, StoreAdmin};

use crate::admin::conversation_ids;
use crate::support::{admit, new_conversation, TestResult};

const HELD: usize = 6;

async fn stuck(store: &dyn StoreAdmin, limit: u32) -> Result<Vec<ConversationId>, Error> {
    let filter = ListFilter {
        stuck_only: true,
        stale_after: Duration::from_secs(300),
        limit,
        ..ListFilter::default()
    };
    conversation_ids(store, filter).await
}

/// `set_activity(conversation, ms)` sets the held admission's activity
/// time (`updated_at`, milliseconds since the epoch) directly.
pub async fn stuck_admissions_are_oldest_first_and_ties_go_by_conversation_id<F, Fut>(
    store: &dyn StoreAdmin,
    mut set_activity: F,
) -> TestResult
where
    F: FnMut(ConversationId, i64) -> Fut,
    Fut: Future<Output = TestResult>,
{
    let mut by_id = Vec::new();
    for i in 0..HELD {
        let id = new_conversation(store).await?;
        let fence = admit(store, id, &format!("request {i}")).await?;
        // A failed owner is stuck at once, whatever `stale_after` says.
        store.fail_run(&fence, "model unavailable", None).await?;
        by_id.push(id);
    }
    by_id.sort_by_key(|id| *id.as_uuid().as_bytes());

    // All in one millisecond: by conversation id, and the limit takes the
    // first of that order.
    for id in &by_id {
        set_activity(*id, 1_000).await?;
    }
    assert_eq!(stuck(store, 100).await?, by_id);
    assert_eq!(stuck(store, 2).await?, by_id[..2]);

    // Distinct times: oldest first, whatever the ids.
    let oldest_first: Vec<ConversationId> = by_id.iter().rev().copied().collect();
    for (age, id) in (1_000..).zip(&oldest_first) {
        set_activity(*id, age).await?;
    }
    assert_eq!(stuck(store, 100).await?, oldest_first);
    Ok(())
}
