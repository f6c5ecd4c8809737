//! A new database file is never built on a log left beside its path by a
//! database that was there: SQLite deletes such a `-wal` for an empty
//! file, and would replay it into a copy of the template.

use turnstile::{ConversationId, Error, Namespace, SqliteStore, Store};

#[tokio::test]
async fn a_write_ahead_log_left_beside_a_new_path_is_not_replayed_into_it() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old.db");
    let namespace = Namespace::new("stale").unwrap();
    let kept = ConversationId::new();
    // The old database's last commits are in its log while it is open.
    let store = SqliteStore::open(&old).await.unwrap();
    store.ensure_conversation(&namespace, kept).await.unwrap();
    let fresh = dir.path().join("new.db");
    let log = |path: &std::path::Path| {
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        std::path::PathBuf::from(wal)
    };
    std::fs::copy(log(&old), log(&fresh)).unwrap();
    assert!(std::fs::metadata(log(&fresh)).unwrap().len() > 0);

    let new = SqliteStore::open(&fresh).await.unwrap();
    assert!(
        matches!(
            new.conversation(&namespace, kept).await,
            Err(Error::NotFound { .. })
        ),
        "the old database's commit came back"
    );
    let id = ConversationId::new();
    new.ensure_conversation(&namespace, id).await.unwrap();
    assert_eq!(new.admission(id).await.unwrap().revision.0, 0);
    new.close().await.unwrap();
    store.close().await.unwrap();

    // Reopened, the new database is whole.
    let again = SqliteStore::open(&fresh).await.unwrap();
    again.conversation(&namespace, id).await.unwrap();
}
