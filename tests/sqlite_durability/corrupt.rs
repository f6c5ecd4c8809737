//! Rows the store cannot decode are reported as `Error::Corrupt` naming
//! their table, never a panic and never a half-decoded value.

use std::path::Path;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, SqliteConnection};
use tempfile::TempDir;
use turnstile::store::Fence;
use turnstile::{Error, Revision, SqliteStore, Store};

use crate::support::{
    admit, complete_request, new_conversation, new_request, ns, tool_call, tool_turn, TestResult,
};

/// A file store with a committed request (one tool turn) in one
/// conversation, a request in flight (one tool turn) in another, and a
/// plain connection to damage its rows with.
struct Fixture {
    store: SqliteStore,
    raw: SqliteConnection,
    done: Fence,
    open: Fence,
    _dir: TempDir,
}

impl Fixture {
    async fn new() -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("corrupt.db");
        let store = SqliteStore::open(&path).await?;
        let conversation = new_conversation(&store).await?;
        let (done, _) = complete_request(&store, conversation, "question", 1, "answer").await?;
        let other = new_conversation(&store).await?;
        let open = admit(&store, other, "in flight").await?;
        tool_turn(&store, &open, 1, 1, tool_call("c1", "{}"), "result").await?;
        let raw = raw_connection(&path).await?;
        Ok(Fixture {
            store,
            raw,
            done,
            open,
            _dir: dir,
        })
    }

    /// Runs damaging SQL; `?1` is bound to `value`.
    async fn damage(&mut self, sql: &str, value: &str) -> TestResult {
        let done = sqlx::query(sql).bind(value).execute(&mut self.raw).await?;
        assert!(done.rows_affected() > 0, "{sql} changed no row");
        Ok(())
    }
}

/// A connection that may also write values the schema's CHECKs refuse.
async fn raw_connection(path: &Path) -> Result<SqliteConnection, sqlx::Error> {
    SqliteConnectOptions::new()
        .filename(path)
        .pragma("ignore_check_constraints", "ON")
        .connect()
        .await
}

/// Asserts a `Corrupt` error for `table`; returns its key.
fn corrupt<T: std::fmt::Debug>(result: Result<T, Error>, table: &str) -> String {
    match result {
        Err(Error::Corrupt {
            table: found, key, ..
        }) if found == table => key,
        other => panic!("expected Corrupt in {table}, got {other:?}"),
    }
}

#[tokio::test]
async fn undecodable_transcript_message_is_corrupt() -> TestResult {
    let bad_messages = [
        "{not json",
        r#"{"role":"wizard","content":"x"}"#,
        r#"{"role":"user"}"#,
        "null",
        "",
    ];
    for bad in bad_messages {
        let mut f = Fixture::new().await?;
        f.damage("UPDATE transcript SET message = ?1 WHERE seq = 1", bad)
            .await?;
        let conversation = f.done.conversation_id;
        let key = corrupt(
            f.store.transcript_window(conversation, 100).await,
            "transcript",
        );
        assert_eq!(key, format!("{conversation}/1"), "message {bad:?}");
        corrupt(
            f.store.transcript_range(conversation, 0, 10).await,
            "transcript",
        );
        // Rows around it still read.
        assert_eq!(
            f.store.transcript_range(conversation, 2, 10).await?.len(),
            2
        );
    }
    Ok(())
}

#[tokio::test]
async fn transcript_row_with_a_malformed_request_id_is_corrupt() -> TestResult {
    let mut f = Fixture::new().await?;
    f.damage(
        "UPDATE transcript SET request_id = CAST(?1 AS BLOB) WHERE seq = 0",
        "short",
    )
    .await?;
    corrupt(
        f.store.transcript_window(f.done.conversation_id, 100).await,
        "transcript",
    );
    Ok(())
}

#[tokio::test]
async fn undecodable_checkpoint_is_corrupt() -> TestResult {
    let damage = [
        "UPDATE loop_checkpoints SET verification_reports = ?1 WHERE turn = 1",
        "UPDATE loop_checkpoints SET phase = ?1 WHERE turn = 1",
        "UPDATE loop_checkpoints SET message_count = -1 WHERE turn = 1 AND ?1 = ?1",
        "UPDATE loop_checkpoints SET input_tokens = -5 WHERE turn = 1 AND ?1 = ?1",
    ];
    for sql in damage {
        let mut f = Fixture::new().await?;
        let value = if sql.contains("phase") {
            "sideways"
        } else {
            r#"[{"turn":1,"passed":"#
        };
        f.damage(sql, value).await?;
        for run in [f.open.run_id, f.done.run_id] {
            let key = corrupt(f.store.checkpoints(run).await, "loop_checkpoints");
            assert_eq!(key, format!("{run}/1"), "{sql}");
        }
        corrupt(
            f.store.latest_checkpoint(f.open.run_id).await,
            "loop_checkpoints",
        );
    }
    Ok(())
}

#[tokio::test]
async fn undecodable_request_outcome_is_corrupt_on_read_and_on_claim() -> TestResult {
    for bad in [r#"{"run_id": 5"#, r#"{"final_text":"x"}"#, "[]"] {
        let mut f = Fixture::new().await?;
        f.damage(
            "UPDATE requests SET outcome = ?1 WHERE status = 'completed'",
            bad,
        )
        .await?;
        let request = f.done.request_id;
        let key = corrupt(f.store.request(request).await, "requests");
        assert_eq!(key, request.to_string());

        // A retry of the same request id meets the corrupt row: an error,
        // and nothing written.
        let conversation = f.done.conversation_id;
        let revision = f.store.admission(conversation).await?.revision;
        let retry = turnstile::store::NewRequest {
            request_id: request,
            ..new_request(conversation, revision, "question")
        };
        corrupt(f.store.claim(&retry).await, "requests");
        assert_eq!(f.store.admission(conversation).await?.revision, revision);
        assert_eq!(f.store.run(retry.run_id).await?, None);
    }
    Ok(())
}

#[tokio::test]
async fn request_row_with_unknown_status_or_missing_outcome_is_corrupt() -> TestResult {
    let mut f = Fixture::new().await?;
    f.damage(
        "UPDATE requests SET outcome = NULL WHERE status = ?1",
        "completed",
    )
    .await?;
    corrupt(f.store.request(f.done.request_id).await, "requests");

    let mut f = Fixture::new().await?;
    f.damage("UPDATE requests SET status = ?1", "zombie")
        .await?;
    corrupt(f.store.request(f.open.request_id).await, "requests");
    Ok(())
}

#[tokio::test]
async fn undecodable_or_missing_pending_message_is_corrupt() -> TestResult {
    let mut f = Fixture::new().await?;
    f.damage(
        "UPDATE run_messages SET message = ?1 WHERE seq = 1",
        r#"{"role":"wizard","content":"x"}"#,
    )
    .await?;
    let request = f.open.request_id;
    let key = corrupt(f.store.request_messages(request, 10).await, "run_messages");
    assert_eq!(key, format!("{request}/1"));
    // Reading only before the damaged row still works.
    assert_eq!(f.store.request_messages(request, 1).await?.len(), 1);

    // A hole in the pending sequence is never papered over.
    let mut f = Fixture::new().await?;
    f.damage(
        "DELETE FROM run_messages WHERE seq = CAST(?1 AS INTEGER)",
        "1",
    )
    .await?;
    corrupt(
        f.store.request_messages(f.open.request_id, 10).await,
        "run_messages",
    );
    Ok(())
}

#[tokio::test]
async fn out_of_range_counters_malformed_ids_and_unknown_states_are_corrupt() -> TestResult {
    let mut f = Fixture::new().await?;
    f.damage("UPDATE conversations SET version = -1 WHERE ?1 = ?1", "")
        .await?;
    let conversation = f.done.conversation_id;
    corrupt(
        f.store.conversation(&ns(), conversation).await,
        "conversations",
    );

    let mut f = Fixture::new().await?;
    f.damage("UPDATE admissions SET revision = -1 WHERE ?1 = ?1", "")
        .await?;
    let conversation = f.done.conversation_id;
    corrupt(f.store.admission(conversation).await, "admissions");
    // A claim meeting it fails the same way, and writes nothing.
    let claim = new_request(conversation, Revision(2), "next");
    corrupt(f.store.claim(&claim).await, "admissions");
    assert_eq!(f.store.request(claim.request_id).await?, None);

    let mut f = Fixture::new().await?;
    f.damage(
        "UPDATE admissions SET run_id = CAST(?1 AS BLOB) WHERE run_id IS NOT NULL",
        "not a uuid",
    )
    .await?;
    corrupt(
        f.store.admission(f.open.conversation_id).await,
        "admissions",
    );

    let mut f = Fixture::new().await?;
    f.damage("UPDATE runs SET status = ?1", "sleepwalking")
        .await?;
    corrupt(f.store.run(f.open.run_id).await, "runs");

    let mut f = Fixture::new().await?;
    f.damage("UPDATE tool_calls SET status = ?1", "exploded")
        .await?;
    corrupt(f.store.journal(f.open.request_id, 1).await, "tool_calls");

    let mut f = Fixture::new().await?;
    f.damage(
        "UPDATE tool_calls SET result = NULL WHERE status = ?1",
        "completed",
    )
    .await?;
    corrupt(f.store.journal(f.open.request_id, 1).await, "tool_calls");
    Ok(())
}
