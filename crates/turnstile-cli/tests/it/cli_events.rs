//! `events`: a conversation's event log as JSON Lines, and `--follow`
//! printing the steps another process commits until it is stopped.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::cli_support::{add_script, command, commit_request, scripted, turnstile, uuid};

fn lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

fn kinds(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["kind"].as_str().unwrap()).collect()
}

/// What one request of the add script logs: its admission, the model's
/// call of `add`, its result journaled, the turn's end, the commit of the
/// answer.
const ONE_REQUEST: [&str; 5] = [
    "admitted",
    "answered",
    "tool_finished",
    "checkpoint_saved",
    "committed",
];

#[test]
fn events_prints_the_log_and_follow_prints_what_another_process_commits() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("events.db");
    let db_arg = db.to_str().unwrap();
    let conversation = uuid();
    let model = scripted(&add_script(dir.path()));
    commit_request(&db, &conversation, &model, "what is 2 + 3?");

    let all = turnstile(&["events", &conversation, "--db", db_arg]);
    all.assert_success();
    let all = lines(&all.stdout);
    assert_eq!(kinds(&all), ONE_REQUEST);
    let seqs: Vec<_> = all.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5]);
    let request = all[0]["request_id"].clone();
    assert!(all.iter().all(|e| e["request_id"] == request));
    assert_eq!(all[2]["call_id"], "c1");
    assert_eq!(all[2]["turn"], 1);
    assert_eq!(all[1]["entry_seq"], 1);
    assert_eq!(all[3]["turn"], 1);
    assert_eq!(all[3]["run_id"], all[0]["run_id"]);
    let later = turnstile(&["events", &conversation, "--db", db_arg, "--after", "2"]);
    later.assert_success();
    assert_eq!(lines(&later.stdout), all[2..]);

    // Follow from the last one seen while another process runs a request.
    let mut follower = command(&[
        "events",
        &conversation,
        "--db",
        db_arg,
        "--after",
        "5",
        "--follow",
        "--poll",
        "20ms",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("start the follower");
    commit_request(&db, &conversation, &model, "and 3 + 4?");
    let mut stdout = BufReader::new(follower.stdout.take().unwrap());
    let mut followed = Vec::new();
    while followed.len() < ONE_REQUEST.len() {
        let mut line = String::new();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "the follower stopped"
        );
        followed.push(serde_json::from_str::<Value>(&line).unwrap());
    }
    assert_eq!(kinds(&followed), ONE_REQUEST);
    assert_eq!(followed[0]["seq"], 6);
    assert_ne!(followed[0]["request_id"], request);
    let sent = Command::new("kill")
        .args(["-TERM", &follower.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    // Nothing after the request's events, read to the end of the output.
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "", "nothing after the request");
    let output = follower.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
}

#[test]
fn events_of_an_unknown_conversation_or_with_no_poll_interval_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("events.db");
    let db_arg = db.to_str().unwrap();
    let conversation = uuid();
    commit_request(&db, &conversation, &scripted(&add_script(dir.path())), "hi");
    turnstile(&["events", &uuid(), "--db", db_arg]).assert_error(4, "not found");
    turnstile(&[
        "events",
        &conversation,
        "--db",
        db_arg,
        "--follow",
        "--poll",
        "0s",
    ])
    .assert_error(2, "--poll must be longer than 0s");
    let missing = dir.path().join("missing.db");
    turnstile(&["events", &conversation, "--db", missing.to_str().unwrap()])
        .assert_error(4, "not found");
    assert!(!missing.exists());
}
