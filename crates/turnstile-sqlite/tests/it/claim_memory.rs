//! What a store remembers of a conversation after a commit is checked by
//! the claim itself, with two stores on one file as two processes would
//! open it (`turnstile_conformance::claim_memory`).

use std::sync::Arc;

use turnstile_conformance::claim_memory;
use turnstile_conformance::support::TestResult;
use turnstile_sqlite::SqliteStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_pruned_and_created_again_elsewhere_up_to_the_remembered_revision_shows_its_new_transcript(
) -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("two-stores.db");
    let here = Arc::new(SqliteStore::open(&path).await?);
    let elsewhere = Arc::new(SqliteStore::open(&path).await?);
    claim_memory::a_conversation_pruned_and_created_again_elsewhere_up_to_the_remembered_revision_shows_its_new_transcript(here, elsewhere).await
}
