//! Several openers of one new database file at once (an app and the CLI
//! started together, or two `turnstile run`s on a new `--db`): every open
//! succeeds and the schema is applied once.

use turnstile::{ConversationId, Namespace, SqliteStore, Store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_opens_of_a_new_file_all_succeed() {
    for round in 0..10 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.db");
        let opens: Vec<_> = (0..4)
            .map(|_| {
                let path = path.clone();
                tokio::spawn(async move { SqliteStore::open(&path).await })
            })
            .collect();
        let mut stores = Vec::new();
        for open in opens {
            let store = open
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
            stores.push(store);
        }
        // Every store works on the one schema.
        let namespace = Namespace::new("open").unwrap();
        let id = ConversationId::new();
        for store in &stores {
            store.ensure_conversation(&namespace, id).await.unwrap();
        }
        assert_eq!(stores[3].admission(id).await.unwrap().revision.0, 0);
    }
}
