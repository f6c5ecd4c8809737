//! `ls --stuck` lists held admissions oldest activity first, and admissions
//! whose activity fell in the same millisecond by conversation id, so a
//! listing and its pages have one order. The activity times are set by a
//! connection of the test's own: through the store, two writes rarely
//! share a millisecond on purpose.

use std::time::Duration;

use sqlx::{Connection, SqliteConnection};
use turnstile_conformance::support::{admit, new_conversation, TestResult};
use turnstile_core::admin::{ListFilter, StoreAdmin};
use turnstile_core::{ConversationId, Error, Store};
use turnstile_sqlite::SqliteStore;

const HELD: usize = 6;

async fn stuck_ids(store: &SqliteStore, limit: u32) -> Result<Vec<ConversationId>, Error> {
    let filter = ListFilter {
        stuck_only: true,
        stale_after: Duration::from_secs(300),
        limit,
        ..ListFilter::default()
    };
    let listed = store.list_conversations(&filter).await?.conversations;
    Ok(listed.into_iter().map(|c| c.id).collect())
}

#[tokio::test]
async fn stuck_admissions_are_oldest_first_and_ties_go_by_conversation_id() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("stuck.db");
    let store = SqliteStore::open(&path).await?;
    let mut by_id = Vec::new();
    for i in 0..HELD {
        let id = new_conversation(&store).await?;
        let fence = admit(&store, id, &format!("request {i}")).await?;
        // A failed owner is stuck at once, whatever `stale_after` says.
        store.fail_run(&fence, "model unavailable", None).await?;
        by_id.push(id);
    }
    by_id.sort_by_key(|id| *id.as_uuid().as_bytes());
    let mut conn = SqliteConnection::connect(&format!("sqlite:{}", path.display())).await?;

    // All in one millisecond: by conversation id, and the limit takes the
    // first of that order.
    sqlx::query("UPDATE admissions SET updated_at = 1000 WHERE active_request_id IS NOT NULL")
        .execute(&mut conn)
        .await?;
    assert_eq!(stuck_ids(&store, 100).await?, by_id);
    assert_eq!(stuck_ids(&store, 2).await?, by_id[..2]);

    // Distinct times: oldest first, whatever the ids.
    let oldest_first: Vec<ConversationId> = by_id.iter().rev().copied().collect();
    for (age, id) in oldest_first.iter().enumerate() {
        sqlx::query("UPDATE admissions SET updated_at = ?1 WHERE conversation_id = ?2")
            .bind(1000 + age as i64)
            .bind(id.as_uuid())
            .execute(&mut conn)
            .await?;
    }
    assert_eq!(stuck_ids(&store, 100).await?, oldest_first);
    Ok(())
}
