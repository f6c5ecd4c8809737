//! Storage grows linearly with the conversation: every durable step stores
//! its new rows, never the whole state again.
//!
//! Run with `--nocapture` to see the measured ratios.

use std::path::{Path, PathBuf};

use turnstile::store::{Durability, Fence, SqliteOptions};
use turnstile::{CheckpointPhase, ConversationId, Message, SqliteStore, Store};

use crate::support::{admit, checkpoint, commit_answer, new_conversation, TestResult};
use crate::{checkpoint_truncate, raw_pool};

const STEPS: u32 = 200;
const MESSAGE_BYTES: usize = 500;
/// Message bytes written by `STEPS` steps of two messages.
const MESSAGE_TOTAL: f64 = (STEPS as usize * 2 * MESSAGE_BYTES) as f64;
/// What the issue allows: stored bytes per byte of message text.
const MAX_RATIO: f64 = 1.5;

/// The size of a database after its WAL is folded into the file.
#[derive(Clone, Copy, Debug)]
struct Size {
    /// Database file plus WAL, in bytes.
    file: u64,
    /// Pages in use (the file minus its free list), in bytes.
    used: u64,
}

async fn measure(path: &Path) -> Result<Size, sqlx::Error> {
    let raw = raw_pool(path).await?;
    checkpoint_truncate(&raw).await?;
    let (page_size,): (i64,) = sqlx::query_as("PRAGMA page_size").fetch_one(&raw).await?;
    let (pages,): (i64,) = sqlx::query_as("PRAGMA page_count").fetch_one(&raw).await?;
    let (free,): (i64,) = sqlx::query_as("PRAGMA freelist_count")
        .fetch_one(&raw)
        .await?;
    raw.close().await;
    let len = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    Ok(Size {
        file: len(path) + len(&path.with_extension("db-wal")),
        used: u64::try_from((pages - free) * page_size).expect("page count"),
    })
}

/// Sizes of a database empty, after half its steps and after all of them.
struct Growth {
    empty: Size,
    half: Size,
    full: Size,
}

impl Growth {
    /// Bytes the second half of the steps added over bytes the first half
    /// added: about 1 when each step costs the same, about 3 when each step
    /// rewrites everything before it.
    fn second_half_over_first(&self) -> f64 {
        (self.full.used - self.half.used) as f64 / (self.half.used - self.empty.used) as f64
    }
}

/// A message of exactly `MESSAGE_BYTES` bytes.
fn padded(i: u32, tag: &str) -> String {
    format!("{tag} {i:<width$}", width = MESSAGE_BYTES - tag.len() - 1)
}

/// A store on a fresh file; `synchronous` does not change what is stored.
async fn open(dir: &tempfile::TempDir) -> Result<(SqliteStore, PathBuf), turnstile::Error> {
    let path = dir.path().join("growth.db");
    let options = SqliteOptions {
        durability: Durability::Normal,
        ..SqliteOptions::default()
    };
    Ok((SqliteStore::open_with(&path, options).await?, path))
}

/// Commits `STEPS` requests of a 500-byte input and a 500-byte answer.
async fn committed_requests(store: &SqliteStore, path: &Path) -> Result<Growth, turnstile::Error> {
    let conversation = new_conversation(store).await?;
    let empty = measure(path).await.expect("measure");
    let mut half = empty;
    for i in 1..=STEPS {
        let fence = admit(store, conversation, &padded(i, "user")).await?;
        commit_answer(store, &fence, 1, 1, &padded(i, "answer")).await?;
        if i == STEPS / 2 {
            half = measure(path).await.expect("measure");
        }
    }
    let full = measure(path).await.expect("measure");
    assert_eq!(
        store.transcript_window(conversation, u32::MAX).await?.len(),
        2 * STEPS as usize
    );
    Ok(Growth { empty, half, full })
}

/// Runs `STEPS` turns of one request, each adding a 500-byte assistant
/// answer and a 500-byte tool message; with `reports`, each turn's
/// checkpoint carries the request's cumulative verification reports (one
/// more per turn), as the agent loop saves them.
async fn long_request(
    store: &SqliteStore,
    path: &Path,
    reports: bool,
) -> Result<(Growth, ConversationId, Fence), turnstile::Error> {
    let conversation = new_conversation(store).await?;
    let fence = admit(store, conversation, "go").await?;
    let empty = measure(path).await.expect("measure");
    let mut half = empty;
    for turn in 1..=STEPS {
        let count = 1 + 2 * u64::from(turn - 1);
        let mut start = checkpoint(fence.run_id, turn - 1, CheckpointPhase::TurnInFlight, count);
        start.turn = turn;
        let mut done = checkpoint(fence.run_id, turn, CheckpointPhase::Ready, count + 2);
        if !reports {
            start.verification_reports.clear();
            done.verification_reports.clear();
        }
        store.begin_turn(&fence, &start).await?;
        let messages = [
            Message::assistant(padded(turn, "assistant")),
            Message::Tool {
                call_id: format!("call-{turn}"),
                content: padded(turn, "tool"),
                is_error: false,
            },
        ];
        store.finish_turn(&fence, &done, &messages).await?;
        if turn == STEPS / 2 {
            half = measure(path).await.expect("measure");
        }
    }
    let full = measure(path).await.expect("measure");
    Ok((Growth { empty, half, full }, conversation, fence))
}

#[tokio::test]
async fn committed_requests_grow_storage_linearly() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (store, path) = open(&dir).await?;
    let growth = committed_requests(&store, &path).await?;
    let ratio = growth.full.file as f64 / MESSAGE_TOTAL;
    let added = (growth.full.used - growth.empty.used) as f64 / MESSAGE_TOTAL;
    println!(
        "{STEPS} committed requests of 2 x {MESSAGE_BYTES} B: file {} B = {ratio:.3} x message \
         bytes; growth over the empty database {added:.3} x; second half / first half {:.3}",
        growth.full.file,
        growth.second_half_over_first()
    );
    assert!(growth.second_half_over_first() < 1.25);
    Ok(())
}

#[tokio::test]
async fn turns_of_one_request_grow_storage_linearly() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (store, path) = open(&dir).await?;
    let (growth, conversation, fence) = long_request(&store, &path, false).await?;
    let in_flight = (growth.full.used - growth.empty.used) as f64 / MESSAGE_TOTAL;
    let count = 1 + 2 * u64::from(STEPS);
    commit_answer(&store, &fence, STEPS + 1, count, "done").await?;
    let committed = measure(&path).await?;
    let moved = (committed.used - growth.empty.used) as f64 / MESSAGE_TOTAL;
    println!(
        "1 request of {STEPS} turns of 2 x {MESSAGE_BYTES} B: growth {in_flight:.3} x message \
         bytes in flight, {moved:.3} x once committed (pages in use; file {:.3} x with the \
         freed pending pages); second half / first half {:.3}",
        committed.file as f64 / MESSAGE_TOTAL,
        growth.second_half_over_first()
    );
    assert!(growth.second_half_over_first() < 1.25);
    // The commit moves the pending messages; it does not keep a second copy.
    assert!(moved < in_flight * 1.15, "{moved:.3} vs {in_flight:.3}");
    let transcript = store.transcript_window(conversation, u32::MAX).await?;
    assert_eq!(transcript.len() as u64, count + 1);
    Ok(())
}

/// Fails today: every checkpoint row stores the request's whole list of
/// verification reports again, so a run with a report per turn grows
/// quadratically (turn n rewrites n reports).
#[tokio::test]
#[ignore = "known failure: checkpoints rewrite the cumulative verification reports every turn"]
async fn turns_with_verification_reports_grow_storage_linearly() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (store, path) = open(&dir).await?;
    let (growth, _, _) = long_request(&store, &path, true).await?;
    let ratio = growth.second_half_over_first();
    println!("with a report per turn: second half / first half {ratio:.3}");
    assert!(ratio < 1.25, "second half / first half {ratio:.3}");
    Ok(())
}

/// The bound, on both shapes. Fails today: a committed request also
/// stores its final text again in the request outcome, plus a request row, a
/// run row, two checkpoint rows and five index entries (about 2.7 x growth,
/// 3.2 x file); a turn costs about 1.54 x (two 16-byte ids per message row,
/// the primary-key index, the checkpoint row).
#[tokio::test]
#[ignore = "known failure: committed requests cost ~3.2x their message bytes, turns ~1.54x"]
async fn storage_stays_within_one_and_a_half_times_message_bytes() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (store, path) = open(&dir).await?;
    let requests = committed_requests(&store, &path).await?;
    let ratio = requests.full.file as f64 / MESSAGE_TOTAL;
    println!("committed requests: file {ratio:.3} x message bytes");

    let dir = tempfile::tempdir()?;
    let (store, path) = open(&dir).await?;
    let (turns, _, _) = long_request(&store, &path, false).await?;
    let added = (turns.full.used - turns.empty.used) as f64 / MESSAGE_TOTAL;
    println!("turns of one request: growth {added:.3} x message bytes");
    assert!(ratio < MAX_RATIO, "committed requests: {ratio:.3}");
    assert!(added < MAX_RATIO, "turns: {added:.3}");
    Ok(())
}
