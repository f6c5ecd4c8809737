//! Rows the store cannot decode are reported as `Error::Corrupt` naming
//! their table, never a panic and never a half-decoded value.

use std::fmt::{Debug, Display};
use std::path::Path;

use sqlx::sqlite::{Sqlite, SqliteConnectOptions};
use sqlx::{ConnectOptions, SqliteConnection};
use tempfile::TempDir;
use turnstile::store::{Fence, NewRequest};
use turnstile::{Error, Revision, SqliteStore, Store};

use turnstile_conformance::support::{
    admit, complete_request, new_conversation, new_request, ns, tool_call, tool_turn, TestResult,
};

/// A file store with a committed request (one tool turn) in one
/// conversation, a request in flight (one tool turn) in another, and a
/// plain connection to damage its rows with.
///
/// The committed request's transcript is `0` its input, `1` an assistant
/// message with one tool call, `2` the tool's result, `3` the answer; its
/// run has checkpoints of turn 1 (`ready`, one report) and turn 2
/// (`completed`, two reports). The request in flight has the same first
/// three messages pending and a `ready` checkpoint of turn 1 (one report).
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
    async fn damage<'q, V>(&mut self, sql: &'q str, value: V) -> TestResult
    where
        V: sqlx::Encode<'q, Sqlite> + sqlx::Type<Sqlite> + Send + 'q,
    {
        let done = sqlx::query(sql).bind(value).execute(&mut self.raw).await?;
        assert!(done.rows_affected() > 0, "{sql} changed no row");
        Ok(())
    }

    /// Runs damaging SQL without parameters.
    async fn exec(&mut self, sql: &str) -> TestResult {
        let done = sqlx::query(sql).execute(&mut self.raw).await?;
        assert!(done.rows_affected() > 0, "{sql} changed no row");
        Ok(())
    }

    /// Asserts the committed request reads as corrupt in `table`, and that a
    /// retry of its request id meets the same error and writes nothing.
    /// Returns the key the read named.
    async fn assert_outcome_corrupt(&self, table: &str, case: &str) -> Result<String, Error> {
        let request = self.done.request_id;
        let key = corrupt(self.store.request(request).await, table, case);
        let conversation = self.done.conversation_id;
        let revision = self.store.admission(conversation).await?.revision;
        let retry = NewRequest {
            request_id: request,
            ..new_request(conversation, revision, "question")
        };
        corrupt(self.store.claim(&retry).await, table, case);
        assert_eq!(
            self.store.admission(conversation).await?.revision,
            revision,
            "{case}"
        );
        assert_eq!(self.store.run(retry.run_id).await?, None, "{case}");
        Ok(key)
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
fn corrupt<T: Debug>(result: Result<T, Error>, table: &str, case: impl Display) -> String {
    match result {
        Err(Error::Corrupt {
            table: found, key, ..
        }) if found == table => key,
        other => panic!("{case}: expected Corrupt in {table}, got {other:?}"),
    }
}

/// Damage to one stored message row: the column set, the row's `seq` and
/// the value (`None` is NULL). Row 1 is an assistant message with a tool
/// call (`meta` holds `tool_calls`), row 2 its tool result (`meta` holds
/// `call_id`).
const BAD_MESSAGES: &[(&str, i64, Option<&str>)] = &[
    // Roles no message has.
    ("role", 1, Some("wizard")),
    ("role", 2, Some("")),
    ("role", 1, Some("Assistant")),
    // `meta` that is not JSON.
    ("meta", 1, Some("{not json")),
    ("meta", 2, Some("")),
    // `meta` that is JSON but not an object.
    ("meta", 1, Some("null")),
    ("meta", 1, Some("[]")),
    ("meta", 2, Some("5")),
    ("meta", 2, Some(r#""call_id""#)),
    // `meta` fields of the wrong type.
    ("meta", 1, Some(r#"{"tool_calls":"many"}"#)),
    (
        "meta",
        1,
        Some(r#"{"tool_calls":[{"id":1,"name":"lookup","arguments":"{}"}]}"#),
    ),
    ("meta", 1, Some(r#"{"tool_calls":[{"id":"c1"}]}"#)),
    ("meta", 2, Some(r#"{"call_id":7}"#)),
    ("meta", 2, Some(r#"{"call_id":"c1","is_error":"yes"}"#)),
    // A tool result answering no call.
    ("meta", 2, None),
    ("meta", 2, Some("{}")),
    // An assistant row read as a tool result: its meta has no `call_id`.
    ("role", 1, Some("tool")),
];

#[tokio::test]
async fn undecodable_transcript_message_is_corrupt() -> TestResult {
    for &(column, seq, value) in BAD_MESSAGES {
        let case = format!("transcript {column} = {value:?} at seq {seq}");
        let mut f = Fixture::new().await?;
        let sql = format!("UPDATE transcript SET {column} = ?1 WHERE seq = {seq}");
        f.damage(&sql, value).await?;
        let conversation = f.done.conversation_id;
        let key = corrupt(
            f.store.transcript_window(conversation, 100).await,
            "transcript",
            &case,
        );
        assert_eq!(key, format!("{conversation}/{seq}"), "{case}");
        let key = corrupt(
            f.store.transcript_range(conversation, 0, 10).await,
            "transcript",
            &case,
        );
        assert_eq!(key, format!("{conversation}/{seq}"), "{case}");
        // Rows around it still read.
        let (before, after) = (seq as u64, seq as u64 + 1);
        assert_eq!(
            f.store
                .transcript_range(conversation, 0, before)
                .await?
                .len() as u64,
            before,
            "{case}"
        );
        assert_eq!(
            f.store
                .transcript_range(conversation, after, 10)
                .await?
                .len() as u64,
            4 - after,
            "{case}"
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
        "short request_id",
    );
    Ok(())
}

#[tokio::test]
async fn undecodable_or_missing_pending_message_is_corrupt() -> TestResult {
    // The held request's messages follow its conversation's committed
    // entries (none: they start at 0).
    for &(column, seq, value) in BAD_MESSAGES {
        let case = format!("pending message {column} = {value:?} at seq {seq}");
        let mut f = Fixture::new().await?;
        let request = f.open.request_id;
        let sql = format!(
            "UPDATE transcript SET {column} = ?1 WHERE request_id = x'{}' AND seq = {seq}",
            request.as_uuid().simple()
        );
        f.damage(&sql, value).await?;
        let key = corrupt(
            f.store.request_messages(request, 10).await,
            "transcript",
            &case,
        );
        assert_eq!(key, format!("{request}/{seq}"), "{case}");
        // Reading only before the damaged row still works.
        let before = f.store.request_messages(request, seq as u64).await?;
        assert_eq!(before.len() as u64, seq as u64, "{case}");
    }

    // A hole in the pending sequence is never papered over.
    let mut f = Fixture::new().await?;
    let request = f.open.request_id;
    f.exec(&format!(
        "DELETE FROM transcript WHERE request_id = x'{}' AND seq = 1",
        request.as_uuid().simple()
    ))
    .await?;
    let key = corrupt(
        f.store.request_messages(request, 10).await,
        "transcript",
        "hole",
    );
    assert_eq!(key, format!("{request}/2"));
    Ok(())
}

#[tokio::test]
async fn undecodable_checkpoint_is_corrupt() -> TestResult {
    // Each damages the turn-1 checkpoint of both runs wherever it is kept: in
    // `loop_checkpoints`, or a folded run's, in its request's row (its
    // latest) or `first_run_checkpoints` (an earlier one).
    let damage = [
        "UPDATE loop_checkpoints SET phase = 'sideways' WHERE turn = 1;
         UPDATE requests SET checkpoint_phase = 'sideways' WHERE turn = 1;
         UPDATE first_run_checkpoints SET phase = 'sideways' WHERE turn = 1",
        "UPDATE loop_checkpoints SET phase = '' WHERE turn = 1;
         UPDATE requests SET checkpoint_phase = '' WHERE turn = 1;
         UPDATE first_run_checkpoints SET phase = '' WHERE turn = 1",
        "UPDATE loop_checkpoints SET phase = 'READY' WHERE turn = 1;
         UPDATE requests SET checkpoint_phase = 'READY' WHERE turn = 1;
         UPDATE first_run_checkpoints SET phase = 'READY' WHERE turn = 1",
        "UPDATE loop_checkpoints SET message_count = -1 WHERE turn = 1;
         UPDATE requests SET message_count = -1 WHERE turn = 1;
         UPDATE first_run_checkpoints SET message_count = -1 WHERE turn = 1",
        "UPDATE loop_checkpoints SET input_tokens = -5 WHERE turn = 1;
         UPDATE requests SET input_tokens = -5 WHERE turn = 1;
         UPDATE first_run_checkpoints SET input_tokens = -5 WHERE turn = 1",
        "UPDATE loop_checkpoints SET output_tokens = -1 WHERE turn = 1;
         UPDATE requests SET output_tokens = -1 WHERE turn = 1;
         UPDATE first_run_checkpoints SET output_tokens = -1 WHERE turn = 1",
        "UPDATE loop_checkpoints SET cache_read_tokens = -1 WHERE turn = 1;
         UPDATE requests SET cache_read_tokens = -1 WHERE turn = 1;
         UPDATE first_run_checkpoints SET cache_read_tokens = -1 WHERE turn = 1",
        "UPDATE loop_checkpoints SET cache_write_tokens = -1 WHERE turn = 1;
         UPDATE requests SET cache_write_tokens = -1 WHERE turn = 1;
         UPDATE first_run_checkpoints SET cache_write_tokens = -1 WHERE turn = 1",
        "UPDATE loop_checkpoints SET tool_calls_count = -1 WHERE turn = 1;
         UPDATE requests SET tool_calls_count = -1 WHERE turn = 1;
         UPDATE first_run_checkpoints SET tool_calls_count = -1 WHERE turn = 1",
        "UPDATE loop_checkpoints SET reports_count = -1 WHERE turn = 1;
         UPDATE requests SET reports_count = -1 WHERE turn = 1;
         UPDATE first_run_checkpoints SET reports_count = -1 WHERE turn = 1",
    ];
    for sql in damage {
        let mut f = Fixture::new().await?;
        f.exec(sql).await?;
        for run in [f.open.run_id, f.done.run_id] {
            let key = corrupt(f.store.checkpoints(run).await, "loop_checkpoints", sql);
            assert_eq!(key, format!("{run}/1"), "{sql}");
        }
        corrupt(
            f.store.latest_checkpoint(f.open.run_id).await,
            "loop_checkpoints",
            sql,
        );
        // The committed run's latest checkpoint (turn 2) is intact.
        let latest = f.store.latest_checkpoint(f.done.run_id).await?;
        assert_eq!(latest.map(|c| c.turn), Some(2), "{sql}");
    }

    // A turn number past u32.
    let mut f = Fixture::new().await?;
    f.exec(
        "UPDATE loop_checkpoints SET turn = 4294967296 WHERE turn = 1;
         UPDATE requests SET turn = 4294967296 WHERE turn = 1;
         UPDATE first_run_checkpoints SET turn = 4294967296 WHERE turn = 1",
    )
    .await?;
    let run = f.open.run_id;
    let key = corrupt(f.store.checkpoints(run).await, "loop_checkpoints", "turn");
    assert_eq!(key, format!("{run}/4294967296"));
    Ok(())
}

#[tokio::test]
async fn missing_or_undecodable_verification_reports_are_corrupt() -> TestResult {
    // Checkpoints counting reports that are not stored: every read of such a
    // checkpoint fails, the outcome of the committed request included.
    let damage = [
        "UPDATE loop_checkpoints SET reports_count = reports_count + 1;
         UPDATE requests SET reports_count = reports_count + 1;
         UPDATE first_run_checkpoints SET reports_count = reports_count + 1",
        "DELETE FROM verification_reports WHERE seq = 0",
    ];
    for sql in damage {
        let mut f = Fixture::new().await?;
        f.exec(sql).await?;
        for fence in [&f.open, &f.done] {
            let (run, request) = (fence.run_id, fence.request_id.to_string());
            let key = corrupt(f.store.checkpoints(run).await, "verification_reports", sql);
            assert_eq!(key, request, "{sql}");
            let key = corrupt(
                f.store.latest_checkpoint(run).await,
                "verification_reports",
                sql,
            );
            assert_eq!(key, request, "{sql}");
        }
        let key = f
            .assert_outcome_corrupt("verification_reports", sql)
            .await?;
        assert_eq!(key, f.done.request_id.to_string(), "{sql}");
    }

    // A report whose turn is out of range.
    for turn in ["-1", "4294967296"] {
        let mut f = Fixture::new().await?;
        f.damage(
            "UPDATE verification_reports SET turn = CAST(?1 AS INTEGER) WHERE seq = 0",
            turn,
        )
        .await?;
        for fence in [&f.open, &f.done] {
            let (run, request) = (fence.run_id, fence.request_id);
            let key = corrupt(f.store.checkpoints(run).await, "verification_reports", turn);
            assert_eq!(key, format!("{request}/0"), "turn {turn}");
        }
        let key = f
            .assert_outcome_corrupt("verification_reports", turn)
            .await?;
        assert_eq!(key, format!("{}/0", f.done.request_id), "turn {turn}");
    }
    Ok(())
}

#[tokio::test]
async fn undecodable_request_outcome_is_corrupt_on_read_and_on_claim() -> TestResult {
    // The outcome's own columns, and the totals it takes from the committed
    // run's `completed` checkpoint.
    let damage = [
        "UPDATE requests SET conversation_version = -1 WHERE status = 'completed'",
        "UPDATE requests SET first_seq = -1 WHERE status = 'completed'",
        "UPDATE requests SET end_seq = -1 WHERE status = 'completed'",
        "UPDATE loop_checkpoints SET turn = -1 WHERE phase = 'completed';
         UPDATE requests SET turn = -1 WHERE phase = 'completed';
         UPDATE first_run_checkpoints SET turn = -1 WHERE phase = 'completed'",
        "UPDATE loop_checkpoints SET turn = 4294967296 WHERE phase = 'completed';
         UPDATE requests SET turn = 4294967296 WHERE phase = 'completed';
         UPDATE first_run_checkpoints SET turn = 4294967296 WHERE phase = 'completed'",
        "UPDATE loop_checkpoints SET input_tokens = -1 WHERE phase = 'completed';
         UPDATE requests SET input_tokens = -1 WHERE phase = 'completed';
         UPDATE first_run_checkpoints SET input_tokens = -1 WHERE phase = 'completed'",
        "UPDATE loop_checkpoints SET cache_write_tokens = -1 WHERE phase = 'completed';
         UPDATE requests SET cache_write_tokens = -1 WHERE phase = 'completed';
         UPDATE first_run_checkpoints SET cache_write_tokens = -1 WHERE phase = 'completed'",
        "UPDATE loop_checkpoints SET tool_calls_count = -1 WHERE phase = 'completed';
         UPDATE requests SET tool_calls_count = -1 WHERE phase = 'completed';
         UPDATE first_run_checkpoints SET tool_calls_count = -1 WHERE phase = 'completed'",
    ];
    for sql in damage {
        let mut f = Fixture::new().await?;
        f.exec(sql).await?;
        let key = f.assert_outcome_corrupt("requests", sql).await?;
        assert_eq!(key, f.done.request_id.to_string(), "{sql}");
    }
    Ok(())
}

#[tokio::test]
async fn request_row_with_unknown_status_or_missing_outcome_is_corrupt() -> TestResult {
    let mut f = Fixture::new().await?;
    f.exec("UPDATE requests SET state = 'zombie'").await?;
    for request in [f.open.request_id, f.done.request_id] {
        let key = corrupt(f.store.request(request).await, "requests", "zombie");
        assert_eq!(key, request.to_string());
    }

    // A completed request missing part of its outcome: one of its columns,
    // or the committed run's `completed` checkpoint. (Its committing run's
    // id cannot go missing: stored only when it is not the request's own,
    // it reads as the request's id otherwise.)
    let damage = [
        "UPDATE requests SET conversation_version = NULL WHERE status = 'completed'",
        "UPDATE requests SET first_seq = NULL WHERE status = 'completed'",
        "UPDATE requests SET end_seq = NULL WHERE status = 'completed'",
        "DELETE FROM loop_checkpoints WHERE phase = 'completed';
         UPDATE requests SET checkpoint_phase = NULL WHERE phase = 'completed'",
        "UPDATE loop_checkpoints SET phase = 'ready' WHERE phase = 'completed';
         UPDATE requests SET checkpoint_phase = 4 WHERE phase = 'completed';
         UPDATE first_run_checkpoints SET phase = 'ready' WHERE phase = 'completed'",
        // Names a run that has no `completed` checkpoint (the other one).
        "UPDATE requests SET committed_by = (
             SELECT r.run_id FROM all_runs r WHERE r.request_id != requests.request_id)
         WHERE status = 'completed'",
        // Names no run at all.
        "UPDATE requests SET committed_by = randomblob(16) WHERE status = 'completed'",
        "UPDATE requests SET committed_by = CAST('short' AS BLOB) WHERE status = 'completed'",
    ];
    for sql in damage {
        let mut f = Fixture::new().await?;
        f.exec(sql).await?;
        let key = f.assert_outcome_corrupt("requests", sql).await?;
        assert_eq!(key, f.done.request_id.to_string(), "{sql}");
    }
    Ok(())
}

#[tokio::test]
async fn out_of_range_counters_malformed_ids_and_unknown_states_are_corrupt() -> TestResult {
    let mut f = Fixture::new().await?;
    f.exec("UPDATE conversations SET version = -1").await?;
    let conversation = f.done.conversation_id;
    corrupt(
        f.store.conversation(&ns(), conversation).await,
        "conversations",
        "version",
    );

    let mut f = Fixture::new().await?;
    f.exec("UPDATE admissions SET revision = -1").await?;
    let conversation = f.done.conversation_id;
    corrupt(
        f.store.admission(conversation).await,
        "admissions",
        "revision",
    );
    // A claim meeting it fails the same way, and writes nothing.
    let claim = new_request(conversation, Revision(2), "next");
    corrupt(f.store.claim(&claim).await, "admissions", "claim");
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
        "run_id",
    );

    let mut f = Fixture::new().await?;
    f.exec(
        "UPDATE runs SET status = 'sleepwalking';
         UPDATE requests SET run_state = 'sleepwalking'",
    )
    .await?;
    corrupt(f.store.run(f.open.run_id).await, "runs", "status");

    let mut f = Fixture::new().await?;
    f.exec("UPDATE tool_calls SET status = 'exploded'").await?;
    corrupt(
        f.store.journal(f.open.request_id, 1).await,
        "tool_calls",
        "status",
    );

    Ok(())
}
