//! The store contract on SQLite: in memory and on a WAL file.

use tempfile::TempDir;
use turnstile_sqlite::SqliteStore;

async fn in_memory_store() -> (SqliteStore, ()) {
    let store = SqliteStore::in_memory()
        .await
        .expect("open in-memory store");
    (store, ())
}

async fn file_store() -> (SqliteStore, TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("conformance.db"))
        .await
        .expect("open file store");
    (store, dir)
}

turnstile_conformance::suite!(in_memory, in_memory_store());
turnstile_conformance::suite!(file, file_store());
