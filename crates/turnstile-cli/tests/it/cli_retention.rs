//! `prune --keep-last N` and `--conversations-older-than`: the retention
//! policy's knobs from a shell.

use std::path::Path;

use serde_json::Value;

use crate::cli_support::{add_script, commit_request, scripted, turnstile, uuid};

/// Commits one tool-using request on `conversation`.
fn commit(db: &Path, conversation: &str, model: &str) {
    commit_request(db, conversation, model, "what is 2 + 3?");
}

fn prune(db: &Path, args: &[&str]) -> Value {
    let mut all = vec!["prune", "--db", db.to_str().unwrap(), "--json"];
    all.extend(args);
    let run = turnstile(&all);
    run.assert_success();
    run.json()
}

#[test]
fn keep_last_spares_the_newest_requests_and_an_idle_age_spares_recent_conversations() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("retention.db");
    let model = scripted(&add_script(dir.path()));
    let conversation = uuid();
    for _ in 0..3 {
        commit(&db, &conversation, &model);
    }
    std::thread::sleep(std::time::Duration::from_millis(5));

    // The two newest keep their journal: only the oldest is trimmed.
    let report = prune(&db, &["--older-than", "0s", "--keep-last", "2"]);
    assert_eq!(report["requests_examined"], 1, "{report}");
    assert_eq!(report["deleted"]["tool_calls"], 1, "{report}");
    let again = prune(&db, &["--older-than", "0s", "--keep-last", "2"]);
    assert_eq!(again["deleted"]["tool_calls"], 0, "{again}");

    // Requests at once, conversations only after an hour idle.
    let report = prune(
        &db,
        &[
            "--older-than",
            "0s",
            "--include-transcripts",
            "--conversations-older-than",
            "1h",
        ],
    );
    assert_eq!(report["deleted"]["conversations"], 0, "{report}");
    assert_eq!(report["deleted"]["tool_calls"], 2, "{report}");
    let shown = turnstile(&[
        "show",
        &conversation,
        "--db",
        db.to_str().unwrap(),
        "--json",
    ]);
    shown.assert_success();

    // --conversations-older-than needs --include-transcripts.
    let refused = turnstile(&[
        "prune",
        "--db",
        db.to_str().unwrap(),
        "--older-than",
        "0s",
        "--conversations-older-than",
        "1h",
    ]);
    assert_eq!(refused.code, 2, "{refused:#?}");
}
