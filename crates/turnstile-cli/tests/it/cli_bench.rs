//! `turnstile bench` from a shell: the figures of a small workload, the
//! database a `--db` run keeps, and refused arguments. Timings vary with the
//! machine, so only their presence and consistency are checked.

use std::path::Path;
use std::process::Output;

use serde_json::Value;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection, Row};

use crate::cli_support::{command, turnstile, Run};

/// Runs the binary with `TMPDIR` set to `tmp`, where the bench puts its
/// default database.
fn turnstile_in(tmp: &Path, args: &[&str]) -> Run {
    let Output {
        status,
        stdout,
        stderr,
    } = command(args).env("TMPDIR", tmp).output().unwrap();
    Run {
        code: status.code().unwrap_or(-1),
        stdout: String::from_utf8(stdout).unwrap(),
        stderr: String::from_utf8(stderr).unwrap(),
    }
}

fn number(value: &Value, pointer: &str) -> f64 {
    value
        .pointer(pointer)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{pointer} is not a number in {value}"))
}

#[test]
fn json_figures_are_present_positive_and_consistent() {
    let tmp = tempfile::tempdir().unwrap();
    let run = turnstile_in(
        tmp.path(),
        &[
            "bench",
            "--conversations",
            "4",
            "--turns",
            "3",
            "--message-bytes",
            "300",
            "--durability",
            "normal",
            "--concurrency",
            "2",
            "--json",
        ],
    );
    run.assert_success();
    let report = run.json();

    let workload = &report["workload"];
    assert_eq!(workload["conversations"], 4, "{report}");
    assert_eq!(workload["turns_per_conversation"], 3);
    assert_eq!(workload["message_bytes"], 300);
    assert_eq!(workload["durability"], "normal");
    assert_eq!(workload["concurrency"], 2);
    assert_eq!(report["turns"], 12);
    assert_eq!(report["messages"], 24);
    assert!(number(&report, "/wall_seconds") > 0.0);
    assert!(number(&report, "/turns_per_second") > 0.0);

    assert_eq!(report["turn_latency"]["samples"], 12, "one per turn");
    for figure in [
        "turn_latency",
        "latest_checkpoint",
        "replay",
        "steps/claim_context",
        "steps/claim",
        "steps/commit",
    ] {
        let samples = number(&report, &format!("/{figure}/samples"));
        let p50 = number(&report, &format!("/{figure}/p50_ms"));
        let p99 = number(&report, &format!("/{figure}/p99_ms"));
        assert!((1.0..=12.0).contains(&samples), "{figure}: {report}");
        assert!(p50 > 0.0, "{figure}: {report}");
        assert!(p99 >= p50, "{figure}: {report}");
    }

    let storage = &report["storage"];
    // As many requests of the timed steps as the workload's, each timed.
    let steps = number(&report, "/steps/requests");
    assert_eq!(steps, 12.0, "{report}");
    for step in ["claim_context", "claim", "commit"] {
        assert_eq!(number(&report, &format!("/steps/{step}/samples")), steps);
    }
    assert_eq!(
        number(&report, "/steps/message_text_bytes"),
        2.0 * steps * 300.0
    );
    let text = number(storage, "/message_text_bytes");
    assert_eq!(
        text,
        2.0 * (12.0 + steps) * 300.0,
        "two 300-byte messages a turn, the steps' included"
    );
    let in_use = number(storage, "/bytes_in_use");
    let pages = number(storage, "/page_count") - number(storage, "/freelist_count");
    assert_eq!(in_use, pages * number(storage, "/page_size"));
    let ratio = number(storage, "/bytes_per_message_byte");
    assert!(ratio > 1.0, "{report}");
    assert!((ratio - in_use / text).abs() < 1e-9, "{report}");
    assert_eq!(storage["wal_checkpoint_complete"], true);
    assert!(number(storage, "/file_bytes") >= in_use);

    assert_eq!(report["database"], Value::Null, "not kept");
    assert!(report["debug_build"].is_boolean());
    assert_baseline_and_ratios(&report);
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "the temp databases are removed: {left:?}");
}

/// The floors were measured, and the ratios are the run's figures over
/// them.
fn assert_baseline_and_ratios(report: &Value) {
    let bare_turn = number(report, "/baseline/bare_turn_p50_ms");
    let bare_commits = number(report, "/baseline/bare_commit_per_second");
    assert!(bare_turn > 0.0 && bare_commits > 0.0, "{report}");
    assert_eq!(
        number(report, "/baseline/bare_turn/p50_ms"),
        bare_turn,
        "{report}"
    );
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(1.0);
    assert!(close(
        number(report, "/ratios/turn_p50_vs_bare_turn"),
        number(report, "/turn_latency/p50_ms") / bare_turn
    ));
    for step in ["claim", "commit"] {
        assert!(close(
            number(report, &format!("/ratios/{step}_p50_vs_bare_turn")),
            number(report, &format!("/steps/{step}/p50_ms")) / bare_turn
        ));
    }
    assert!(close(
        number(report, "/ratios/turns_per_second_vs_bare_commits"),
        number(report, "/turns_per_second") / bare_commits
    ));
    // The workspace builds SQLite without its process-wide mutexes
    // (`.cargo/config.toml`), and the report says which SQLite ran.
    let build = &report["baseline"]["sqlite_build"];
    assert!(
        build["version"]
            .as_str()
            .is_some_and(|v| v.starts_with("3.")),
        "{report}"
    );
    assert_eq!(build["memory_statistics"], false, "{report}");
    assert_eq!(build["shared_page_cache"], false, "{report}");
}

#[test]
fn in_memory_runs_the_workload_and_its_baseline_without_a_file() {
    let tmp = tempfile::tempdir().unwrap();
    let run = turnstile_in(
        tmp.path(),
        &[
            "bench",
            "--in-memory",
            "--conversations",
            "3",
            "--turns",
            "2",
            "--json",
        ],
    );
    run.assert_success();
    let report = run.json();
    assert_eq!(report["turns"], 6, "{report}");
    let storage = &report["storage"];
    assert!(number(storage, "/bytes_in_use") > 0.0, "{report}");
    assert_eq!(number(storage, "/file_bytes"), 0.0, "{report}");
    assert_eq!(report["database"], Value::Null);
    assert_baseline_and_ratios(&report);
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "nothing is written to disk: {left:?}");

    let db = tmp.path().join("x.db");
    turnstile_in(
        tmp.path(),
        &["bench", "--in-memory", "--db", db.to_str().unwrap()],
    )
    .assert_error(2, "cannot be used with");
    assert!(!db.exists());
}

#[test]
fn an_image_with_each_input_is_counted_in_the_storage_figure() {
    let tmp = tempfile::tempdir().unwrap();
    let run = turnstile_in(
        tmp.path(),
        &[
            "bench",
            "--conversations",
            "2",
            "--turns",
            "3",
            "--message-bytes",
            "100",
            "--image-bytes",
            "50000",
            "--json",
        ],
    );
    run.assert_success();
    let report = run.json();
    let storage = &report["storage"];
    // Six requests of the workload and six of the timed steps.
    assert_eq!(number(&report, "/steps/image_bytes"), 300_000.0, "{report}");
    assert_eq!(number(storage, "/image_bytes"), 600_000.0, "{report}");
    // Twelve distinct images, each stored once: the database holds at
    // least their bytes, and the figure divides by text and images together.
    let in_use = number(storage, "/bytes_in_use");
    assert!(in_use >= 600_000.0, "{report}");
    let raw = number(storage, "/message_text_bytes") + 600_000.0;
    let ratio = number(storage, "/bytes_per_message_byte");
    assert!((ratio - in_use / raw).abs() < 1e-9, "{report}");
    assert_eq!(
        report["replay"]["samples"], 6,
        "the replays sent the same images: {report}"
    );

    turnstile_in(tmp.path(), &["bench", "--image-bytes", "20971521"]).assert_error(2, "20971521");
}

#[test]
fn the_human_report_says_what_it_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let run = turnstile_in(
        tmp.path(),
        &["bench", "--conversations", "2", "--turns", "2"],
    );
    run.assert_success();
    for label in [
        "turn latency",
        "turns/s",
        "latest checkpoint",
        "replay",
        "database bytes per message byte",
        "after a WAL checkpoint",
        "ids, roles and JSON not counted",
        "removed",
        "bare turn",
        "bare commit",
        "claim read",
        "durable moment 1",
        "durable moment 2",
        "ratios",
        "memory statistics off · a page cache per connection",
    ] {
        assert!(run.stdout.contains(label), "{label:?} in {}", run.stdout);
    }
}

#[tokio::test]
async fn a_db_run_keeps_a_database_with_every_message() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("bench.db");
    let db_arg = db.to_str().unwrap();
    let args = [
        "bench",
        "--conversations",
        "3",
        "--turns",
        "2",
        "--message-bytes",
        "200",
        "--db",
        db_arg,
        "--json",
    ];
    let run = turnstile(&args);
    run.assert_success();
    assert_eq!(run.json()["database"], db_arg);

    let mut conn = SqliteConnectOptions::new()
        .filename(&db)
        .connect()
        .await
        .unwrap();
    let row = sqlx::query(
        "SELECT COUNT(*), COUNT(DISTINCT content), MIN(length(content)), MAX(length(content)),
                COUNT(DISTINCT conversation_key)
         FROM transcript",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    let counts: [i64; 5] = std::array::from_fn(|i| row.get(i));
    // The workload's requests, then as many of the timed steps, in
    // conversations of their own.
    assert_eq!(counts[0], 2 * (2 * 3 * 2), "two messages per turn");
    assert_eq!(counts[1], counts[0], "every message's text differs");
    assert_eq!((counts[2], counts[3]), (200, 200), "message size");
    assert_eq!(counts[4], 2 * 3, "conversations");
    let completed: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM requests WHERE status = 'completed'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(completed, 2 * 6, "one committed request per turn");
    conn.close().await.unwrap();

    // The file now exists: a second run refuses it and leaves it alone.
    let before = std::fs::read(&db).unwrap();
    turnstile(&args).assert_json_error(2, "already exists");
    assert_eq!(std::fs::read(&db).unwrap(), before);
}

#[test]
fn a_db_path_with_a_leftover_log_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("bench.db");
    std::fs::write(dir.path().join("bench.db-wal"), b"").unwrap();
    turnstile(&["bench", "--db", db.to_str().unwrap()]).assert_error(2, "already exists");
    assert!(!db.exists(), "nothing created");
}

#[test]
fn invalid_arguments_are_usage_errors_that_write_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    for (args, message) in [
        (&["--conversations", "0"][..], "--conversations"),
        (&["--turns", "0"], "--turns"),
        (&["--message-bytes", "0"], "--message-bytes"),
        (&["--message-bytes", "2000000"], "--message-bytes"),
        (&["--concurrency", "0"], "--concurrency"),
        (&["--durability", "eventual"], "--durability"),
        (&["--conversations", "abc"], "--conversations"),
        (
            &["--conversations", "100000", "--turns", "10000"],
            "at most",
        ),
        (
            &[
                "--conversations",
                "1000",
                "--turns",
                "1000",
                "--message-bytes",
                "1048576",
            ],
            "at most",
        ),
        (
            &["--conversations", "2", "--concurrency", "3"],
            "--concurrency",
        ),
    ] {
        let mut all = vec!["bench"];
        all.extend_from_slice(args);
        turnstile_in(tmp.path(), &all).assert_error(2, message);
    }
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "nothing written: {left:?}");
}

#[test]
fn a_bench_stopped_by_sigterm_or_sighup_removes_its_temp_directory() {
    for signal in ["TERM", "HUP", "INT"] {
        let tmp = tempfile::tempdir().unwrap();
        let child = command(&["bench", "--conversations", "200", "--turns", "200"])
            .env("TMPDIR", tmp.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let made = || std::fs::read_dir(tmp.path()).unwrap().count() > 0;
        while !made() {
            assert!(std::time::Instant::now() < deadline, "no bench directory");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let sent = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "SIG{signal}: {stderr}");
        assert!(stderr.contains("interrupted"), "{stderr}");
        let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
        assert!(left.is_empty(), "SIG{signal}: {left:?}");
    }
}
