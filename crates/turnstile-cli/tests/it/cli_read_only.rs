//! Read commands on a database its user cannot write: a read-only
//! directory (as a read-only medium is) and a writable directory with a
//! file the user may only read. Each works and leaves no `-wal` or `-shm`
//! file beside the database. As root, file modes bind nobody: the commands
//! then run as the user `nobody`, who really cannot write there. A log
//! beside such a file cannot be read without writing: that read says why.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;

use crate::cli_support::{self, add_script, scripted, turnstile, uuid, Run};

const NOBODY: u32 = 65534;

/// The database `run` made in `dir`, once its `-wal` file is gone (the
/// last connection to close removes it): then the file alone is whole.
fn made(dir: &Path) -> (String, String, String) {
    let db = dir.join("ro.db");
    let conversation = uuid();
    let model = scripted(&add_script(dir));
    let ran = turnstile(&[
        "run",
        "--db",
        db.to_str().unwrap(),
        "--conversation",
        &conversation,
        "--model",
        &model,
        "--json",
        "what is 2 + 3?",
    ]);
    ran.assert_success();
    let run = ran.json()["run_id"].as_str().unwrap().to_owned();
    std::fs::remove_file(dir.join("add.json")).unwrap();
    let wal = dir.join("ro.db-wal");
    for _ in 0..500 {
        if !wal.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(!wal.exists(), "the log was folded at close");
    (db.to_str().unwrap().to_owned(), conversation, run)
}

fn is_root() -> bool {
    let probe = tempfile::tempdir().unwrap();
    let file = probe.path().join("probe");
    std::fs::write(&file, b"x").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o400)).unwrap();
    std::fs::OpenOptions::new().append(true).open(&file).is_ok()
}

/// Runs the binary as the user who cannot write: `nobody` when we are
/// root, else ourselves.
fn reader(outer: &Path, root: bool) -> impl Fn(&[&str]) -> Run {
    let binary = match root {
        true => cli_support::binary_for_others(outer),
        false => env!("CARGO_BIN_EXE_turnstile").into(),
    };
    move |args: &[&str]| {
        let mut command = std::process::Command::new(&binary);
        command
            .args(args)
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .stdin(std::process::Stdio::null());
        if root {
            command.uid(NOBODY).gid(NOBODY);
        }
        let output = command.output().expect("run turnstile");
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// Every read command succeeds, shows the conversation, and leaves the
/// directory as it was.
fn every_read_works_and_leaves_nothing(
    read: &dyn Fn(&[&str]) -> Run,
    dir: &Path,
    (db, conversation, run): &(String, String, String),
) {
    let before = std::fs::read(Path::new(db)).unwrap();
    let commands: [Vec<&str>; 7] = [
        vec!["show", conversation],
        vec!["ls", "conversations"],
        vec!["ls", "runs"],
        vec!["checkpoints", run],
        vec!["export", conversation],
        vec!["approvals"],
        vec!["doctor"],
    ];
    for mut args in commands {
        args.extend(["--db", db]);
        let done = read(&args);
        done.assert_success();
        if args[0] != "doctor" && args[0] != "approvals" && args[0] != "checkpoints" {
            let shown = done.stdout.contains(conversation.as_str())
                || done.stdout.contains("2 + 3 = 5")
                || done.stdout.contains(run.as_str());
            assert!(shown, "{args:?}: {done:#?}");
        }
        assert_eq!(names_in(dir), ["ro.db"], "after {args:?}");
    }
    assert_eq!(std::fs::read(Path::new(db)).unwrap(), before, "unchanged");
    // Writable again, so the temp directory can be removed.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn reads_in_a_read_only_directory_work_and_leave_no_log_files() {
    let root = is_root();
    let outer = tempfile::tempdir().unwrap();
    let dir = outer.path().join("data");
    std::fs::create_dir(&dir).unwrap();
    let made = made(&dir);
    // Others (nobody, as root) may read the directory and the file, and
    // write neither; not root, the owner may not write them either.
    std::fs::set_permissions(Path::new(&made.0), std::fs::Permissions::from_mode(0o444)).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o555)).unwrap();
    std::fs::set_permissions(outer.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let read = reader(outer.path(), root);
    every_read_works_and_leaves_nothing(&read, &dir, &made);
}

#[test]
fn reads_of_a_file_the_user_cannot_write_leave_no_log_files_beside_it() {
    let root = is_root();
    let outer = tempfile::tempdir().unwrap();
    let dir = outer.path().join("data");
    std::fs::create_dir(&dir).unwrap();
    let made = made(&dir);
    // The directory is the reader's to write (SQLite could add its files
    // there), the database file is not.
    std::fs::set_permissions(Path::new(&made.0), std::fs::Permissions::from_mode(0o444)).unwrap();
    if root {
        std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(outer.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let read = reader(outer.path(), root);
    every_read_works_and_leaves_nothing(&read, &dir, &made);
}

#[test]
fn a_read_that_needs_to_write_beside_a_log_says_why_and_what_to_do() {
    let root = is_root();
    let outer = tempfile::tempdir().unwrap();
    let dir = outer.path().join("data");
    std::fs::create_dir(&dir).unwrap();
    let (db, _, _) = made(&dir);
    // A log beside the file (its writer still has it open, or could not
    // fold it): reading it needs a -shm file the reader cannot create.
    std::fs::write(dir.join("ro.db-wal"), b"").unwrap();
    std::fs::set_permissions(Path::new(&db), std::fs::Permissions::from_mode(0o444)).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o555)).unwrap();
    std::fs::set_permissions(outer.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let read = reader(outer.path(), root);
    let refused = read(&["ls", "conversations", "--db", &db]);
    refused.assert_error(1, "a write-ahead log");
    assert!(
        refused
            .stderr
            .contains("read it as a user who may write the database and its directory"),
        "{refused:#?}"
    );
    assert_eq!(names_in(&dir), ["ro.db", "ro.db-wal"]);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
}
