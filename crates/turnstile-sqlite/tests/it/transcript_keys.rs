//! The transcript names its conversation by an integer key (migration
//! 0017), and new databases get 8 KiB pages: a new conversation never finds
//! rows of another, whether that one was deleted through the store (its
//! key may be given again, its rows went with it) or behind the store's
//! back (its rows stay, and no new key reaches them), and every way a
//! database comes to be has the page size it should.

use std::path::Path;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection};
use turnstile_conformance::support::{complete_request, new_conversation, ns};
use turnstile_core::admin::StoreAdmin;
use turnstile_core::{ConversationId, Store};
use turnstile_sqlite::{SqliteOptions, SqliteStore};

async fn scalar(path: &Path, sql: &str) -> i64 {
    let mut conn = SqliteConnectOptions::new()
        .filename(path)
        .connect()
        .await
        .expect("raw connection");
    let value = sqlx::query_scalar(sql)
        .fetch_one(&mut conn)
        .await
        .expect("query");
    conn.close().await.expect("close");
    value
}

async fn key_of(path: &Path, id: ConversationId) -> i64 {
    scalar(
        path,
        &format!(
            "SELECT key FROM conversations WHERE id = x'{}'",
            id.as_uuid().simple()
        ),
    )
    .await
}

#[tokio::test]
async fn a_key_given_again_after_its_conversation_was_deleted_finds_none_of_its_rows() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("keys.db");
    let store = SqliteStore::open(&path).await.expect("open");
    let kept = new_conversation(&store).await.expect("conversation");
    complete_request(&store, kept, "kept question", 0, "kept answer")
        .await
        .expect("request");
    let newest = new_conversation(&store).await.expect("conversation");
    complete_request(&store, newest, "deleted question", 1, "deleted answer")
        .await
        .expect("request");
    let deleted_key = key_of(&path, newest).await;
    assert_eq!(deleted_key, key_of(&path, kept).await + 1);
    let report = store
        .delete_conversation(&ns(), newest, 1, None)
        .await
        .expect("delete");
    assert_eq!(report.deleted.transcript, 4);

    // The next conversation takes the largest key plus one: the deleted one's.
    let next = new_conversation(&store).await.expect("conversation");
    assert_eq!(key_of(&path, next).await, deleted_key);
    assert_eq!(store.transcript_window(next, 100).await.expect("read"), []);
    let (_, outcome) = complete_request(&store, next, "new question", 0, "new answer")
        .await
        .expect("request");
    let window = store.transcript_window(next, 100).await.expect("read");
    let seqs: Vec<u64> = window.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [0, 1]);
    assert_eq!(outcome.conversation_version, 1);
    assert_eq!(
        store
            .transcript_window(kept, 100)
            .await
            .expect("read")
            .len(),
        2
    );
    assert_eq!(scalar(&path, "SELECT COUNT(*) FROM transcript").await, 4);
}

#[tokio::test]
async fn a_conversation_removed_behind_the_stores_back_leaves_its_rows_to_nobody() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("orphans.db");
    let store = SqliteStore::open(&path).await.expect("open");
    let removed = new_conversation(&store).await.expect("conversation");
    complete_request(&store, removed, "orphaned question", 0, "orphaned answer")
        .await
        .expect("request");
    let removed_key = key_of(&path, removed).await;
    // A shell with foreign keys off (sqlite3's default): no cascade.
    let mut shell = SqliteConnectOptions::new()
        .filename(&path)
        .foreign_keys(false)
        .connect()
        .await
        .expect("raw connection");
    sqlx::query("DELETE FROM conversations WHERE id = ?1")
        .bind(removed.as_uuid())
        .execute(&mut shell)
        .await
        .expect("delete");
    shell.close().await.expect("close");
    assert_eq!(scalar(&path, "SELECT COUNT(*) FROM transcript").await, 2);

    let next = new_conversation(&store).await.expect("conversation");
    assert!(key_of(&path, next).await > removed_key);
    assert_eq!(store.transcript_window(next, 100).await.expect("read"), []);
    complete_request(&store, next, "new question", 0, "new answer")
        .await
        .expect("request");
    let seqs: Vec<u64> = store
        .transcript_window(next, 100)
        .await
        .expect("read")
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs, [0, 1]);
}

#[tokio::test]
async fn new_databases_get_8_kib_pages_and_an_existing_one_keeps_its_own() {
    let dir = tempfile::tempdir().expect("temp dir");
    // A new file copied from the template, and one migrated under a quota.
    let copied = dir.path().join("copied.db");
    SqliteStore::open(&copied)
        .await
        .expect("open")
        .close()
        .await
        .expect("close");
    let migrated = dir.path().join("migrated.db");
    let options = SqliteOptions {
        max_database_bytes: Some(4 << 20),
        ..SqliteOptions::default()
    };
    let store = SqliteStore::open_with(&migrated, options)
        .await
        .expect("open");
    // A new file under a quota is migrated (not copied), at 8 KiB too.
    assert_eq!(scalar(&migrated, "PRAGMA page_size").await, 8192);
    store.close().await.expect("close");
    assert_eq!(scalar(&copied, "PRAGMA page_size").await, 8192);

    // An existing 4 KiB database, migrated in place, keeps its pages.
    let old = dir.path().join("old.db");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schema4.db"),
        &old,
    )
    .expect("copy fixture");
    assert_eq!(scalar(&old, "PRAGMA page_size").await, 4096);
    let store = SqliteStore::open(&old).await.expect("open");
    let id = ConversationId::new();
    store
        .ensure_conversation(&ns(), id)
        .await
        .expect("conversation");
    store.close().await.expect("close");
    assert_eq!(scalar(&old, "PRAGMA page_size").await, 4096);

    // In memory, as the store reports it.
    let memory = SqliteStore::in_memory().await.expect("in memory");
    let report = memory.storage().await.expect("storage");
    assert_eq!(report.details["page_size"], 8192);
}
