//! Reasoning and provider metadata a model answered with, as `show` prints
//! them: marked in the table, whole in `--json`.

use crate::cli_support::{script, scripted, turnstile, uuid};
use serde_json::json;

#[test]
fn show_marks_reasoning_and_its_json_holds_it_whole() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("parts.db");
    let db = db.to_str().unwrap();
    let conversation = uuid();
    let signature = "c2lnbmVk".repeat(100);
    let metadata = r#"{"google": {"thought_signature": "x"}, "n": 1e999}"#;
    let model = scripted(&script(
        dir.path(),
        "thinking.json",
        json!([
            {"reasoning": {"provider": "anthropic", "text": "secret plan", "signature": signature},
             "provider_metadata": metadata,
             "tool_calls": [{"id": "c1", "name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}]},
            {"text": "5"}
        ]),
    ));
    let run = turnstile(&[
        "run",
        "--db",
        db,
        "--conversation",
        &conversation,
        "--model",
        &model,
        "add 2 and 3",
    ]);
    run.assert_success();

    let shown = turnstile(&["show", &conversation, "--db", db]);
    shown.assert_success();
    assert!(
        shown
            .stdout
            .contains("[reasoning anthropic 11 bytes, signed]"),
        "{shown:#?}"
    );
    assert!(!shown.stdout.contains("secret plan"), "{shown:#?}");
    let with_reasoning = turnstile(&["show", &conversation, "--db", db, "--reasoning"]);
    with_reasoning.assert_success();
    assert!(
        with_reasoning.stdout.contains("secret plan"),
        "{with_reasoning:#?}"
    );

    let shown = turnstile(&["show", &conversation, "--db", db, "--json"]);
    shown.assert_success();
    let answer = &shown.json()["transcript"][1]["message"];
    assert_eq!(
        answer["content"],
        json!([{"type": "reasoning", "provider": "anthropic", "text": "secret plan",
                "signature": signature}]),
        "{shown:#?}"
    );
    assert_eq!(answer["provider_metadata"], metadata);
}

#[test]
fn attached_files_are_stored_once_and_shown_by_what_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("attach.db");
    let db = db.to_str().unwrap();
    let photo = dir.path().join("photo.PNG");
    std::fs::write(&photo, vec![7u8; 40 * 1024]).unwrap();
    let notes = dir.path().join("notes.pdf");
    std::fs::write(&notes, b"%PDF-1.7 \0\x01\x02").unwrap();
    let conversation = uuid();
    let model = scripted(&script(
        dir.path(),
        "answers.json",
        json!([{"text": "a grey square"}, {"text": "the same square"}]),
    ));
    for question in ["what is this?", "and now?"] {
        turnstile(&[
            "run",
            "--db",
            db,
            "--conversation",
            &conversation,
            "--model",
            &model,
            "--attach",
            photo.to_str().unwrap(),
            "--attach",
            notes.to_str().unwrap(),
            question,
        ])
        .assert_success();
    }

    let photo_hash = hex_sha256(&std::fs::read(&photo).unwrap());
    let notes_hash = hex_sha256(&std::fs::read(&notes).unwrap());
    let shown = turnstile(&["show", &conversation, "--db", db]);
    shown.assert_success();
    let photo_mark = format!("[image image/png 40 KiB sha256:{}]", &photo_hash[..8]);
    assert_eq!(shown.stdout.matches(&photo_mark).count(), 2, "{shown:#?}");
    let notes_mark = format!(
        "[file notes.pdf application/pdf 12 bytes sha256:{}]",
        &notes_hash[..8]
    );
    assert!(shown.stdout.contains(&notes_mark), "{shown:#?}");

    // Exported exactly: the bytes as base64 in each part, or once each in
    // a directory.
    let export = turnstile(&["export", &conversation, "--db", db]);
    export.assert_success();
    let first: serde_json::Value =
        serde_json::from_str(export.stdout.lines().next().unwrap()).unwrap();
    let parts = first["message"]["content"].as_array().unwrap();
    assert_eq!(parts[1]["sha256"], photo_hash.as_str());
    assert_eq!(parts[1]["data"], base64_of(&std::fs::read(&photo).unwrap()));
    assert_eq!(parts[2]["data"], base64_of(b"%PDF-1.7 \0\x01\x02"));
    let blobs = dir.path().join("blobs");
    std::fs::create_dir(&blobs).unwrap();
    let export = turnstile(&[
        "export",
        &conversation,
        "--db",
        db,
        "--blobs",
        blobs.to_str().unwrap(),
    ]);
    export.assert_success();
    assert!(!export.stdout.contains("\"data\""), "{export:#?}");
    assert_eq!(
        std::fs::read(blobs.join(&photo_hash)).unwrap(),
        std::fs::read(&photo).unwrap()
    );
    assert_eq!(std::fs::read_dir(&blobs).unwrap().count(), 2);

    let doctor = turnstile(&["doctor", "--db", db, "--json"]);
    doctor.assert_success();
    assert_eq!(doctor.json()["blobs"], 2, "{doctor:#?}");
    assert_eq!(doctor.json()["blob_bytes"], 40 * 1024 + 12, "{doctor:#?}");

    let missing = turnstile(&[
        "run",
        "--db",
        db,
        "--conversation",
        &conversation,
        "--model",
        &model,
        "--attach",
        dir.path().join("gone.png").to_str().unwrap(),
        "hello",
    ]);
    missing.assert_error(2, "cannot read --attach");
    let unknown = dir.path().join("tool.exe");
    std::fs::write(&unknown, b"MZ").unwrap();
    turnstile(&[
        "run",
        "--db",
        db,
        "--conversation",
        &conversation,
        "--model",
        &model,
        "--attach",
        unknown.to_str().unwrap(),
        "hello",
    ])
    .assert_error(2, "accepted: .png, .jpg");
}

#[test]
fn checkpoints_show_the_messages_a_run_held_with_their_parts() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("held.db");
    let db = db.to_str().unwrap();
    let photo = dir.path().join("sum.png");
    std::fs::write(&photo, vec![9u8; 3 * 1024]).unwrap();
    let photo_hash = hex_sha256(&std::fs::read(&photo).unwrap());
    let reasoning = json!({"provider": "anthropic", "text": "plan the sum", "signature": "sig"});
    // Turn 1 calls `add`; turn 2's model call fails: the run stops holding
    // its request's input, answer and tool result, none committed.
    let failing = scripted(&script(
        dir.path(),
        "failing.json",
        json!([
            {"reasoning": reasoning,
             "tool_calls": [{"id": "c1", "name": "add", "arguments": {"a": 2, "b": 3}}]},
            {"text": "5", "failure": "upstream overloaded", "fail_times": 1}
        ]),
    ));
    let held = uuid();
    let failed = turnstile(&[
        "run",
        "--db",
        db,
        "--conversation",
        &held,
        "--model",
        &failing,
        "--attach",
        photo.to_str().unwrap(),
        "add 2 and 3",
    ]);
    assert_eq!(failed.code, 1, "{failed:#?}");
    let run_of = |conversation: &str| {
        let runs = turnstile(&[
            "ls",
            "runs",
            "--db",
            db,
            "--conversation",
            conversation,
            "--json",
        ]);
        runs.assert_success();
        runs.json()["runs"][0]["run_id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let run = run_of(&held);

    let shown = turnstile(&["checkpoints", &run, "--db", db]);
    shown.assert_success();
    for expected in [
        "messages at turn 2".to_owned(),
        "add 2 and 3".to_owned(),
        format!("[image image/png 3 KiB sha256:{}]", &photo_hash[..8]),
        "[reasoning anthropic 12 bytes, signed]".to_owned(),
        "→ add(".to_owned(),
        "[c1] 5".to_owned(),
    ] {
        assert!(shown.stdout.contains(&expected), "{expected}: {shown:#?}");
    }
    assert!(!shown.stdout.contains("plan the sum"), "{shown:#?}");
    let with_reasoning = turnstile(&["checkpoints", &run, "--db", db, "--reasoning"]);
    assert!(
        with_reasoning.stdout.contains("plan the sum"),
        "{with_reasoning:#?}"
    );
    let shown = turnstile(&["checkpoints", &run, "--db", db, "--json"]);
    shown.assert_success();
    let messages = shown.json()["messages"].clone();
    let roles: Vec<_> = messages
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(roles, ["user", "assistant", "tool"], "{shown:#?}");
    assert_eq!(messages[0]["content"][1]["sha256"], photo_hash.as_str());
    let stored = json!({"type": "reasoning", "provider": "anthropic", "text": "plan the sum",
                        "signature": "sig"});
    assert_eq!(messages[1]["content"][0], stored);

    // A committed request's run shows its transcript entries.
    let answering = scripted(&script(
        dir.path(),
        "answer.json",
        json!([{"reasoning": reasoning, "text": "hello"}]),
    ));
    let done = uuid();
    turnstile(&[
        "run",
        "--db",
        db,
        "--conversation",
        &done,
        "--model",
        &answering,
        "hi",
    ])
    .assert_success();
    let shown = turnstile(&["checkpoints", &run_of(&done), "--db", db, "--json"]);
    shown.assert_success();
    let messages = shown.json()["messages"].clone();
    assert_eq!(messages.as_array().unwrap().len(), 2, "{shown:#?}");
    assert_eq!(messages[0]["content"], "hi", "{shown:#?}");
    assert_eq!(
        messages[1]["content"],
        json!([stored, {"type": "text", "text": "hello"}])
    );
}

/// The roles of `checkpoints RUN --json`'s messages.
fn roles_at(db: &str, run: &str) -> Vec<String> {
    let shown = turnstile(&["checkpoints", run, "--db", db, "--json"]);
    shown.assert_success();
    assert_eq!(shown.json()["messages_error"], serde_json::Value::Null);
    shown.json()["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn checkpoints_show_an_answer_whose_tool_round_is_open_and_a_superseded_runs_share() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("open.db");
    let db = db.to_str().unwrap();
    let add = |id: &str, a: u32| json!({"tool_calls": [{"id": id, "name": "add", "arguments": {"a": a, "b": 1}}]});
    // Two tool turns, then the answer; the second turn's model call fails
    // once, so a second run finishes the request.
    let model = scripted(&script(
        dir.path(),
        "two_rounds.json",
        json!([add("c1", 1),
               {"failure": "upstream overloaded", "fail_times": 1,
                "tool_calls": [{"id": "c2", "name": "add", "arguments": {"a": 2, "b": 1}}]},
               {"text": "done"}]),
    ));
    // A run that stops for approval holds the answer with its tool calls,
    // recorded past its checkpoint's message count.
    let waiting = uuid();
    let stopped = turnstile(&[
        "run",
        "--db",
        db,
        "--conversation",
        &waiting,
        "--model",
        &model,
        "--require-approval",
        "add",
        "sum",
    ]);
    assert_eq!(stopped.code, 6, "{stopped:#?}");
    let runs = turnstile(&[
        "ls",
        "runs",
        "--db",
        db,
        "--conversation",
        &waiting,
        "--json",
    ]);
    let run = runs.json()["runs"][0]["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(roles_at(db, &run), ["user", "assistant"]);
    let human = turnstile(&["checkpoints", &run, "--db", db]);
    assert!(human.stdout.contains("→ add("), "{human:#?}");

    // A run that failed after one tool round, and the run that committed
    // its request (the same replies without the failure): each shows the
    // request as it stood at its own last checkpoint.
    let steady = scripted(&script(
        dir.path(),
        "steady.json",
        json!([add("c1", 1), add("c2", 2), {"text": "done"}]),
    ));
    let resumed = uuid();
    let failed = turnstile(&[
        "run",
        "--db",
        db,
        "--conversation",
        &resumed,
        "--model",
        &model,
        "sum",
    ]);
    assert_eq!(failed.code, 1, "{failed:#?}");
    let held = turnstile(&["show", &resumed, "--db", db, "--json"]);
    let held = held.json()["conversation"]["held"].clone();
    let (first_run, revision) = (
        held["run_id"].as_str().unwrap().to_owned(),
        held["revision"].to_string(),
    );
    turnstile(&[
        "resume",
        &first_run,
        "--revision",
        &revision,
        "--db",
        db,
        "--conversation",
        &resumed,
        "--model",
        &steady,
    ])
    .assert_success();
    let runs = turnstile(&[
        "ls",
        "runs",
        "--db",
        db,
        "--conversation",
        &resumed,
        "--json",
    ]);
    let runs = runs.json()["runs"].clone();
    let last_run = runs
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap().to_owned())
        .find(|r| *r != first_run)
        .unwrap();
    assert_eq!(roles_at(db, &first_run), ["user", "assistant", "tool"]);
    assert_eq!(
        roles_at(db, &last_run),
        [
            "user",
            "assistant",
            "tool",
            "assistant",
            "tool",
            "assistant"
        ]
    );
}

fn hex_sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
