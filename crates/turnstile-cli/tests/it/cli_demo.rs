//! `turnstile demo` end to end, run as the built binary on temp databases.
//! The assertions read the database back through the store: the demo's
//! story must be true of the rows, not only of the printed text.

use turnstile::store::{RequestStatus, RunStatus};
use turnstile::{
    CheckpointPhase, ConversationId, Error, Message, Namespace, RequestId, RunId, Store,
};

use crate::cli_support;
use crate::cli_support::{open, turnstile};

fn id<T: std::str::FromStr>(value: &serde_json::Value) -> T
where
    T::Err: std::fmt::Debug,
{
    value.as_str().expect("an id string").parse().unwrap()
}

/// Every tool call is answered exactly once, right after its call.
fn assert_well_formed(transcript: &[Message]) {
    let mut pending: Vec<&str> = Vec::new();
    for message in transcript {
        match message {
            Message::Tool { call_id, .. } => {
                let at = pending.iter().position(|p| p == call_id);
                assert!(at.is_some(), "orphaned or repeated result {call_id}");
                pending.remove(at.unwrap());
            }
            other => {
                assert!(pending.is_empty(), "unanswered calls {pending:?}");
                pending = other.tool_calls().iter().map(|c| c.id.as_str()).collect();
            }
        }
    }
    assert!(pending.is_empty(), "unanswered calls {pending:?}");
}

#[tokio::test]
async fn demo_kills_a_worker_recovers_its_request_and_replays_on_a_file_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("demo.db");
    let run = turnstile(&["demo", "--json", "--db", db.to_str().unwrap()]);
    run.assert_success();
    let report = run.json();

    let store = open(&db).await;
    let conversation: ConversationId = id(&report["conversation_id"]);
    let namespace = Namespace::new("demo").unwrap();
    let header = store.conversation(&namespace, conversation).await.unwrap();
    assert_eq!(header.version, 2, "two requests committed");

    // The admission is idle again: the recovery committed and released it.
    let admission = store.admission(conversation).await.unwrap();
    assert!(admission.active.is_none(), "{admission:?}");

    // Both requests are completed.
    let first: RequestId = id(&report["first"]["request_id"]);
    let second: RequestId = id(&report["recovered"]["request_id"]);
    for request in [first, second] {
        let record = store.request(request).await.unwrap().unwrap();
        assert_eq!(record.status, RequestStatus::Completed);
        assert_eq!(record.conversation_id, conversation);
    }

    // The killed run was superseded by a run that resumed from it.
    let killed: RunId = id(&report["recovered"]["killed_run_id"]);
    let recovered: RunId = id(&report["recovered"]["run_id"]);
    let killed_run = store.run(killed).await.unwrap().unwrap();
    assert_eq!(killed_run.status, RunStatus::Superseded);
    assert_eq!(killed_run.request_id, second);
    let recovered_run = store.run(recovered).await.unwrap().unwrap();
    assert_eq!(recovered_run.resumed_from, Some(killed));
    assert_eq!(recovered_run.status, RunStatus::Completed);
    #[cfg(unix)]
    assert_eq!(
        report["recovered"]["worker_signal"], 9,
        "killed with SIGKILL"
    );

    // The killed run died after turn 2's checkpoint, which was committed
    // with turn 3's write-ahead; the recovery re-ran turn 3 with the usage
    // and tool calls carried over.
    let killed_turns: Vec<_> = store.checkpoints(killed).await.unwrap();
    assert_eq!(
        killed_turns
            .iter()
            .map(|c| (c.turn, c.phase))
            .collect::<Vec<_>>(),
        [
            (1, CheckpointPhase::Ready),
            (2, CheckpointPhase::Ready),
            (3, CheckpointPhase::TurnInFlight)
        ]
    );
    let recovered_turns = store.checkpoints(recovered).await.unwrap();
    assert_eq!(
        recovered_turns.iter().map(|c| c.turn).collect::<Vec<_>>(),
        [3, 4]
    );
    let last = recovered_turns.last().unwrap();
    assert_eq!(last.phase, CheckpointPhase::Completed);
    assert_eq!(last.tool_calls_count, 4);
    let at_kill = &killed_turns[1];
    assert_eq!(
        report["recovered"]["recovery_usage"]["input_tokens"],
        at_kill.usage.input_tokens
    );
    assert!(last.usage.input_tokens > at_kill.usage.input_tokens);
    assert_eq!(report["recovered"]["tool_calls"], 4);
    assert_eq!(report["recovered"]["turns"], 4);
    // Turn 2's signed reasoning was stored before the kill and kept; the
    // recovery finished, so it went back (its model refuses a call without it).
    assert_eq!(report["recovered"]["signed_reasoning_answers"], 1);

    // The transcript holds both requests, every call answered once.
    let transcript: Vec<Message> = store
        .transcript_window(conversation, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.message)
        .collect();
    // user, assistant + 2 results, assistant + 1, answer; then user,
    // assistant + 1, assistant + 1, assistant + 2, answer.
    assert_eq!(transcript.len(), (1 + 3 + 2 + 1) + (1 + 2 + 2 + 3 + 1));
    assert_well_formed(&transcript);
    assert_eq!(report["totals"]["transcript_messages"], transcript.len());
    let tool_results: Vec<_> = transcript
        .iter()
        .filter(|m| m.role() == "tool")
        .map(Message::text)
        .collect();
    // The real tools answered: sums, word counts and a timestamp.
    assert_eq!(tool_results[0], "42");
    assert_eq!(tool_results[2], "9");
    assert!(tool_results[1].ends_with('Z'), "{tool_results:?}");
    assert_eq!(&tool_results[3..6], ["1234", "1300", "4"]);

    // The retry was a replay: no model call.
    assert_eq!(report["replay"]["replayed"], true);
    assert_eq!(
        report["replay"]["model_calls_before"],
        report["replay"]["model_calls_after"]
    );
    assert_eq!(report["totals"]["checkpoint_rows"], 3 + 2 + 3);
    assert!(report["database_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn demo_prints_all_four_parts_as_plain_lines_when_piped() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("demo.db");
    let run = turnstile(&["demo", "--db", db.to_str().unwrap()]);
    run.assert_success();
    let out = &run.stdout;
    assert!(!out.contains('\x1b'), "no escape codes when piped:\n{out}");
    for expected in [
        "1. A tool-using request",
        "turn 1 · model asked for 2 tool calls",
        "✓ add {\"a\":17,\"b\":25} → 42",
        "2. A run killed with SIGKILL",
        "worker │ turn 2 · model asked for 1 tool call",
        "ended by SIGKILL right after its turn-2 checkpoint",
        "last checkpoint  turn 3 · turn_in_flight · 2 tool calls",
        "recovery_usage",
        "turn 3 · model asked for 2 tool calls",
        "turns 4 · tool calls 4 (2 carried over)",
        "3. The first request, retried",
        "model calls 3 → 3",
        "4. Summary",
        "checkpoints  8 rows written",
    ] {
        assert!(out.contains(expected), "missing {expected:?} in:\n{out}");
    }
    // The worker's turns 3 and 4 never ran: it was frozen after turn 2.
    assert!(!out.contains("worker │ turn 3"), "{out}");
    // The recovery it shows, as a user would type it.
    let typed = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("from a shell: "))
        .unwrap_or_else(|| panic!("the recover command in:\n{out}"));
    assert!(typed.starts_with("turnstile recover "), "{typed}");
    for part in [
        " --retry-interrupted ",
        &format!(" --db {} ", db.display()),
        " --model scripted:FILE ",
    ] {
        assert!(typed.contains(part), "{part:?} in {typed}");
    }
    // The write-ahead log is not reported as if it outlived the demo.
    assert!(!db.with_extension("db-wal").exists());
    assert!(out.contains("closing folds into it"), "{out}");
}

#[tokio::test]
async fn demo_runs_twice_on_one_database_and_fresh_starts_over() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("twice.db");
    let db_arg = db.to_str().unwrap();
    let first = turnstile(&["demo", "--json", "--db", db_arg]);
    first.assert_success();
    let second = turnstile(&["demo", "--json", "--db", db_arg]);
    second.assert_success();
    let one: ConversationId = id(&first.json()["conversation_id"]);
    let two: ConversationId = id(&second.json()["conversation_id"]);
    assert_ne!(one, two, "each demo has its own conversation");
    let namespace = Namespace::new("demo").unwrap();
    {
        let store = open(&db).await;
        assert_eq!(
            store.conversation(&namespace, one).await.unwrap().version,
            2
        );
        assert_eq!(
            store.conversation(&namespace, two).await.unwrap().version,
            2
        );
    }

    let fresh = turnstile(&["demo", "--json", "--fresh", "--db", db_arg]);
    fresh.assert_success();
    let store = open(&db).await;
    assert!(matches!(
        store.conversation(&namespace, one).await,
        Err(Error::NotFound { .. })
    ));
    let three: ConversationId = id(&fresh.json()["conversation_id"]);
    assert_eq!(
        store.conversation(&namespace, three).await.unwrap().version,
        2
    );
}

#[test]
fn demo_fresh_deletes_only_a_turnstile_database_no_live_run_holds() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "my notes").unwrap();
    turnstile(&["demo", "--fresh", "--db", text.to_str().unwrap()])
        .assert_error(2, "not a SQLite database");
    assert_eq!(std::fs::read_to_string(&text).unwrap(), "my notes");

    let directory = dir.path().join("a-directory");
    std::fs::create_dir(&directory).unwrap();
    turnstile(&["demo", "--fresh", "--db", directory.to_str().unwrap()])
        .assert_error(2, "not a regular file");
    assert!(directory.is_dir());

    // A live run: a `run` whose model answers in a minute holds the
    // admission while the demo is asked to start over.
    let db = dir.path().join("busy.db");
    let slow = cli_support::script(
        dir.path(),
        "slow.json",
        serde_json::json!([{"text": "late", "delay_ms": 60000}]),
    );
    let conversation = cli_support::uuid();
    let mut child = cli_support::command(&[
        "run",
        "--db",
        db.to_str().unwrap(),
        "--conversation",
        &conversation,
        "--model",
        &cli_support::scripted(&slow),
        "hello",
    ])
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::null())
    .spawn()
    .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("write-ahead checkpoint saved") {
        line.clear();
        assert!(std::io::BufRead::read_line(&mut stdout, &mut line).unwrap() > 0);
    }
    let refused = turnstile(&["demo", "--fresh", "--db", db.to_str().unwrap()]);
    child.kill().unwrap();
    let _ = child.wait();
    refused.assert_error(2, "a live run holds");
    assert!(db.exists());
}
