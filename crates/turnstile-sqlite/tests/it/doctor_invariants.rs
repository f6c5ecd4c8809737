//! `doctor` counts the rows that break the store's invariants, beside
//! SQLite's own integrity check: each kind of damage, made behind the
//! store's back in a file whose pages are all sound, is named with its
//! count, and a sound store reports none.

use std::path::Path;
use std::time::Duration;

use sqlx::{Connection, SqliteConnection};
use turnstile::SqliteStore;
use turnstile_conformance::support::{
    admit, complete_request, new_conversation, tool_call, tool_turn,
};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// A file with a conversation of two committed requests and one holding a
/// request after a tool turn.
async fn sound_store(path: &Path) -> TestResult {
    let store = SqliteStore::open(path).await?;
    let done = new_conversation(&store).await?;
    complete_request(&store, done, "first", 1, "first answer").await?;
    complete_request(&store, done, "second", 0, "second answer").await?;
    let held = new_conversation(&store).await?;
    let fence = admit(&store, held, "held").await?;
    tool_turn(&store, &fence, 1, 1, tool_call("c1", "{}"), "r").await?;
    store.close().await?;
    Ok(())
}

async fn integrity(path: &Path) -> Result<(Option<bool>, Vec<String>), turnstile::Error> {
    let report = SqliteStore::doctor(path, Duration::from_secs(60)).await?;
    assert!(report.not_checked.is_empty(), "{:?}", report.not_checked);
    Ok((report.integrity_ok, report.integrity))
}

#[tokio::test]
async fn doctor_names_each_broken_invariant_with_its_count() -> TestResult {
    let dir = tempfile::tempdir()?;
    let sound = dir.path().join("sound.db");
    sound_store(&sound).await?;
    assert_eq!(
        integrity(&sound).await?,
        (Some(true), vec!["ok".to_owned()])
    );

    let held = "(SELECT conversation_id FROM admissions WHERE active_request_id IS NOT NULL)";
    let damage = [
        (
            format!("UPDATE admissions SET active_request_id = randomblob(16) WHERE conversation_id = {held}"),
            vec![
                "1 held admissions whose request is missing or not active",
                "1 active requests that hold no admission",
                "3 transcript entries after the committed ones that are not the held request's",
            ],
        ),
        (
            "UPDATE requests SET committed_by = randomblob(16) WHERE first_seq = 0".to_owned(),
            vec!["1 completed requests without their committing run"],
        ),
        (
            "DELETE FROM transcript WHERE seq = 1 AND conversation_key =
                 (SELECT key FROM conversations WHERE id <> {held})"
                .replace("{held}", held),
            vec!["1 conversations whose transcript has a gap"],
        ),
    ];
    for (i, (sql, expected)) in damage.into_iter().enumerate() {
        let path = dir.path().join(format!("damaged-{i}.db"));
        std::fs::copy(&sound, &path)?;
        let mut raw = SqliteConnection::connect(&format!("sqlite:{}", path.display())).await?;
        let changed = sqlx::query(&sql).execute(&mut raw).await?.rows_affected();
        assert_eq!(changed, 1, "{sql}");
        raw.close().await?;
        assert_eq!(
            integrity(&path).await?,
            (
                Some(false),
                expected.iter().map(|s| s.to_string()).collect()
            ),
            "{sql}"
        );
    }
    Ok(())
}
