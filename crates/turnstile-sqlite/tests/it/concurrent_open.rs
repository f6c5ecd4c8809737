//! Several openers of one new database file at once (an app and the CLI
//! started together, or two `turnstile run`s on a new `--db`): every open
//! succeeds and the schema is applied once; whether the file is a copy of
//! this process's template, or migrated by the openers (under a quota),
//! or both at once.

use turnstile::{ConversationId, Namespace, SqliteOptions, SqliteStore, Store};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_opens_of_a_new_file_all_succeed() {
    concurrent_opens(|_| None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_opens_that_migrate_a_new_file_all_succeed() {
    concurrent_opens(|_| Some(1 << 30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_opens_that_copy_and_migrate_a_new_file_all_succeed() {
    concurrent_opens(|opener| (opener == 0).then_some(1 << 30)).await;
}

/// Four openers at once of a new file, opener `n` with the quota
/// `quota(n)` (a quota makes it migrate instead of copying), ten times.
async fn concurrent_opens(quota: impl Fn(usize) -> Option<u64>) {
    for round in 0..10 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("new.db");
        let opens: Vec<_> = (0..4)
            .map(|opener| {
                let path = path.clone();
                let options = SqliteOptions {
                    max_database_bytes: quota(opener),
                    ..SqliteOptions::default()
                };
                tokio::spawn(async move { SqliteStore::open_with(&path, options).await })
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
