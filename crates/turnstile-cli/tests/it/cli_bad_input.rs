//! Bad input to the `turnstile` command: a one-line error on stderr, the
//! documented exit code, and nothing written — not even a database file.

use std::path::Path;

use crate::cli_support;
use crate::cli_support::{add_script, admission, scripted, turnstile, uuid};

fn db_args(db: &Path) -> [&str; 2] {
    ["--db", db.to_str().unwrap()]
}

#[test]
fn unknown_subcommands_and_flags_are_usage_errors() {
    turnstile(&["frobnicate"]).assert_error(2, "unrecognized subcommand 'frobnicate'");
    turnstile(&["run", "--frobnicate"]).assert_error(2, "unexpected argument '--frobnicate'");
    turnstile(&["demo", "--db"]).assert_error(2, "--db");
    turnstile(&["run"]).assert_error(2, "required arguments were not provided");
}

#[test]
fn help_lists_the_commands_but_not_the_worker() {
    let help = turnstile(&["--help"]);
    help.assert_success();
    for command in ["demo", "run", "resume", "recover", "abandon", "Exit codes"] {
        assert!(help.stdout.contains(command), "{command} in {help:#?}");
    }
    assert!(
        !help
            .stdout
            .lines()
            .any(|l| l.trim_start().starts_with("worker")),
        "the demo's worker is hidden: {help:#?}"
    );
}

#[test]
fn invalid_uuids_are_refused_before_the_database_is_touched() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("never.db");
    let model = scripted(&add_script(dir.path()));
    let run = turnstile(&[
        "run",
        db_args(&db)[0],
        db_args(&db)[1],
        "--conversation",
        "not-a-uuid",
        "--model",
        &model,
        "hi",
    ]);
    run.assert_error(2, "invalid value 'not-a-uuid' for '--conversation <UUID>'");
    let conversation = uuid();
    let run = turnstile(&[
        "run",
        "--db",
        db.to_str().unwrap(),
        "--conversation",
        &conversation,
        "--request",
        "00000000-0000-0000-0000-000000000000",
        "--model",
        &model,
        "hi",
    ]);
    run.assert_error(2, "nil uuid");
    let resume = turnstile(&[
        "resume",
        "12345",
        "--revision",
        "1",
        "--db",
        db.to_str().unwrap(),
        "--conversation",
        &conversation,
        "--model",
        &model,
    ]);
    resume.assert_error(2, "invalid value '12345'");
    // The request id must differ from the conversation id.
    let same = turnstile(&[
        "run",
        "--db",
        db.to_str().unwrap(),
        "--conversation",
        &conversation,
        "--request",
        &conversation,
        "--model",
        &model,
        "hi",
    ]);
    same.assert_error(2, "must differ");
    assert!(!db.exists(), "nothing written");
}

#[test]
fn reordering_and_control_characters_in_arguments_are_shown_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("escaped.db");
    let conversation = uuid();
    let bad = "evil\u{202e}txt\u{1b}[2J";
    // Clap drops the escape sequence itself; the rest is shown escaped.
    let escaped = "evil\\u{202e}txt";
    let checked = |args: &[&str]| {
        let refused = turnstile(args);
        refused.assert_error(2, escaped);
        assert!(
            !refused.stderr.contains('\u{202e}') && !refused.stderr.contains('\u{1b}'),
            "{refused:#?}"
        );
    };
    let mut namespace = vec!["show", conversation.as_str(), "--namespace", bad];
    namespace.extend(db_args(&db));
    checked(&namespace);
    let mut positional = vec!["abandon", bad, "--revision", "1"];
    positional.extend(["--conversation", conversation.as_str()]);
    positional.extend(db_args(&db));
    checked(&positional);
    let mut after = vec!["ls", "conversations", "--after", bad];
    after.extend(db_args(&db));
    checked(&after);
    let mut meta = vec!["ls", "conversations", "--meta", bad];
    meta.extend(db_args(&db));
    checked(&meta);
    assert!(!db.exists(), "nothing created");
}

#[test]
fn negative_or_non_numeric_revisions_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("never.db");
    let (request, conversation) = (uuid(), uuid());
    for revision in ["-1", "1.5", "x"] {
        let run = turnstile(&[
            "abandon",
            &request,
            "--revision",
            revision,
            "--db",
            db.to_str().unwrap(),
            "--conversation",
            &conversation,
        ]);
        run.assert_error(2, "non-negative integer");
    }
    assert!(!db.exists());
}

#[test]
fn an_unreadable_or_invalid_script_is_a_usage_error_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("never.db");
    let conversation = uuid();
    let missing = format!("scripted:{}", dir.path().join("missing.json").display());
    let run = |model: &str| {
        turnstile(&[
            "run",
            "--db",
            db.to_str().unwrap(),
            "--conversation",
            &conversation,
            "--model",
            model,
            "hi",
        ])
    };
    run(&missing).assert_error(2, "cannot read script file");
    let broken = dir.path().join("broken.json");
    std::fs::write(&broken, "[{\"text\": ").unwrap();
    run(&scripted(&broken)).assert_error(2, "not a JSON array of replies");
    // Misspelt fields are named, not ignored.
    for (field, reply) in [
        ("delay", r#"{"text": "x", "delay": 5000}"#),
        ("input", r#"{"text": "x", "usage": {"input": 3}}"#),
        (
            "args",
            r#"{"tool_calls": [{"id": "c", "name": "add", "args": {}}]}"#,
        ),
    ] {
        let misspelt = dir.path().join(format!("{field}.json"));
        std::fs::write(&misspelt, format!("[{reply}]")).unwrap();
        run(&scripted(&misspelt)).assert_error(2, &format!("unknown field `{field}`"));
    }
    // A failure that would never happen (no count) is refused.
    let never = dir.path().join("never.json");
    std::fs::write(
        &never,
        r#"[{"text": "x"}, {"text": "y", "failure": "down"}]"#,
    )
    .unwrap();
    run(&scripted(&never)).assert_error(2, "reply 2 has a \"failure\" but no \"fail_times\"");
    // A script that never ends is read only up to its limit.
    run("scripted:/dev/zero").assert_error(2, "over the 16777216-byte limit");
    run("gpt-4").assert_error(
        2,
        "expected scripted:FILE, openai:MODEL_NAME or anthropic:MODEL_NAME",
    );
    let key_flag = turnstile(&[
        "run",
        "--db",
        db.to_str().unwrap(),
        "--conversation",
        &conversation,
        "--model",
        &scripted(&add_script(dir.path())),
        "--api-key-env",
        "MY_KEY",
        "hi",
    ]);
    key_flag.assert_error(2, "openai and anthropic models only");
    assert!(!db.exists(), "nothing written");
}

#[test]
fn an_api_key_is_read_from_the_environment_only() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("never.db");
    let conversation = uuid();
    // There is no flag that takes a key.
    let run = turnstile(&[
        "run",
        "--db",
        db.to_str().unwrap(),
        "--conversation",
        &conversation,
        "--model",
        "openai:gpt-4o-mini",
        "--api-key",
        "sk-secret",
        "hi",
    ]);
    run.assert_error(2, "unexpected argument '--api-key'");
    assert!(!run.stderr.contains("sk-secret"));
    // A named variable that is unset is refused before anything is written.
    let unset = turnstile(&[
        "run",
        "--db",
        db.to_str().unwrap(),
        "--conversation",
        &conversation,
        "--model",
        "openai:gpt-4o-mini",
        "--api-key-env",
        "TURNSTILE_TEST_SURELY_UNSET_KEY",
        "hi",
    ]);
    unset.assert_error(2, "TURNSTILE_TEST_SURELY_UNSET_KEY");
    assert!(!db.exists());
}

#[test]
fn empty_input_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("never.db");
    let conversation = uuid();
    let model = scripted(&add_script(dir.path()));
    let args = [
        "run",
        "--db",
        db.to_str().unwrap(),
        "--conversation",
        &conversation,
        "--model",
        &model,
    ];
    // No argument and an empty stdin.
    turnstile(&args).assert_error(2, "input is empty");
    let mut blank = args.to_vec();
    blank.push("   ");
    turnstile(&blank).assert_error(2, "input is empty");
    assert!(!db.exists());
}

#[test]
fn commands_on_a_missing_database_are_not_found_and_create_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("missing.db");
    let db_arg = db.to_str().unwrap();
    let (conversation, request, run_id) = (uuid(), uuid(), uuid());
    let model = scripted(&add_script(dir.path()));
    let session = ["--db", db_arg, "--conversation", &conversation];
    let mut abandon = vec!["abandon", &request, "--revision", "1"];
    abandon.extend(session);
    turnstile(&abandon).assert_error(4, "not found");
    let mut resume = vec!["resume", &run_id, "--revision", "1", "--model", &model];
    resume.extend(session);
    turnstile(&resume).assert_error(4, "not found");
    let mut recover = vec!["recover", &request, "--revision", "1", "--model", &model];
    recover.extend(session);
    recover.push("hi");
    turnstile(&recover).assert_error(4, "not found");
    assert!(!db.exists(), "nothing created");
}

#[tokio::test]
async fn an_unknown_conversation_or_namespace_is_refused_without_writing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("one.db");
    let conversation = uuid();
    let model = scripted(&add_script(dir.path()));
    let run = turnstile(&[
        "run",
        "--db",
        db.to_str().unwrap(),
        "--conversation",
        &conversation,
        "--namespace",
        "team-a",
        "--model",
        &model,
        "--json",
        "hi",
    ]);
    run.assert_success();
    let before = admission(&db, &conversation).await;

    // The conversation exists in another namespace: a mismatch.
    let mut other_ns = vec!["run", "--db", db.to_str().unwrap(), "--conversation"];
    other_ns.extend([
        conversation.as_str(),
        "--model",
        &model,
        "--json",
        "hi again",
    ]);
    let doc = turnstile(&other_ns).assert_json_error(2, "not in namespace default");
    assert_eq!(doc["conversation_id"], conversation.as_str(), "{doc}");
    // An invalid namespace never reaches the database.
    let bad_ns = turnstile(&[
        "run",
        "--db",
        db.to_str().unwrap(),
        "--conversation",
        &conversation,
        "--namespace",
        "no spaces",
        "--model",
        &model,
        "hi",
    ]);
    bad_ns.assert_error(2, "namespace");
    // Abandon on a conversation that does not exist: not found.
    let (unknown, request) = (uuid(), uuid());
    let missing = turnstile(&[
        "abandon",
        &request,
        "--revision",
        "0",
        "--db",
        db.to_str().unwrap(),
        "--conversation",
        &unknown,
    ]);
    missing.assert_error(4, "not found");
    assert_eq!(admission(&db, &conversation).await, before);
}

#[test]
fn input_over_the_limit_is_refused_before_any_file_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("never.db");
    let model = scripted(&add_script(dir.path()));
    let conversation = uuid();
    let args = [
        "run",
        "--db",
        db.to_str().unwrap(),
        "--conversation",
        &conversation,
        "--model",
        &model,
    ];
    // On stdin: read only up to the limit, however much more comes (an
    // argument cannot be that long: the kernel caps one at 128 KiB).
    for len in [(1 << 20) + 1, 8 << 20] {
        let huge = "x".repeat(len);
        cli_support::turnstile_with_stdin(&args, &huge)
            .assert_error(2, "over the 1048576-byte limit");
    }
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.starts_with("never.db"))
        .collect();
    assert!(left.is_empty(), "nothing written: {left:?}");
}

#[test]
fn read_commands_never_create_or_migrate_and_refuse_what_is_not_a_database_file() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    let conversation = uuid();
    for args in [
        vec!["ls", "conversations", "--db", empty.to_str().unwrap()],
        vec!["show", &conversation, "--db", empty.to_str().unwrap()],
        vec!["export", &conversation, "--db", empty.to_str().unwrap()],
    ] {
        turnstile(&args).assert_error(4, "turnstile database");
    }
    assert_eq!(std::fs::metadata(&empty).unwrap().len(), 0, "not migrated");
    let beside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(beside, ["empty.db"], "no journal or log beside it");

    let journal = Path::new("/dev/null-journal");
    let journal_before = journal.exists();
    let model = scripted(&add_script(dir.path()));
    for args in [
        vec!["ls", "conversations", "--db", "/dev/null"],
        vec![
            "run",
            "--db",
            "/dev/null",
            "--conversation",
            &conversation,
            "--model",
            &model,
            "hi",
        ],
    ] {
        turnstile(&args).assert_error(2, "is not a turnstile database");
    }
    assert_eq!(journal.exists(), journal_before, "/dev/null-journal");
}

/// The one message every command gives for a `--db` that holds no
/// database, whatever it is.
const NOT_A_DATABASE: &str = "is not a turnstile database (not a SQLite file): give --db the file \
                              a writing command such as `turnstile run` created";

#[test]
fn what_is_not_a_database_gets_one_exit_code_and_one_message_and_stays_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let directory = dir.path().join("a-directory");
    std::fs::create_dir(&directory).unwrap();
    let fifo = dir.path().join("a-fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "hello, this is not a database\n").unwrap();
    let random = dir.path().join("random.bin");
    // Bytes no SQLite file starts with, enough for a header and a page.
    let bytes: Vec<u8> = (0..5000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&random, &bytes).unwrap();
    let (conversation, run) = (uuid(), turnstile::RunId::new().to_string());
    let model = scripted(&add_script(dir.path()));
    let before: Vec<_> = [&text, &random]
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    for path in [&directory, &fifo, &text, &random] {
        let db = path.to_str().unwrap();
        let commands: [Vec<&str>; 7] = [
            vec![
                "run",
                "--conversation",
                &conversation,
                "--model",
                &model,
                "hi",
            ],
            vec!["show", &conversation],
            vec!["ls", "conversations"],
            vec!["checkpoints", &run],
            vec!["export", &conversation],
            vec!["approvals"],
            vec!["meta", &conversation, "--title", "t"],
        ];
        for mut args in commands {
            args.extend(["--db", db]);
            turnstile(&args).assert_error(2, NOT_A_DATABASE);
        }
    }
    let after: Vec<_> = [&text, &random]
        .iter()
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    assert_eq!(before, after, "the files are unchanged");
    let mut beside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    beside.sort();
    assert_eq!(
        beside,
        [
            "a-directory",
            "a-fifo",
            "add.json",
            "notes.txt",
            "random.bin"
        ],
        "no journal or log beside them"
    );
    assert_eq!(std::fs::read_dir(&directory).unwrap().count(), 0);
}

#[test]
fn a_write_past_max_db_bytes_fails_like_a_full_disk_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("quota.db");
    let model = scripted(&add_script(dir.path()));
    let conversation = uuid();
    let run = |input: &str, quota: Option<&str>| {
        let mut args = vec![
            "run",
            "--db",
            db.to_str().unwrap(),
            "--conversation",
            &conversation,
            "--model",
            &model,
            "--json",
        ];
        if let Some(quota) = quota {
            args.extend(["--max-db-bytes", quota]);
        }
        cli_support::turnstile_with_stdin(&args, input)
    };
    run("first", None).assert_success();
    let size = std::fs::metadata(&db).unwrap().len().to_string();
    let refused = run(&"x".repeat(600_000), Some(&size));
    assert_eq!(refused.code, 1, "{refused:#?}");
    assert!(refused.stderr.contains("full"), "{refused:#?}");
    let (active, version) = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let held = admission(&db, &conversation).await;
        let store = cli_support::open(&db).await;
        let namespace = turnstile::Namespace::new("default").unwrap();
        let conversation: turnstile::ConversationId = conversation.parse().unwrap();
        let version = turnstile::Store::conversation(&store, &namespace, conversation)
            .await
            .unwrap()
            .version;
        (held.active, version)
    });
    assert!(active.is_none(), "the refused claim wrote nothing");
    assert_eq!(version, 1);
    run("second", None).assert_success();
}

#[test]
fn a_quota_below_what_the_schema_needs_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tiny.db");
    let model = scripted(&add_script(dir.path()));
    let conversation = uuid();
    let refused = turnstile(&[
        "run",
        "--db",
        db.to_str().unwrap(),
        "--conversation",
        &conversation,
        "--model",
        &model,
        "--max-db-bytes",
        "8192",
        "hi",
    ]);
    refused.assert_error(1, "raise --max-db-bytes");
    let beside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(beside, ["add.json"], "no database, journal or log left");
}

#[test]
fn a_step_that_fails_after_the_claim_records_the_stop_and_names_the_command_that_continues_it() {
    fn args(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("full.db");
    let small = scripted(&add_script(dir.path()));
    let conversation = uuid();
    let on = |model: &str| {
        vec![
            "run".to_owned(),
            "--db".into(),
            db.to_str().unwrap().to_owned(),
            "--conversation".into(),
            conversation.clone(),
            "--model".into(),
            model.to_owned(),
        ]
    };
    turnstile(&args(&[on(&small), vec!["first".into()]].concat())).assert_success();
    // The answer is too big for the quota; the claim and the input are not.
    let big = cli_support::script(
        dir.path(),
        "big.json",
        serde_json::json!([{ "text": "y".repeat(600_000) }]),
    );
    let quota = (std::fs::metadata(&db).unwrap().len() + 64 * 1024).to_string();
    let mut full = on(&cli_support::scripted(&big));
    full.extend([
        "--max-db-bytes".into(),
        quota,
        "--json".into(),
        "second".into(),
    ]);
    let failed = turnstile(&args(&full));
    let doc = failed.assert_json_error(1, "full");
    assert_eq!(doc["kind"], "full", "{doc}");
    assert!(
        failed
            .stderr
            .contains("continue it with: turnstile resume "),
        "{failed:#?}"
    );
    // The quota that was too small is not pasted into the command again.
    let next = doc["next"].as_str().expect("the command that continues it");
    assert!(!next.contains("--max-db-bytes"), "{next}");

    // The stop was recorded: the request is stuck at once, and resuming it
    // (with room now) commits with the default policy.
    let stuck = turnstile(&[
        "ls",
        "requests",
        "--stuck",
        "--db",
        db.to_str().unwrap(),
        "--json",
    ]);
    stuck.assert_success();
    let rows = stuck.json()["requests"].clone();
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "{rows:#}");
    let held = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(admission(&db, &conversation));
    let active = held.active.expect("held");
    let (run, revision) = (active.run_id.to_string(), held.revision.to_string());
    let resumed = turnstile(&[
        "resume",
        &run,
        "--revision",
        &revision,
        "--db",
        db.to_str().unwrap(),
        "--conversation",
        &conversation,
        "--model",
        &cli_support::scripted(&big),
        "--json",
    ]);
    resumed.assert_success();
}

/// A tmpfs of `size` mounted on a new directory, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mount a tmpfs on {}",
            dir.path().display()
        );
        Self { dir }
    }

    /// Bytes free, as `df` counts them.
    fn available(&self) -> u64 {
        let out = std::process::Command::new("df")
            .args(["-B1", "--output=avail"])
            .arg(self.dir.path())
            .output()
            .expect("run df");
        let text = String::from_utf8(out.stdout).unwrap();
        text.lines().nth(1).unwrap().trim().parse().unwrap()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.dir.path())
            .status();
    }
}

fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.trim_ascii() == b"0")
}

fn size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// `path` with `-wal` appended.
fn wal(path: &Path) -> std::path::PathBuf {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    wal.into()
}

#[tokio::test]
async fn a_full_disk_at_close_names_the_wal_file_to_keep_and_exits_non_zero() {
    use sqlx::{Connection, Executor};
    if !is_root() {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let scripts = tempfile::tempdir().unwrap();
    let conversation = uuid();
    let small = scripted(&add_script(scripts.path()));
    let big = scripted(&cli_support::script(
        scripts.path(),
        "big.json",
        serde_json::json!([{ "text": "y".repeat(600_000) }]),
    ));
    let run = |db: &Path, model: &str, input: &str| {
        turnstile(&[
            "run",
            "--db",
            db.to_str().unwrap(),
            "--conversation",
            &conversation,
            "--model",
            model,
            "--json",
            input,
        ])
    };
    let disk = Tmpfs::mount("8m");
    let db = disk.dir.path().join("full.db");
    run(&db, &small, "first").assert_success();

    // How much the big request logs, and how much the file grows when the
    // log is folded: measured on a copy, with a reader keeping the log
    // from being folded at close.
    let copies = tempfile::tempdir().unwrap();
    let copy = copies.path().join("copy.db");
    std::fs::copy(&db, &copy).unwrap();
    let before = size(&copy);
    let mut reader = sqlx::SqliteConnection::connect(&format!("sqlite:{}", copy.display()))
        .await
        .unwrap();
    reader.execute("BEGIN").await.unwrap();
    reader
        .execute("SELECT count(*) FROM conversations")
        .await
        .unwrap();
    let copied: Vec<String> = [&big, "second"].iter().map(|s| s.to_string()).collect();
    let (copy_path, conversation_id) = (copy.clone(), conversation.clone());
    let logged = tokio::task::spawn_blocking(move || {
        turnstile(&[
            "run",
            "--db",
            copy_path.to_str().unwrap(),
            "--conversation",
            &conversation_id,
            "--model",
            &copied[0],
            "--json",
            &copied[1],
        ])
    })
    .await
    .unwrap();
    logged.assert_success();
    let log_bytes = size(&wal(&copy));
    reader.execute("ROLLBACK").await.unwrap();
    reader.close().await.unwrap();
    let folded = turnstile(&["ls", "conversations", "--db", copy.to_str().unwrap()]);
    folded.assert_success();
    assert!(!wal(&copy).exists(), "folded: {folded:#?}");
    let growth = size(&copy) - before;
    assert!(log_bytes > 0 && growth > 0, "{log_bytes} {growth}");

    // Room for the log (and the shared-memory index), not for the fold.
    let page = 4096;
    let room = log_bytes.div_ceil(page) * page + 64 * 1024 + growth / 2;
    let filler = disk.dir.path().join("filler");
    let fill = disk.available() - room;
    std::fs::write(&filler, vec![0u8; usize::try_from(fill).unwrap()]).unwrap();

    let committed = run(&db, &big, "second");
    assert_eq!(committed.code, 1, "{committed:#?}");
    assert_eq!(
        committed.json()["final_text"].as_str().map(str::len),
        Some(600_000),
        "the outcome was printed: {committed:#?}"
    );
    let lines: Vec<&str> = committed.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{committed:#?}");
    let wal_path = wal(&db);
    assert!(wal_path.exists(), "the log is kept");
    for said in [
        "committed",
        "keep",
        wal_path.to_str().unwrap(),
        "make room",
        "turnstile doctor --db",
    ] {
        assert!(lines[0].contains(said), "{said:?} in {committed:#?}");
    }

    // With room again, the pair holds the commit and the next command
    // folds it.
    std::fs::remove_file(&filler).unwrap();
    let shown = turnstile(&[
        "show",
        &conversation,
        "--db",
        db.to_str().unwrap(),
        "--json",
    ]);
    shown.assert_success();
    assert_eq!(shown.json()["conversation"]["version"], 2, "{shown:#?}");
    assert!(!wal_path.exists(), "folded at close");
}
