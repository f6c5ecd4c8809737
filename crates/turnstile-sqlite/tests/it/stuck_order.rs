//! The conformance case of `ls --stuck`'s order
//! (`turnstile_conformance::stuck_order`), with activity times set
//! through a connection of the test's own.

use sqlx::SqlitePool;
use turnstile_conformance::stuck_order::stuck_admissions_are_oldest_first_and_ties_go_by_conversation_id;
use turnstile_conformance::support::TestResult;
use turnstile_sqlite::SqliteStore;

#[tokio::test]
async fn stuck_admissions_are_oldest_first_and_ties_go_by_conversation_id_on_sqlite() -> TestResult
{
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("stuck.db");
    let store = SqliteStore::open(&path).await?;
    let pool = SqlitePool::connect(&format!("sqlite:{}", path.display())).await?;
    stuck_admissions_are_oldest_first_and_ties_go_by_conversation_id(&store, |id, ms| {
        let pool = pool.clone();
        async move {
            sqlx::query("UPDATE admissions SET updated_at = ?1 WHERE conversation_id = ?2")
                .bind(ms)
                .bind(id.as_uuid())
                .execute(&pool)
                .await?;
            Ok(())
        }
    })
    .await
}
