//! The operations commands from a shell: `ls`, `show`, `checkpoints`,
//! `export`, `prune`, `doctor`, and Ctrl-C during a run. Each test runs the
//! built binary on a temp database and checks the database itself.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::cli_support::{
    add_script, admission, command, open, run_and_kill_at, script, scripted, turnstile,
    turnstile_with_stdin, uuid,
};
use serde_json::{json, Value};
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection};
use turnstile::store::{RequestStatus, RunStatus};
use turnstile::{CheckpointPhase, ConversationId, RequestId, RunId, SqliteStore, Store};

const INPUT: &str = "what is 2 + 3?";

/// A session command on `db` and `conversation`.
fn on<'a>(command: &'a str, db: &'a Path, conversation: &'a str) -> Vec<&'a str> {
    vec![
        command,
        "--db",
        db.to_str().unwrap(),
        "--conversation",
        conversation,
    ]
}

/// An operations command on `db`, with `--json`.
fn ops(args: &[&str], db: &Path) -> Value {
    let mut all = args.to_vec();
    all.extend(["--db", db.to_str().unwrap(), "--json"]);
    let run = turnstile(&all);
    run.assert_success();
    run.json()
}

/// Runs `input` as a new request (or `request`) and returns the outcome.
fn commit(db: &Path, conversation: &str, model: &str, request: Option<&str>) -> Value {
    let mut args = on("run", db, conversation);
    if let Some(request) = request {
        args.extend(["--request", request]);
    }
    args.extend(["--model", model, "--json", INPUT]);
    let run = turnstile(&args);
    run.assert_success();
    run.json()
}

/// A script whose first answer takes a minute.
fn slow_script(dir: &Path) -> PathBuf {
    script(
        dir,
        "slow.json",
        json!([
            {"tool_calls": [{"id": "c1", "name": "add", "arguments": {"a": 2, "b": 3}}],
             "usage": {"input_tokens": 10, "output_tokens": 5}, "delay_ms": 60000},
            {"text": "2 + 3 = 5", "usage": {"input_tokens": 20, "output_tokens": 4}}
        ]),
    )
}

/// A script whose second answer fails (once per process): the run stops
/// after its first turn, keeping the admission.
fn failing_script(dir: &Path) -> PathBuf {
    script(
        dir,
        "failing.json",
        json!([
            {"tool_calls": [{"id": "c1", "name": "add", "arguments": {"a": 2, "b": 3}}],
             "usage": {"input_tokens": 10, "output_tokens": 5}},
            {"text": "2 + 3 = 5", "usage": {"input_tokens": 20, "output_tokens": 4},
             "failure": "upstream overloaded", "fail_times": 1}
        ]),
    )
}

/// Runs `input` (from stdin) with the failing script: exit 1, admission held.
fn fail_after_turn_one(db: &Path, conversation: &str, model: &str, input: &str) -> String {
    let request = RequestId::new().to_string();
    let mut args = on("run", db, conversation);
    args.extend(["--request", &request, "--model", model, "--json"]);
    let failed = turnstile_with_stdin(&args, input);
    assert_eq!(failed.code, 1, "{failed:#?}");
    request
}

/// Row counts of every table.
async fn counts(db: &Path) -> BTreeMap<&'static str, i64> {
    const TABLES: [(&str, &str); 9] = [
        ("conversations", "SELECT COUNT(*) FROM conversations"),
        ("admissions", "SELECT COUNT(*) FROM admissions"),
        ("transcript", "SELECT COUNT(*) FROM transcript"),
        ("requests", "SELECT COUNT(*) FROM requests"),
        // Folded runs and checkpoints too (a request's first run is in
        // its row).
        ("runs", "SELECT COUNT(*) FROM all_runs"),
        ("loop_checkpoints", "SELECT COUNT(*) FROM all_checkpoints"),
        (
            "verification_reports",
            "SELECT COUNT(*) FROM verification_reports",
        ),
        ("tool_calls", "SELECT COUNT(*) FROM tool_calls"),
        ("run_messages", "SELECT COUNT(*) FROM run_messages"),
    ];
    let mut conn = connect(db).await;
    let mut counts = BTreeMap::new();
    for (table, sql) in TABLES {
        let n: i64 = sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap();
        counts.insert(table, n);
    }
    conn.close().await.unwrap();
    counts
}

/// The rows an active request owns, as text: they must survive a prune.
async fn request_rows(db: &Path, request: &str) -> Vec<String> {
    let id = request.parse::<uuid::Uuid>().unwrap();
    let mut conn = connect(db).await;
    let mut rows = Vec::new();
    for sql in [
        "SELECT hex(run_id) || status FROM all_runs WHERE request_id = ?1 ORDER BY run_id",
        // A held request's messages, after its conversation's committed entries.
        "SELECT seq || role || length(content) FROM transcript WHERE request_id = ?1 ORDER BY seq",
        "SELECT call_id || status FROM tool_calls WHERE request_id = ?1 ORDER BY turn, call_id",
        "SELECT turn || phase FROM all_checkpoints
         WHERE run_id IN (SELECT run_id FROM all_runs WHERE request_id = ?1) ORDER BY run_id, turn",
    ] {
        let found: Vec<String> = sqlx::query_scalar(sql)
            .bind(id)
            .fetch_all(&mut conn)
            .await
            .unwrap();
        rows.extend(found);
    }
    conn.close().await.unwrap();
    rows
}

async fn connect(db: &Path) -> sqlx::SqliteConnection {
    SqliteConnectOptions::new()
        .filename(db)
        .connect()
        .await
        .expect("connect to the test database")
}

/// Moves the write-ahead log into the database file, so its size is the
/// data's.
async fn checkpoint(db: &Path) {
    let mut conn = connect(db).await;
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
}

/// A file's size; 0 when it does not exist (a log after a clean close).
fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

fn ids(rows: &Value, field: &str) -> Vec<String> {
    rows.as_array()
        .unwrap()
        .iter()
        .map(|row| row[field].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn ls_lists_conversations_requests_and_runs_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ls.db");
    let fast = scripted(&add_script(dir.path()));
    let failing = scripted(&failing_script(dir.path()));
    let first = uuid();
    let second = uuid();
    let committed = commit(&db, &first, &fast, None);
    let mut other = on("run", &db, &second);
    other.extend(["--namespace", "team-b", "--model", &fast, "--json", INPUT]);
    let done = turnstile(&other);
    done.assert_success();
    let done = done.json();
    // A failed run holds the second conversation: stuck at once.
    let request = RequestId::new().to_string();
    let mut fails = on("run", &db, &second);
    fails.extend([
        "--namespace",
        "team-b",
        "--request",
        &request,
        "--model",
        &failing,
        INPUT,
    ]);
    assert_eq!(turnstile(&fails).code, 1);
    let held = admission(&db, &second).await;
    let failed_run = held.active.as_ref().unwrap().run_id.to_string();

    // One page: the conversations, and no next page.
    let page = ops(&["ls", "conversations"], &db);
    assert_eq!(page["next"], Value::Null);
    let conversations = page["conversations"].clone();
    assert_eq!(
        ids(&conversations, "conversation_id"),
        [second.clone(), first.clone()]
    );
    let [newer, older] = conversations.as_array().unwrap().as_slice() else {
        panic!("two conversations: {conversations:#}");
    };
    assert_eq!(older["namespace"], "default");
    assert_eq!(older["version"], 1);
    assert_eq!(older["revision"], 2);
    assert_eq!(older["transcript_entries"], 4);
    assert_eq!(older["held"], Value::Null);
    assert_eq!(newer["namespace"], "team-b");
    assert_eq!(newer["revision"], held.revision.0);
    assert_eq!(newer["held"]["request_id"], request.as_str());
    assert_eq!(newer["held"]["run_id"], failed_run.as_str());
    assert_eq!(newer["held"]["run_status"], "failed");
    assert_eq!(newer["held"]["stuck"], true);
    assert_eq!(newer["held"]["last_checkpoint"]["turn"], 2);
    assert_eq!(newer["held"]["last_checkpoint"]["phase"], "model_pending");

    // Filters: namespace, conversation, both, limit.
    let team = ops(&["ls", "conversations", "--namespace", "team-b"], &db)["conversations"].clone();
    assert_eq!(ids(&team, "conversation_id"), [second.as_str()]);
    let one = ops(&["ls", "conversations", "--conversation", &first], &db)["conversations"].clone();
    assert_eq!(ids(&one, "conversation_id"), [first.as_str()]);
    let none = ops(
        &[
            "ls",
            "conversations",
            "--conversation",
            &first,
            "--namespace",
            "team-b",
        ],
        &db,
    );
    assert_eq!(none["conversations"], json!([]));
    let limited = ops(&["ls", "conversations", "--limit", "1"], &db);
    assert_eq!(
        ids(&limited["conversations"], "conversation_id"),
        [second.as_str()]
    );
    let after = limited["next"].as_str().expect("a next page").to_owned();
    let rest = ops(
        &["ls", "conversations", "--limit", "1", "--after", &after],
        &db,
    );
    assert_eq!(
        ids(&rest["conversations"], "conversation_id"),
        [first.as_str()]
    );
    assert_eq!(rest["next"], Value::Null);

    // Requests of the second conversation, newest first.
    let requests = ops(&["ls", "requests", "--conversation", &second], &db)["requests"].clone();
    assert_eq!(
        ids(&requests, "request_id"),
        [
            request.clone(),
            done["request_id"].as_str().unwrap().to_owned()
        ]
    );
    let active = &requests[0];
    assert_eq!(active["status"], "active");
    assert_eq!(active["runs"], 1);
    assert_eq!(active["latest_run"], failed_run.as_str());
    assert_eq!(active["latest_run_status"], "failed");
    assert_eq!(active["held"]["revision"], held.revision.0);
    let finished = &requests[1];
    assert_eq!(finished["status"], "completed");
    assert_eq!(finished["conversation_version"], 1);
    assert_eq!(finished["latest_run"], done["run_id"]);
    assert_eq!(finished["latest_run_status"], "completed");
    assert_eq!(finished["last_checkpoint"]["turn"], 2);
    assert_eq!(finished["last_checkpoint"]["phase"], "completed");
    assert!(finished["completed_at"].as_i64().unwrap() >= finished["created_at"].as_i64().unwrap());
    assert_eq!(finished["held"], Value::Null);
    let all = ops(&["ls", "requests"], &db)["requests"].clone();
    assert_eq!(all.as_array().unwrap().len(), 3);
    let stuck = ops(&["ls", "requests", "--stuck"], &db)["requests"].clone();
    assert_eq!(ids(&stuck, "request_id"), [request.as_str()]);

    // Runs, newest first.
    let runs = ops(&["ls", "runs"], &db)["runs"].clone();
    assert_eq!(
        ids(&runs, "run_id"),
        [
            failed_run.clone(),
            done["run_id"].as_str().unwrap().to_owned(),
            committed["run_id"].as_str().unwrap().to_owned()
        ]
    );
    assert_eq!(runs[0]["status"], "failed");
    assert!(runs[0]["error"]
        .as_str()
        .unwrap()
        .contains("upstream overloaded"));
    assert_eq!(runs[0]["checkpoints"], 2);
    assert_eq!(runs[0]["held"]["revision"], held.revision.0);
    assert_eq!(runs[2]["status"], "completed");
    assert_eq!(runs[2]["conversation_id"], first.as_str());
    assert_eq!(runs[2]["namespace"], "default");
    let default_runs = ops(&["ls", "runs", "--namespace", "default"], &db)["runs"].clone();
    assert_eq!(
        ids(&default_runs, "run_id"),
        [ids(&runs, "run_id")[2].clone()]
    );

    // The tables people read.
    let mut args = vec!["ls", "requests", "--db", db.to_str().unwrap()];
    let table = turnstile(&args);
    table.assert_success();
    assert!(table.stdout.starts_with("REQUEST "), "{table:#?}");
    assert!(table.stdout.contains("active, stuck"), "{table:#?}");
    assert!(table.stdout.contains("turn 2 · completed"), "{table:#?}");
    args.push("--stuck");
    args[1] = "runs";
    let stuck_runs = turnstile(&args);
    stuck_runs.assert_success();
    assert!(stuck_runs.stdout.contains(&failed_run), "{stuck_runs:#?}");
    let empty = turnstile(&[
        "ls",
        "runs",
        "--db",
        db.to_str().unwrap(),
        "--conversation",
        &uuid(),
    ]);
    empty.assert_success();
    assert_eq!(empty.stdout, "no runs\n");

    // Operations never create a database.
    let missing = dir.path().join("missing.db");
    turnstile(&["ls", "runs", "--db", missing.to_str().unwrap()]).assert_error(4, "not found");
    assert!(!missing.exists());
}

#[tokio::test]
async fn ls_stuck_finds_a_request_whose_worker_was_sigkilled() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("stuck.db");
    let conversation = uuid();
    let request = RequestId::new().to_string();
    let slow = scripted(&slow_script(dir.path()));
    let mut args = on("run", &db, &conversation);
    args.extend(["--request", &request, "--model", &slow, INPUT]);
    run_and_kill_at(&args, "turn 1 · write-ahead checkpoint saved");
    let held = admission(&db, &conversation).await;
    let run = held.active.as_ref().unwrap().run_id.to_string();

    // The run row still says `running`: the database cannot tell a dead
    // process from one inside a long model call, so it is stuck only once
    // the admission is older than --stale-after (5m by default).
    assert_eq!(
        ops(&["ls", "requests", "--stuck"], &db)["requests"].clone(),
        json!([])
    );
    let stale = ["--stuck", "--stale-after", "0s"];
    let requests = ops(&[&["ls", "requests"][..], &stale].concat(), &db)["requests"].clone();
    assert_eq!(ids(&requests, "request_id"), [request.as_str()]);
    assert_eq!(requests[0]["status"], "active");
    assert_eq!(requests[0]["held"]["stuck"], true);
    assert_eq!(requests[0]["held"]["run_status"], "running");
    assert_eq!(requests[0]["held"]["revision"], held.revision.0);
    assert_eq!(requests[0]["last_checkpoint"]["turn"], 1);
    assert_eq!(requests[0]["last_checkpoint"]["phase"], "turn_in_flight");
    let conversations = ops(&[&["ls", "conversations"][..], &stale].concat(), &db);
    assert_eq!(
        ids(&conversations["conversations"], "conversation_id"),
        [conversation.as_str()]
    );
    let runs = ops(&[&["ls", "runs"][..], &stale].concat(), &db)["runs"].clone();
    assert_eq!(ids(&runs, "run_id"), [run.as_str()]);
    assert_eq!(runs[0]["status"], "running");

    // doctor counts the same way.
    let healthy = ops(&["doctor"], &db);
    assert_eq!(healthy["held_admissions"], 1);
    assert_eq!(healthy["stuck_admissions"], 0);
    let stale_doctor = ops(&["doctor", "--stale-after", "0s"], &db);
    assert_eq!(stale_doctor["stuck_admissions"], 1);

    // The human table names the stuck request.
    let table = turnstile(&[
        "ls",
        "conversations",
        "--db",
        db.to_str().unwrap(),
        "--stuck",
        "--stale-after",
        "0s",
    ]);
    table.assert_success();
    assert!(
        table.stdout.contains("stuck") && table.stdout.contains(&request),
        "{table:#?}"
    );
}

#[tokio::test]
async fn show_and_export_equal_the_transcript_read_through_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("show.db");
    let conversation = uuid();
    let fast = scripted(&add_script(dir.path()));
    let first = commit(&db, &conversation, &fast, None);
    let second = commit(&db, &conversation, &fast, None);

    let store = open(&db).await;
    let id: ConversationId = conversation.parse().unwrap();
    let transcript = store.transcript_range(id, 0, u64::MAX).await.unwrap();
    drop(store);
    assert_eq!(transcript.len(), 8);
    let expected: Vec<Value> = transcript
        .iter()
        .map(|e| json!({"seq": e.seq, "request_id": e.request_id, "message": e.message}))
        .collect();

    let shown = ops(&["show", &conversation], &db);
    assert_eq!(shown["transcript"], Value::Array(expected.clone()));
    assert_eq!(shown["summary"], Value::Null);
    assert_eq!(shown["conversation"]["version"], 2);
    assert_eq!(shown["conversation"]["transcript_entries"], 8);
    assert_eq!(
        shown["transcript"][3]["message"]["content"],
        first["final_text"]
    );
    assert_eq!(shown["transcript"][4]["request_id"], second["request_id"]);

    let export = turnstile(&["export", &conversation, "--db", db.to_str().unwrap()]);
    export.assert_success();
    let lines: Vec<Value> = export
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines, expected);

    let human = turnstile(&["show", &conversation, "--db", db.to_str().unwrap()]);
    human.assert_success();
    for expected in [
        "version        2 (committed requests)",
        "summary        none",
        "transcript     8 messages",
        "#1  assistant  → add({\"a\":2,\"b\":3}) [c1]",
        "#2  tool       [c1] 5",
        "#7  assistant  2 + 3 = 5",
    ] {
        assert!(
            human.stdout.contains(expected),
            "{expected:?} in {human:#?}"
        );
    }

    // The namespace is checked when given; unknown conversations are not found.
    let db_arg = db.to_str().unwrap();
    turnstile(&[
        "show",
        &conversation,
        "--db",
        db_arg,
        "--namespace",
        "other",
    ])
    .assert_error(2, "not in namespace other");
    turnstile(&["export", &uuid(), "--db", db_arg]).assert_error(4, "not found");
    let scoped = turnstile(&[
        "export",
        &conversation,
        "--db",
        db_arg,
        "--namespace",
        "default",
        "--json",
    ]);
    scoped.assert_success();
    assert_eq!(scoped.stdout, export.stdout, "JSON Lines, --json or not");
}

#[tokio::test]
async fn checkpoints_lists_every_checkpoint_row_of_a_run() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("checkpoints.db");
    let conversation = uuid();
    let fast = scripted(&add_script(dir.path()));
    let outcome = commit(&db, &conversation, &fast, None);
    let run = outcome["run_id"].as_str().unwrap();

    let store = open(&db).await;
    let rows = store
        .checkpoints(run.parse::<RunId>().unwrap())
        .await
        .unwrap();
    drop(store);
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1].phase, CheckpointPhase::Completed);

    let shown = ops(&["checkpoints", run], &db);
    assert_eq!(shown["run"]["run_id"], run);
    assert_eq!(shown["run"]["status"], "completed");
    assert_eq!(shown["run"]["checkpoints"], 2);
    assert_eq!(shown["checkpoints"], serde_json::to_value(&rows).unwrap());
    assert_eq!(shown["checkpoints"][0]["phase"], "ready");
    assert_eq!(shown["checkpoints"][1]["usage"]["input_tokens"], 30);
    assert_eq!(shown["checkpoints"][1]["tool_calls_count"], 1);
    assert_eq!(shown["checkpoints"][1]["message_count"], 4);

    let human = turnstile(&["checkpoints", run, "--db", db.to_str().unwrap()]);
    human.assert_success();
    assert!(
        human.stdout.contains("TURN  PHASE      INPUT  OUTPUT"),
        "{human:#?}"
    );
    assert!(
        human
            .stdout
            .lines()
            .any(|l| l.starts_with("2     completed  30     9       0/0        1")),
        "{human:#?}"
    );
    turnstile(&[
        "checkpoints",
        &RunId::new().to_string(),
        "--db",
        db.to_str().unwrap(),
    ])
    .assert_error(4, "not found");
}

#[tokio::test]
async fn prune_deletes_what_no_replay_needs_shrinks_the_file_and_keeps_active_work() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("prune.db");
    let fast = scripted(&add_script(dir.path()));
    let failing = scripted(&failing_script(dir.path()));
    let big = |tag: char| tag.to_string().repeat(300_000);

    // A completed request that took two runs: a failed one, then a resume.
    let kept = uuid();
    let kept_request = fail_after_turn_one(&db, &kept, &failing, INPUT);
    let held = admission(&db, &kept).await;
    let run = held.active.as_ref().unwrap().run_id.to_string();
    let revision = held.revision.to_string();
    let mut resume = on("resume", &db, &kept);
    resume.extend([
        run.as_str(),
        "--revision",
        &revision,
        "--model",
        &fast,
        "--json",
    ]);
    let resumed = turnstile(&resume);
    resumed.assert_success();
    let outcome = resumed.json();
    // Three abandoned requests with 300 kB inputs (pending messages).
    let abandoned = uuid();
    let mut burned = Vec::new();
    for tag in ['a', 'b', 'c'] {
        let request = fail_after_turn_one(&db, &abandoned, &failing, &big(tag));
        let revision = admission(&db, &abandoned).await.revision.to_string();
        let mut args = on("abandon", &db, &abandoned);
        args.extend([request.as_str(), "--revision", &revision]);
        turnstile(&args).assert_success();
        burned.push(request);
    }
    // An active request (its run failed) with a 300 kB input: untouchable.
    let active = uuid();
    let active_request = fail_after_turn_one(&db, &active, &failing, &big('d'));
    let active_rows = request_rows(&db, &active_request).await;

    checkpoint(&db).await;
    let before = counts(&db).await;
    let size_before = file_size(&db);
    assert!(size_before > 1_100_000, "{size_before}");

    // A dry run counts and deletes nothing.
    let dry = ops(&["prune", "--older-than", "0s", "--dry-run"], &db);
    assert_eq!(dry["dry_run"], true);
    assert_eq!(counts(&db).await, before);
    assert_eq!(file_size(&db), size_before);
    // Each abandoned request left its input, an answer and a tool result.
    assert_eq!(dry["deleted"]["run_messages"], 9);

    let report = ops(&["prune", "--older-than", "0s"], &db);
    let after = counts(&db).await;
    assert_eq!(
        report["deleted"], dry["deleted"],
        "a dry run counts exactly"
    );
    for (table, rows) in &before {
        assert_eq!(
            report["deleted"][table].as_i64().unwrap(),
            rows - after[table],
            "{table}: {report:#}"
        );
    }
    assert_eq!(report["requests_examined"], 4);
    // Kept: every conversation, request, transcript row and report.
    for table in ["conversations", "admissions", "requests", "transcript"] {
        assert_eq!(after[table], before[table], "{table}");
    }
    // Deleted: the abandoned requests' runs, checkpoints and messages, the
    // failed run of the completed request, superseded checkpoints, journals.
    assert_eq!(report["deleted"]["runs"], 4);
    assert_eq!(report["deleted"]["loop_checkpoints"], 8);
    assert_eq!(report["deleted"]["tool_calls"], 4);
    assert_eq!(report["deleted"]["verification_reports"], 0);
    assert_eq!(after["runs"], 2, "the committing run and the active one");
    let size_after = file_size(&db);
    assert_eq!(report["database_bytes_before"], size_before);
    assert_eq!(report["database_bytes_after"], size_after);
    assert_eq!(report["wal_bytes_after"], 0);
    assert!(
        size_after + 700_000 < size_before,
        "{size_before} → {size_after}"
    );
    // Over 600 KB in 8 KiB pages.
    assert!(report["pages_freed"].as_u64().unwrap() > 75, "{report:#}");
    eprintln!("prune: {size_before} → {size_after} bytes");

    // The active request's work is intact, and it still finishes.
    assert_eq!(request_rows(&db, &active_request).await, active_rows);
    let held = admission(&db, &active).await;
    let run = held.active.as_ref().unwrap().run_id.to_string();
    let revision = held.revision.to_string();
    let mut resume = on("resume", &db, &active);
    resume.extend([
        run.as_str(),
        "--revision",
        &revision,
        "--model",
        &fast,
        "--json",
    ]);
    let finished = turnstile(&resume);
    finished.assert_success();
    assert_eq!(finished.json()["tool_calls"], 1);

    // The kept completed request replays as before: its committing run's
    // completed checkpoint is the only one left.
    let replay = commit(&db, &kept, &fast, Some(&kept_request));
    assert_eq!(replay["replayed"], true);
    for field in [
        "run_id",
        "messages",
        "usage",
        "turns",
        "tool_calls",
        "final_text",
    ] {
        assert_eq!(replay[field], outcome[field], "{field}");
    }
    let store = open(&db).await;
    let committing: RunId = outcome["run_id"].as_str().unwrap().parse().unwrap();
    let left = store.checkpoints(committing).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].phase, CheckpointPhase::Completed);
    drop(store);
    // Abandoned ids stay burned.
    let mut reuse = on("run", &db, &abandoned);
    reuse.extend(["--request", &burned[0], "--model", &fast]);
    turnstile_with_stdin(&reuse, &big('a')).assert_error(2, "abandoned");

    // A second prune has nothing left to delete; --status narrows it.
    let again = ops(
        &["prune", "--older-than", "0s", "--status", "abandoned"],
        &db,
    );
    assert_eq!(again["deleted"]["runs"], 0);
    assert_eq!(again["requests_examined"], 3);
    let human = turnstile(&["prune", "--db", db.to_str().unwrap(), "--older-than", "7d"]);
    human.assert_success();
    assert!(
        human.stdout.contains("total rows            0"),
        "{human:#?}"
    );
}

#[tokio::test]
async fn prune_with_include_transcripts_deletes_idle_conversations_but_never_a_held_one() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("transcripts.db");
    let fast = scripted(&add_script(dir.path()));
    let failing = scripted(&failing_script(dir.path()));
    let idle = uuid();
    commit(&db, &idle, &fast, None);
    commit(&db, &idle, &fast, None);
    let held = uuid();
    commit(&db, &held, &fast, None);
    let active_request = fail_after_turn_one(&db, &held, &failing, INPUT);
    let active_rows = request_rows(&db, &active_request).await;
    let before = counts(&db).await;

    // Too recent: nothing goes.
    let recent = ops(
        &["prune", "--older-than", "1h", "--include-transcripts"],
        &db,
    );
    assert_eq!(recent["deleted"]["conversations"], 0);
    assert_eq!(counts(&db).await, before);

    let dry = ops(
        &[
            "prune",
            "--older-than",
            "0s",
            "--include-transcripts",
            "--dry-run",
        ],
        &db,
    );
    assert_eq!(counts(&db).await, before);
    let report = ops(
        &["prune", "--older-than", "0s", "--include-transcripts"],
        &db,
    );
    assert_eq!(report["deleted"], dry["deleted"]);
    let after = counts(&db).await;
    for (table, rows) in &before {
        assert_eq!(
            report["deleted"][table].as_i64().unwrap(),
            rows - after[table],
            "{table}: {report:#}"
        );
    }
    assert_eq!(report["deleted"]["conversations"], 1);
    assert_eq!(report["deleted"]["transcript"], 8);
    assert_eq!(report["deleted"]["requests"], 2);
    let store = open(&db).await;
    let gone = store
        .transcript_range(idle.parse().unwrap(), 0, u64::MAX)
        .await
        .unwrap();
    assert!(gone.is_empty());
    // The held conversation keeps its transcript and the active request.
    let kept = store
        .transcript_range(held.parse().unwrap(), 0, u64::MAX)
        .await
        .unwrap();
    assert_eq!(kept.len(), 4);
    let record = store
        .request(active_request.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, RequestStatus::Active);
    drop(store);
    assert_eq!(request_rows(&db, &active_request).await, active_rows);

    // --status and --include-transcripts do not mix (whole conversations go
    // whatever their requests' status).
    let mixed = turnstile(&[
        "prune",
        "--db",
        db.to_str().unwrap(),
        "--older-than",
        "0s",
        "--include-transcripts",
        "--status",
        "abandoned",
    ]);
    mixed.assert_error(2, "cannot be used with");
}

#[tokio::test]
async fn doctor_reports_a_healthy_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("healthy.db");
    let fast = scripted(&add_script(dir.path()));
    commit(&db, &uuid(), &fast, None);

    let mut wal = db.clone().into_os_string();
    wal.push("-wal");
    let sizes = (file_size(&db), file_size(Path::new(&wal)));
    let report = ops(&["doctor"], &db);
    assert_eq!(report["integrity_ok"], true);
    assert_eq!(report["integrity"], json!(["ok"]));
    assert_eq!(
        report["schema_version"],
        SqliteStore::supported_schema_version()
    );
    assert_eq!(
        report["supported_schema_version"],
        SqliteStore::supported_schema_version()
    );
    assert_eq!(report["page_size"], 8192);
    assert_eq!(report["auto_vacuum"], "incremental");
    assert_eq!(report["journal_mode"], "wal");
    assert_eq!(report["held_admissions"], 0);
    assert_eq!(report["stuck_admissions"], 0);
    assert_eq!(
        (
            report["database_bytes"].as_u64(),
            report["wal_bytes"].as_u64()
        ),
        (Some(sizes.0), Some(sizes.1))
    );
    assert_eq!(report["not_checked"], json!([]));
    // Read-only: the log is not even checkpointed.
    assert_eq!((file_size(&db), file_size(Path::new(&wal))), sizes);

    let human = turnstile(&["doctor", "--db", db.to_str().unwrap()]);
    human.assert_success();
    assert!(human.stdout.contains("integrity        ok"), "{human:#?}");
    assert!(human.stdout.contains("0 held · 0 stuck"), "{human:#?}");

    let missing = dir.path().join("missing.db");
    turnstile(&["doctor", "--db", missing.to_str().unwrap()]).assert_error(4, "not found");
    assert!(!missing.exists());
}

#[test]
fn doctor_that_cannot_open_the_database_says_so_with_exit_7_and_no_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let directory = dir.path().join("a-directory.db");
    std::fs::create_dir(&directory).unwrap();
    let fifo = dir.path().join("a-fifo.db");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    for db in [&directory, &fifo] {
        let path = db.to_str().unwrap();
        let human = turnstile(&["doctor", "--db", path]);
        human.assert_error(7, "cannot open");
        assert!(!human.stderr.contains("integrity"), "{human:#?}");

        let json = turnstile(&["doctor", "--db", path, "--json"]);
        assert_eq!(json.code, 7, "{json:#?}");
        let report = json.json();
        assert_eq!(report["integrity_ok"], Value::Null, "{report:#}");
        assert!(report["cannot_open"].is_string(), "{report:#}");
    }
    assert!(fifo.exists() && directory.is_dir());
}

#[tokio::test]
async fn doctor_reports_a_corrupted_database_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("corrupt.db");
    let fast = scripted(&add_script(dir.path()));
    for tag in 'a'..='j' {
        let conversation = uuid();
        let mut args = on("run", &db, &conversation);
        args.extend(["--model", &fast, "--json"]);
        turnstile_with_stdin(&args, &tag.to_string().repeat(20_000)).assert_success();
    }
    // Everything in the main file, free pages returned, the log gone.
    ops(&["prune", "--older-than", "7d"], &db);
    checkpoint(&db).await;
    let size = file_size(&db);
    assert!(size >= 50 * 4096, "{size}");

    // Overwrite the middle third of the file, page-aligned.
    let mut bytes = std::fs::read(&db).unwrap();
    let pages = bytes.len() / 4096;
    let (from, to) = (pages / 3 * 4096, pages * 2 / 3 * 4096);
    bytes[from..to].fill(0x5a);
    std::fs::write(&db, &bytes).unwrap();

    let mut args = vec!["doctor", "--db", db.to_str().unwrap()];
    let human = turnstile(&args);
    assert_eq!(human.code, 1, "{human:#?}");
    assert!(
        human.stdout.contains("integrity        FAILED"),
        "{human:#?}"
    );
    let errors: Vec<&str> = human.stderr.lines().collect();
    assert_eq!(errors.len(), 1, "{human:#?}");
    assert!(
        errors[0].starts_with("error: integrity check failed"),
        "{human:#?}"
    );
    assert!(!human.stderr.contains("panicked"), "{human:#?}");

    args.push("--json");
    let json = turnstile(&args);
    assert_eq!(json.code, 1, "{json:#?}");
    let report = json.json();
    assert_eq!(report["integrity_ok"], false);
    assert_ne!(report["integrity"], json!(["ok"]));
    assert_eq!(report["database_bytes"], size);
}

#[test]
fn a_closed_stdout_is_a_quiet_exit_and_closed_pipes_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("pipes.db");
    let fast = scripted(&add_script(dir.path()));
    let conversation = uuid();
    commit(&db, &conversation, &fast, None);
    let db_arg = db.to_str().unwrap();
    for args in [
        vec!["ls", "conversations", "--db", db_arg],
        vec!["export", conversation.as_str(), "--db", db_arg],
    ] {
        let mut child = command(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // the reader is gone before anything is written
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
    }
    // Both outputs closed and a failing command: its exit code, no panic.
    let missing = dir.path().join("missing.db");
    let mut child = command(&["ls", "runs", "--db", missing.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    drop(child.stderr.take());
    assert_eq!(child.wait().unwrap().code(), Some(4));
}

#[tokio::test]
async fn sigterm_and_sighup_stop_a_run_cleanly_like_ctrl_c() {
    for signal in ["TERM", "HUP"] {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("signal.db");
        let conversation = uuid();
        let slow = scripted(&slow_script(dir.path()));
        let mut args = on("run", &db, &conversation);
        args.extend(["--model", &slow, INPUT]);
        let mut child = command(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start turnstile");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        loop {
            line.clear();
            assert!(stdout.read_line(&mut line).unwrap() > 0, "exited early");
            if line.contains("write-ahead checkpoint saved") {
                break;
            }
        }
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        let mut rest = String::new();
        stdout.read_to_string(&mut rest).unwrap();
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert_eq!(
            output.status.code(),
            Some(1),
            "SIG{signal}: {stderr}\n{rest}"
        );
        assert!(stderr.contains("was cancelled at revision"), "{stderr}");
        assert!(
            stderr.contains("continue it with: turnstile resume"),
            "{stderr}"
        );

        let held = admission(&db, &conversation).await;
        let active = held.active.expect("the admission stays held");
        let store = open(&db).await;
        let latest = store
            .latest_checkpoint(active.run_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(latest.phase, CheckpointPhase::ModelPending, "SIG{signal}");
    }
}

#[tokio::test]
async fn ctrl_c_cancels_a_run_cleanly_and_resume_finishes_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("interrupt.db");
    let conversation = uuid();
    let request = RequestId::new().to_string();
    let slow = scripted(&slow_script(dir.path()));
    let mut args = on("run", &db, &conversation);
    args.extend(["--request", &request, "--model", &slow, INPUT]);

    let mut child = command(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start turnstile");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "exited early");
        if line.contains("write-ahead checkpoint saved") {
            break;
        }
    }
    // The model call takes a minute: interrupt it.
    let started = std::time::Instant::now();
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(started.elapsed().as_secs() < 30, "stopped promptly");
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(1), "{stderr}\n{rest}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("was cancelled at revision"), "{stderr}");

    // The loop settled the turn: the admission is held by a failed run whose
    // checkpoint resumes under the default policy.
    let held = admission(&db, &conversation).await;
    let active = held.active.clone().expect("the admission stays held");
    let store = open(&db).await;
    let run = store.run(active.run_id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Failed);
    let latest = store
        .latest_checkpoint(active.run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(latest.phase, CheckpointPhase::ModelPending);
    drop(store);
    let hint = format!(
        "continue it with: turnstile resume {} --revision {} --db {} --conversation {conversation} --model {slow}",
        active.run_id,
        held.revision,
        db.display()
    );
    assert!(stderr.contains(&hint), "{stderr}");
    // A failed owner is stuck at once.
    let stuck = ops(&["ls", "requests", "--stuck"], &db)["requests"].clone();
    assert_eq!(ids(&stuck, "request_id"), [request.as_str()]);

    // The printed command (with a model that answers now) finishes it.
    let fast = scripted(&add_script(dir.path()));
    let run_id = active.run_id.to_string();
    let revision = held.revision.to_string();
    let mut resume = on("resume", &db, &conversation);
    resume.extend([
        run_id.as_str(),
        "--revision",
        &revision,
        "--model",
        &fast,
        "--json",
    ]);
    let resumed = turnstile(&resume);
    resumed.assert_success();
    let outcome = resumed.json();
    assert_eq!(outcome["final_text"], "2 + 3 = 5");
    assert_eq!(outcome["turns"], 2);
    assert_eq!(outcome["usage"]["input_tokens"], 30);
    let store = open(&db).await;
    let record = store
        .request(request.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, RequestStatus::Completed);
}

#[test]
fn bad_operations_arguments_are_one_line_usage_errors_and_create_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("never.db");
    let db_arg = db.to_str().unwrap();
    for (args, mentions) in [
        (vec!["ls", "tables", "--db", db_arg], "tables"),
        (
            vec!["ls", "runs", "--db", db_arg, "--stale-after", "5x"],
            "duration",
        ),
        (vec!["ls", "runs", "--db", db_arg, "--limit", "0"], "0"),
        (vec!["prune", "--db", db_arg], "--older-than"),
        (
            vec![
                "prune",
                "--db",
                db_arg,
                "--older-than",
                "7d",
                "--status",
                "active",
            ],
            "active",
        ),
        (vec!["show", "not-a-uuid", "--db", db_arg], "not-a-uuid"),
        (vec!["checkpoints", "--db", db_arg], "<RUN>"),
    ] {
        turnstile(&args).assert_error(2, mentions);
    }
    assert!(!db.exists());
}

/// The help of `--namespace` in a command's `--help`: its line and those
/// under it, up to the next option (short or long help alike).
fn namespace_help(text: &str) -> String {
    let mut lines = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("--namespace"));
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("no --namespace: {text}"));
    let rest = lines.take_while(|l| !l.trim_start().starts_with('-'));
    std::iter::once(first)
        .chain(rest)
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn every_command_defaults_to_one_namespace_and_ls_help_groups_the_conversation_filters() {
    let help = |command: &[&str]| {
        let mut args = command.to_vec();
        args.push("--help");
        let shown = turnstile(&args);
        shown.assert_success();
        shown.stdout
    };
    // The commands that run or change a conversation: `default`, the
    // library's default too.
    let default = turnstile::Namespace::default();
    assert_eq!(default.as_str(), turnstile::Namespace::DEFAULT);
    let named = format!("[default: {}]", turnstile::Namespace::DEFAULT);
    for command in [
        &["run"][..],
        &["resume"],
        &["recover"],
        &["abandon"],
        &["approve"],
        &["reject"],
        &["delete"],
        &["fork"],
        &["meta"],
    ] {
        let text = help(command);
        let line = namespace_help(&text);
        assert!(line.contains(&named), "{command:?}: {line}");
    }
    // The read commands filter: every namespace when absent.
    for command in [&["ls"][..], &["approvals"], &["show"], &["export"]] {
        let text = help(command);
        let line = namespace_help(&text);
        assert!(!line.contains("[default:"), "{command:?}: {line}");
        assert!(
            line.contains("every namespace when absent") || line.contains("any when absent"),
            "{command:?}: {line}"
        );
    }
    // `ls --help`: the conversation-only filters under their own heading,
    // after every filter that applies to all three listings.
    let text = help(&["ls"]);
    let heading = text
        .find("Filters of `ls conversations` only (requests and runs refuse them):")
        .unwrap_or_else(|| panic!("{text}"));
    for flag in [
        "--namespace",
        "--conversation",
        "--stuck",
        "--stale-after",
        "--limit",
    ] {
        let at = text.find(&format!("      {flag} ")).unwrap();
        assert!(at < heading, "{flag} applies to every listing: {text}");
    }
    for flag in [
        "--owner",
        "--meta",
        "--created-after",
        "--created-before",
        "--updated-after",
        "--updated-before",
        "--after",
    ] {
        let at = text.find(&format!("      {flag} ")).unwrap();
        assert!(at > heading, "{flag} filters conversations only: {text}");
    }
}

/// A write command on a database of an older schema migrates it first and
/// says so on stderr, one line as each migration starts and one when all
/// are done; the next command has nothing to migrate and says nothing.
#[test]
fn a_command_on_an_older_database_prints_each_migration_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("old.db");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../turnstile-sqlite/tests/fixtures/schema4.db"),
        &db,
    )
    .unwrap();
    let db = db.to_str().unwrap();
    // The fixture's held request (schema 4, conversation …0b, revision 1).
    let abandon = [
        "abandon",
        "--db",
        db,
        "--namespace",
        "compat",
        "--conversation",
        "00000000-0000-4000-8000-00000000000b",
        "--revision",
        "1",
        "00000000-0000-4000-8000-0000000000b1",
    ];
    let run = turnstile(&abandon);
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(run.stdout.contains("abandoned"), "{run:#?}");
    let latest = SqliteStore::supported_schema_version();
    let pending = latest - 4;
    let lines: Vec<&str> = run.stderr.lines().collect();
    // A line per migration, one for the transcript's ten rows copied (a
    // line per tenth of a table at most) after the migration copying them
    // (0017) starts, one at the end.
    assert_eq!(lines.len() as i64, pending + 2, "{}", run.stderr);
    let copied = format!("turnstile: migrating {db}: transcript, 10 of 10 rows copied");
    let at = lines.iter().position(|line| *line == copied);
    let copying = format!(
        "turnstile: migrating {db} ({} of {pending}): schema 17, ",
        17 - 4
    );
    assert!(
        at.is_some_and(|at| at > 0 && lines[at - 1].starts_with(&copying)),
        "{}",
        run.stderr
    );
    assert!(
        lines[0].starts_with(&format!(
            "turnstile: migrating {db} (1 of {pending}): schema 5, "
        )),
        "{}",
        run.stderr
    );
    assert!(
        lines[lines.len() - 2].starts_with(&format!(
            "turnstile: migrating {db} ({pending} of {pending}): schema {latest}, "
        )),
        "{}",
        run.stderr
    );
    assert!(
        lines[lines.len() - 1]
            .starts_with(&format!("turnstile: migrated {db} to schema {latest} in ")),
        "{}",
        run.stderr
    );

    // Migrated: the same command now finds the request released, and
    // prints no migration.
    let again = turnstile(&abandon);
    again.assert_error(5, "is not active");
}
