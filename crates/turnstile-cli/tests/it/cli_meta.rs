//! `turnstile meta` and the search flags of `ls conversations`, on the
//! built binary: typed exit codes, `--json`, and nothing written on a
//! refusal.

use std::path::Path;

use serde_json::{json, Value};

use crate::cli_support::{turnstile, uuid};

fn db_str(db: &Path) -> &str {
    db.to_str().unwrap()
}

/// `turnstile meta CONV --db DB ARGS --json`, which must succeed.
fn meta(db: &Path, conversation: &str, args: &[&str]) -> Value {
    let mut all = vec!["meta", conversation, "--db", db_str(db)];
    all.extend(args);
    all.push("--json");
    let run = turnstile(&all);
    run.assert_success();
    run.json()
}

/// `ls conversations --db DB ARGS --json`: the page.
fn ls(db: &Path, args: &[&str]) -> Value {
    let mut all = vec!["ls", "conversations", "--db", db_str(db)];
    all.extend(args);
    all.push("--json");
    let run = turnstile(&all);
    run.assert_success();
    run.json()
}

fn ids(page: &Value) -> Vec<String> {
    page["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["conversation_id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn meta_creates_shows_and_changes_under_a_version_check() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("meta.db");
    let c = uuid();
    let created = meta(
        &db,
        &c,
        &[
            "--create",
            "--title",
            "Trip",
            "--owner",
            "ana",
            "--set",
            "team=x",
            "--set-json",
            "n=3",
        ],
    );
    assert_eq!(created["conversation_id"], c.as_str());
    assert_eq!(created["meta_version"], 1);
    assert_eq!(created["title"], "Trip");
    assert_eq!(created["owner"], "ana");
    assert_eq!(created["metadata"], json!({"team": "x", "n": 3}));
    assert_eq!(meta(&db, &c, &[]), created);

    // A stale version is a conflict (5) and changes nothing.
    let stale = turnstile(&[
        "meta",
        &c,
        "--db",
        db_str(&db),
        "--version",
        "0",
        "--title",
        "U",
    ]);
    stale.assert_error(5, "expected meta version 0, found 1");
    assert_eq!(meta(&db, &c, &[]), created);

    // Without --version the current one is read and swapped on.
    let changed = meta(
        &db,
        &c,
        &["--unset", "team", "--no-title", "--set", "n=four"],
    );
    assert_eq!(changed["meta_version"], 2);
    assert_eq!(changed["title"], Value::Null);
    assert_eq!(changed["owner"], "ana");
    assert_eq!(changed["metadata"], json!({"n": "four"}));
    let at_version = meta(&db, &c, &["--version", "2", "--owner", "bo"]);
    assert_eq!(at_version["meta_version"], 3);

    // Human output: the labels, and a title that cannot rewrite the terminal.
    meta(&db, &c, &["--title", "evil\u{1b}]0;pwned\u{7}"]);
    let shown = turnstile(&["meta", &c, "--db", db_str(&db)]);
    shown.assert_success();
    for expected in [
        "meta version",
        "4",
        "owner",
        "bo",
        "metadata",
        "n",
        "\"four\"",
    ] {
        assert!(
            shown.stdout.contains(expected),
            "{expected}: {}",
            shown.stdout
        );
    }
    assert!(!shown.stdout.contains('\u{1b}'), "{}", shown.stdout);
}

#[test]
fn meta_refuses_bad_input_with_2_and_unknown_conversations_with_4() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("meta.db");
    let c = uuid();
    let before = meta(&db, &c, &["--create", "--title", "kept", "--set", "k=v"]);
    let long_title = "t".repeat(257);
    let huge_value = format!("k={{{}", "x".repeat(100_000));
    let huge_key = format!("{}=1", "k".repeat(100_000));
    let refusals: [(&[&str], &str); 10] = [
        // Limits in words and bytes, never a constant's name.
        (&["--title", ""], "title must have 1 to 256 bytes, not 0"),
        (
            &["--title", &long_title],
            "title must have 1 to 256 bytes, not 257",
        ),
        (&["--set", "bad key=1"], "ASCII letters"),
        // What the user typed, named as typed.
        (
            &["--set-json", "k={bad"],
            "--set-json \"k={bad\": the value after = is not JSON",
        ),
        (&["--set-json", "novalue"], "--set-json expects K=JSON"),
        (
            &["--set-json", &huge_value],
            "the value after = is not JSON",
        ),
        (&["--set-json", &huge_key], "must have 1 to 128 bytes"),
        (&["--set", "novalue"], "K=V"),
        (&["--set", "k=1", "--unset", "k"], "both set and unset"),
        (&["--title", "a", "--no-title"], "cannot be used with"),
    ];
    for (args, why) in refusals {
        let mut all = vec!["meta", c.as_str(), "--db", db_str(&db)];
        all.extend(args);
        let refused = turnstile(&all);
        refused.assert_error(2, why);
        assert!(!refused.stderr.contains("MAX_"), "{refused:#?}");
        // A huge value is echoed once, cut.
        assert!(refused.stderr.len() < 400, "{}", refused.stderr.len());
        assert!(refused.stderr.matches('x').count() <= 64, "{refused:#?}");
    }
    assert_eq!(meta(&db, &c, &[]), before);

    let unknown = uuid();
    for args in [
        vec![],
        vec!["--title", "t"],
        vec!["--version", "0", "--title", "t"],
    ] {
        let mut all = vec!["meta", unknown.as_str(), "--db", db_str(&db)];
        all.extend(args);
        turnstile(&all).assert_error(4, "not found");
    }
    // Another namespace's conversation is a mismatch (2).
    turnstile(&["meta", &c, "--db", db_str(&db), "--namespace", "other"])
        .assert_error(2, "not in namespace other");
    // A missing database is not created without --create.
    let missing = dir.path().join("missing.db");
    turnstile(&["meta", &c, "--db", db_str(&missing), "--title", "t"]).assert_error(4, "not found");
    assert!(!missing.exists());
}

#[test]
fn ls_conversations_filters_by_owner_metadata_and_time_and_pages_with_a_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ls.db");
    let mut made = Vec::new();
    for (owner, team, n) in [("ana", "x", "1"), ("bo", "x", "2"), ("ana", "y", "3")] {
        let c = uuid();
        let n = format!("n={n}");
        meta(
            &db,
            &c,
            &[
                "--create",
                "--owner",
                owner,
                "--set",
                &format!("team={team}"),
                "--set-json",
                &n,
            ],
        );
        made.push(c);
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let newest_first: Vec<String> = made.iter().rev().cloned().collect();
    let all = ls(&db, &[]);
    assert_eq!(ids(&all), newest_first);
    assert_eq!(all["next"], Value::Null);
    assert_eq!(all["conversations"][0]["meta"]["owner"], "ana");
    assert_eq!(all["conversations"][0]["meta"]["metadata"]["team"], "y");

    assert_eq!(
        ids(&ls(&db, &["--owner", "ana"])),
        [made[2].as_str(), made[0].as_str()]
    );
    assert_eq!(
        ids(&ls(&db, &["--meta", "team=x"])),
        [made[1].as_str(), made[0].as_str()]
    );
    // `k=v` matches the string, `k:=JSON` the JSON value.
    assert_eq!(ids(&ls(&db, &["--meta", "n:=2"])), [made[1].as_str()]);
    assert!(ids(&ls(&db, &["--meta", "n=2"])).is_empty());
    assert_eq!(
        ids(&ls(&db, &["--owner", "ana", "--meta", "team=x"])),
        [made[0].as_str()]
    );
    let created = all["conversations"][1]["created_at"].as_i64().unwrap();
    let since = created.to_string();
    assert_eq!(
        ids(&ls(&db, &["--created-after", &since])),
        [made[2].as_str(), made[1].as_str()]
    );
    assert_eq!(
        ids(&ls(&db, &["--created-before", &since])),
        [made[0].as_str()]
    );
    assert!(ids(&ls(&db, &["--updated-after", "9999-01-01T00:00:00Z"])).is_empty());
    assert_eq!(
        ids(&ls(&db, &["--updated-after", "2000-01-01T00:00:00Z"])).len(),
        3
    );

    // Pages: walk with the printed cursor.
    let first = ls(&db, &["--limit", "2"]);
    assert_eq!(ids(&first), newest_first[..2]);
    let cursor = first["next"].as_str().unwrap();
    let second = ls(&db, &["--limit", "2", "--after", cursor]);
    assert_eq!(ids(&second), newest_first[2..]);
    assert_eq!(second["next"], Value::Null);
    let human = turnstile(&["ls", "conversations", "--db", db_str(&db), "--limit", "2"]);
    human.assert_success();
    assert!(
        human.stdout.contains(&format!("more: --after {cursor}")),
        "{}",
        human.stdout
    );
    assert!(human.stdout.contains("OWNER"), "{}", human.stdout);

    // Refusals: a bad cursor, filter, time; filters on other listings.
    let refusals: [(&[&str], &str); 6] = [
        (
            &["conversations", "--after", "garbage"],
            "not a listing cursor",
        ),
        (&["conversations", "--meta", "n:=1.5"], "integer"),
        (&["conversations", "--meta", "novalue"], "KEY=VALUE"),
        (
            &["conversations", "--created-after", "yesterday"],
            "RFC 3339",
        ),
        (
            &["conversations", "--owner", ""],
            "owner must have 1 to 256 bytes",
        ),
        (&["runs", "--owner", "ana"], "conversations only"),
    ];
    for (args, why) in refusals {
        let mut all = vec!["ls"];
        all.extend(args);
        all.extend(["--db", db_str(&db)]);
        turnstile(&all).assert_error(2, why);
    }
}
