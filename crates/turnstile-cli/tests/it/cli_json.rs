//! One JSON vocabulary across commands: a conversation's id is
//! `conversation_id` in every document, every listing is one object with
//! its items and `next`, `export` is JSON Lines (with or without `--json`),
//! and usage beyond what a store keeps reads the same live and on replay.

use std::path::Path;

use serde_json::{json, Value};

use crate::cli_support::{add_script, printed, script, scripted, turnstile, uuid};

fn json_of(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let done = turnstile(&all);
    done.assert_success();
    done.json()
}

fn ran(db: &Path, conversation: &str, model: &str) -> Value {
    json_of(&[
        "run",
        "--db",
        db.to_str().unwrap(),
        "--conversation",
        conversation,
        "--model",
        model,
        "what is 2 + 3?",
    ])
}

#[test]
fn a_conversation_is_conversation_id_and_every_listing_is_an_object_with_next() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("json.db");
    let path = db.to_str().unwrap();
    let conversation = uuid();
    let model = scripted(&add_script(dir.path()));
    let outcome = ran(&db, &conversation, &model);
    let run = outcome["run_id"].as_str().unwrap();

    let conversations = json_of(&["ls", "conversations", "--db", path]);
    assert_eq!(
        conversations["conversations"][0]["conversation_id"],
        conversation.as_str()
    );
    let shown = json_of(&["show", &conversation, "--db", path]);
    assert_eq!(
        shown["conversation"]["conversation_id"],
        conversation.as_str()
    );
    // No bare `id` names a conversation.
    for summary in [&conversations["conversations"][0], &shown["conversation"]] {
        assert!(summary.get("id").is_none(), "{summary:#}");
    }

    for (args, items) in [
        (vec!["ls", "conversations"], "conversations"),
        (vec!["ls", "requests"], "requests"),
        (vec!["ls", "runs"], "runs"),
        (vec!["approvals"], "approvals"),
    ] {
        let mut all = args.clone();
        all.extend(["--db", path]);
        let listed = json_of(&all);
        let fields: Vec<&String> = listed.as_object().expect("an object").keys().collect();
        assert_eq!(fields.len(), 2, "{args:?}: {listed:#}");
        assert!(listed[items].is_array(), "{args:?}: {listed:#}");
        assert_eq!(listed["next"], Value::Null, "{args:?}: {listed:#}");
    }
    let runs = json_of(&["ls", "runs", "--db", path]);
    assert_eq!(runs["runs"][0]["run_id"], run);
    assert_eq!(runs["runs"][0]["conversation_id"], conversation.as_str());
}

#[test]
fn export_is_json_lines_with_or_without_json_and_its_help_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("export.db");
    let path = db.to_str().unwrap();
    let conversation = uuid();
    ran(&db, &conversation, &scripted(&add_script(dir.path())));
    let plain = turnstile(&["export", &conversation, "--db", path]);
    plain.assert_success();
    let json = turnstile(&["export", &conversation, "--db", path, "--json"]);
    json.assert_success();
    assert_eq!(plain.stdout, json.stdout);
    let lines: Vec<Value> = json
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line one JSON document"))
        .collect();
    assert_eq!(lines.len(), 4, "{json:#?}");
    assert_eq!(lines[3]["message"]["content"], "2 + 3 = 5");
    let help = turnstile(&["export", "--help"]);
    help.assert_success();
    assert!(help.stdout.contains("JSON Lines"), "{help:#?}");
    assert!(help.stdout.contains("with or without --json"), "{help:#?}");
}

#[test]
fn usage_beyond_what_a_store_keeps_reads_the_same_live_and_on_replay() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("usage.db");
    let path = db.to_str().unwrap();
    let huge = script(
        dir.path(),
        "huge.json",
        json!([{"text": "big", "usage": {
            "input_tokens": 10_000_000_000_000_000_000u64,
            "output_tokens": 9_000_000_000_000_000_000u64
        }}]),
    );
    let model = scripted(&huge);
    let (conversation, request) = (uuid(), uuid());
    let run = |json: bool| {
        let mut args = vec![
            "run",
            "--db",
            path,
            "--conversation",
            &conversation,
            "--request",
            &request,
            "--model",
            &model,
        ];
        if json {
            args.push("--json");
        }
        args.push("hi");
        let done = turnstile(&args);
        done.assert_success();
        done
    };
    let live = run(true).json();
    assert_eq!(live["replayed"], false);
    let replayed = run(true).json();
    assert_eq!(replayed["replayed"], true);
    assert_eq!(live["usage"], replayed["usage"]);
    assert_eq!(live["usage"]["input_tokens"], i64::MAX);

    // Human output too: another request, live then replayed.
    let (conversation, request) = (uuid(), uuid());
    let args = [
        "run",
        "--db",
        path,
        "--conversation",
        &conversation,
        "--request",
        &request,
        "--model",
        &model,
        "hi",
    ];
    let live = turnstile(&args);
    live.assert_success();
    let replayed = turnstile(&args);
    replayed.assert_success();
    assert_ne!(live.stdout, replayed.stdout, "the second one replays");
    assert_eq!(printed(&live, "usage"), printed(&replayed, "usage"));
}
