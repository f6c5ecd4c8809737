//! `run`, `resume`, `recover` and `abandon` from a shell: exit codes, JSON
//! output and the state they leave in the database.

use std::path::Path;

use crate::cli_support;
use crate::cli_support::{
    add_script, admission, open, run_and_kill_at, script, scripted, turnstile,
    turnstile_with_stdin, uuid,
};
use serde_json::json;
use turnstile::store::{RequestStatus, RunStatus};
use turnstile::{RequestId, RunId, Store};

const INPUT: &str = "what is 2 + 3?";

/// The arguments of a session command on `db` and `conversation`.
fn on<'a>(command: &'a str, db: &'a Path, conversation: &'a str) -> Vec<&'a str> {
    vec![
        command,
        "--db",
        db.to_str().unwrap(),
        "--conversation",
        conversation,
    ]
}

/// A script whose first answer takes a minute: a `run` with it holds the
/// admission for as long as the test wants.
fn slow_script(dir: &Path) -> std::path::PathBuf {
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

/// Starts a run of `request` with the slow script and kills it with SIGKILL
/// once its first turn's write-ahead checkpoint is saved: the admission
/// stays held by a dead owner, the turn in flight.
fn hold_admission(dir: &Path, db: &Path, conversation: &str, request: &str) {
    let model = scripted(&slow_script(dir));
    let mut args = on("run", db, conversation);
    args.extend(["--request", request, "--model", &model, INPUT]);
    let lines = run_and_kill_at(&args, "turn 1 · write-ahead checkpoint saved");
    assert!(lines[0].contains("started"), "{lines:?}");
}

#[test]
fn run_generates_a_request_id_and_a_retry_with_it_replays() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.db");
    let conversation = uuid();
    let model = scripted(&add_script(dir.path()));

    let mut args = on("run", &db, &conversation);
    args.extend(["--model", &model, "--json", INPUT]);
    let first = turnstile(&args);
    first.assert_success();
    let outcome = first.json();
    assert_eq!(outcome["final_text"], "2 + 3 = 5");
    assert_eq!(outcome["replayed"], false);
    assert_eq!(outcome["turns"], 2);
    assert_eq!(outcome["tool_calls"], 1);
    assert_eq!(outcome["usage"]["input_tokens"], 30);
    assert_eq!(outcome["conversation_version"], 1);
    let request = outcome["request_id"].as_str().unwrap().to_owned();

    // The same request id and input: the stored answer, exit 0.
    let mut again = on("run", &db, &conversation);
    again.extend(["--request", &request, "--model", &model, "--json", INPUT]);
    let replay = turnstile(&again);
    replay.assert_success();
    let replayed = replay.json();
    assert_eq!(replayed["replayed"], true);
    assert_eq!(replayed["run_id"], outcome["run_id"]);
    assert_eq!(replayed["messages"], outcome["messages"]);

    // Human output says so too, and the input may come from stdin.
    let mut human = on("run", &db, &conversation);
    human.extend(["--request", &request, "--model", &model]);
    let shown = turnstile_with_stdin(&human, &format!("{INPUT}\n"));
    shown.assert_success();
    assert!(shown.stdout.contains("replayed"), "{shown:#?}");
    assert!(shown.stdout.contains(&request), "{shown:#?}");

    // The same id with another input is a mismatch: exit 2.
    let mut other = on("run", &db, &conversation);
    other.extend(["--request", &request, "--model", &model, "what is 2 + 4?"]);
    turnstile(&other).assert_error(2, "does not match");
}

#[test]
fn run_without_a_conversation_starts_one_and_prints_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("new.db");
    let path = db.to_str().unwrap();
    let model = scripted(&add_script(dir.path()));
    let first = turnstile(&["run", "--db", path, "--model", &model, INPUT]);
    first.assert_success();
    let line = cli_support::printed(&first, "conversation ");
    let conversation = line.split_whitespace().nth(1).unwrap().to_owned();
    assert!(
        line.ends_with(&format!(
            "(new: pass --conversation {conversation} to continue it)"
        )),
        "{first:#?}"
    );
    // The printed id continues it.
    let mut next = on("run", &db, &conversation);
    next.extend(["--model", &model, "--json", "and again?"]);
    let next = turnstile(&next);
    next.assert_success();
    assert_eq!(next.json()["conversation_version"], 2);
    // With --json, the outcome names the new conversation.
    let other = turnstile(&["run", "--db", path, "--model", &model, "--json", INPUT]);
    other.assert_success();
    let started = other.json()["conversation_id"].as_str().unwrap().to_owned();
    assert_ne!(started, conversation);
    let shown = turnstile(&["show", &started, "--db", path, "--json"]);
    shown.assert_success();
    assert_eq!(shown.json()["conversation"]["version"], 1);
}

#[test]
fn human_run_prints_the_generated_request_progress_and_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("h.db");
    let conversation = uuid();
    let model = scripted(&add_script(dir.path()));
    let mut args = on("run", &db, &conversation);
    args.extend(["--model", &model, INPUT]);
    let run = turnstile(&args);
    run.assert_success();
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert!(lines[0].starts_with("request ") && lines[0].contains("generated"));
    for expected in [
        "turn 1 · model asked for 1 tool call",
        "✓ add {\"a\":2,\"b\":3} → 5",
        "checkpoint saved · turn 1",
        "committed · conversation version 1",
        "answer      2 + 3 = 5",
        "tool calls  1",
        "admission revision 2",
    ] {
        assert!(run.stdout.contains(expected), "{expected:?} in {run:#?}");
    }
}

#[tokio::test]
async fn a_held_admission_is_busy_and_recover_finishes_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("busy.db");
    let conversation = uuid();
    let request = RequestId::new().to_string();
    hold_admission(dir.path(), &db, &conversation, &request);
    let held = admission(&db, &conversation).await;
    let active = held
        .active
        .clone()
        .expect("the killed run holds the admission");
    let revision = held.revision.to_string();

    let fast = scripted(&add_script(dir.path()));
    // Another request: busy, exit 3, and it names the holder.
    let mut other = on("run", &db, &conversation);
    other.extend(["--model", &fast, "--json", "something else"]);
    let busy = turnstile(&other);
    let doc = busy.assert_json_error(3, "busy");
    assert!(busy.stderr.contains(&request), "{busy:#?}");
    // The document names the holder and the revision to take it over at.
    assert_eq!(doc["kind"], "busy", "{doc}");
    assert_eq!(doc["conversation_id"], conversation.as_str(), "{doc}");
    assert_eq!(doc["holder_request_id"], request.as_str(), "{doc}");
    assert_eq!(doc["revision"], held.revision.0, "{doc}");
    assert!(
        doc["request_id"].is_string(),
        "the generated id, to retry: {doc}"
    );
    // The same request again: busy too.
    let mut same = on("run", &db, &conversation);
    same.extend(["--request", &request, "--model", &fast, INPUT]);
    turnstile(&same).assert_error(3, "busy");
    assert_eq!(
        admission(&db, &conversation).await,
        held,
        "refusals write nothing"
    );

    // Recovery: turn 1 was in flight, so the default policy refuses (5) ...
    let mut recover = on("recover", &db, &conversation);
    recover.extend([request.as_str(), "--revision", &revision, "--model", &fast]);
    let mut refused = recover.clone();
    refused.push(INPUT);
    let in_flight = turnstile(&refused);
    in_flight.assert_error(5, "in flight");
    // Each refusal says what to do next.
    for step in ["--retry-interrupted", "turnstile abandon"] {
        assert!(in_flight.stderr.contains(step), "{step}: {in_flight:#?}");
    }
    for step in [
        "turnstile recover",
        "turnstile abandon",
        "delete --revision",
    ] {
        assert!(busy.stderr.contains(step), "{step}: {busy:#?}");
    }
    // ... a stale revision conflicts (5) ...
    let stale = (held.revision.0 - 1).to_string();
    let mut conflict = on("recover", &db, &conversation);
    conflict.extend([
        request.as_str(),
        "--revision",
        &stale,
        "--model",
        &fast,
        "--retry-interrupted",
        INPUT,
    ]);
    let stale = turnstile(&conflict);
    stale.assert_error(5, "conflict");
    assert!(stale.stderr.contains("re-read"), "{stale:#?}");
    // ... with --json, the conflict says which revision is current ...
    conflict.push("--json");
    let doc = turnstile(&conflict).assert_json_error(5, "conflict");
    assert_eq!(doc["kind"], "conflict", "{doc}");
    assert_eq!(doc["revision"], held.revision.0, "{doc}");
    assert_eq!(doc["conversation_id"], conversation.as_str(), "{doc}");
    assert_eq!(doc["request_id"], request.as_str(), "{doc}");
    // ... another input is a mismatch (2) ...
    let mut mismatch = recover.clone();
    mismatch.extend(["--retry-interrupted", "not the input"]);
    let mismatched = turnstile(&mismatch);
    mismatched.assert_error(2, "does not match");
    assert!(
        mismatched.stderr.contains("pass another --request"),
        "{mismatched:#?}"
    );
    assert_eq!(admission(&db, &conversation).await, held);

    // ... and retrying the interrupted turn finishes the request.
    let mut retry = recover.clone();
    retry.extend(["--retry-interrupted", "--json", INPUT]);
    let recovered = turnstile(&retry);
    recovered.assert_success();
    let outcome = recovered.json();
    assert_eq!(outcome["final_text"], "2 + 3 = 5");
    assert_eq!(outcome["replayed"], false);
    assert_eq!(outcome["tool_calls"], 1);
    assert_eq!(outcome["turns"], 2);
    assert_eq!(outcome["conversation_id"], conversation.as_str());

    let store = open(&db).await;
    let idle = store
        .admission(conversation.parse().unwrap())
        .await
        .unwrap();
    assert!(idle.active.is_none());
    assert!(idle.revision > held.revision);
    assert_eq!(
        outcome["revision"], idle.revision.0,
        "the outcome carries the admission revision"
    );
    let new_run: RunId = outcome["run_id"].as_str().unwrap().parse().unwrap();
    let run = store.run(new_run).await.unwrap().unwrap();
    assert_eq!(run.resumed_from, Some(active.run_id));
    assert_eq!(
        store.run(active.run_id).await.unwrap().unwrap().status,
        RunStatus::Superseded
    );
    let record = store
        .request(request.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, RequestStatus::Completed);
    drop(store);

    // Recovering a completed request replays it.
    let mut again = recover.clone();
    again.extend(["--json", INPUT]);
    let replay = turnstile(&again);
    replay.assert_success();
    assert_eq!(replay.json()["replayed"], true);
}

#[tokio::test]
async fn abandon_releases_the_admission_and_burns_the_request() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("abandon.db");
    let conversation = uuid();
    let request = RequestId::new().to_string();
    hold_admission(dir.path(), &db, &conversation, &request);
    let held = admission(&db, &conversation).await;
    let revision = held.revision.to_string();
    let stale = (held.revision.0 + 7).to_string();

    let mut wrong = on("abandon", &db, &conversation);
    wrong.extend([request.as_str(), "--revision", &stale]);
    turnstile(&wrong).assert_error(5, "conflict");
    let unknown = RequestId::new().to_string();
    let mut missing = on("abandon", &db, &conversation);
    missing.extend([unknown.as_str(), "--revision", &revision]);
    turnstile(&missing).assert_error(4, "not found");
    assert_eq!(admission(&db, &conversation).await, held);

    let mut abandon = on("abandon", &db, &conversation);
    abandon.extend([request.as_str(), "--revision", &revision, "--json"]);
    let done = turnstile(&abandon);
    done.assert_success();
    let released = done.json();
    assert_eq!(released["request_id"], request.as_str());
    assert_eq!(released["revision"], held.revision.0 + 1);
    let idle = admission(&db, &conversation).await;
    assert!(idle.active.is_none());
    assert_eq!(idle.revision.0, held.revision.0 + 1);

    // Abandoning again: the request is no longer active (5).
    let next = idle.revision.to_string();
    let mut twice = on("abandon", &db, &conversation);
    twice.extend([request.as_str(), "--revision", &next]);
    turnstile(&twice).assert_error(5, "not active");

    // The id is burned (2); a new request runs on the idle conversation.
    let fast = scripted(&add_script(dir.path()));
    let mut reuse = on("run", &db, &conversation);
    reuse.extend(["--request", &request, "--model", &fast, INPUT]);
    turnstile(&reuse).assert_error(2, "abandoned");
    let mut fresh = on("run", &db, &conversation);
    fresh.extend(["--model", &fast, "--json", INPUT]);
    let run = turnstile(&fresh);
    run.assert_success();
    assert_eq!(run.json()["conversation_version"], 1);
}

#[tokio::test]
async fn a_failed_run_exits_1_and_resume_continues_it_with_usage_carried_over() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("resume.db");
    let conversation = uuid();
    let request = RequestId::new().to_string();
    // The second answer fails once (in this process): the run stops with
    // the admission held and its first turn saved.
    let failing = script(
        dir.path(),
        "failing.json",
        json!([
            {"tool_calls": [{"id": "c1", "name": "word_count", "arguments": {"text": "a b c"}}],
             "usage": {"input_tokens": 100, "output_tokens": 10}},
            {"text": "3 words", "usage": {"input_tokens": 200, "output_tokens": 20},
             "failure": "upstream overloaded", "fail_times": 1}
        ]),
    );
    let mut run = on("run", &db, &conversation);
    let model = scripted(&failing);
    run.extend(["--request", &request, "--model", &model, "count: a b c"]);
    let failed = turnstile(&run);
    assert_eq!(failed.code, 1, "{failed:#?}");
    assert!(failed.stderr.contains("upstream overloaded"), "{failed:#?}");
    assert_eq!(failed.stderr.lines().count(), 1, "{failed:#?}");

    let held = admission(&db, &conversation).await;
    let active = held
        .active
        .clone()
        .expect("a failed run keeps the admission");
    assert_eq!(active.usage.input_tokens, 100);
    assert!(
        failed.stderr.contains(&active.run_id.to_string())
            && failed
                .stderr
                .contains(&format!("revision {}", held.revision)),
        "the error names the run and revision to resume: {failed:#?}"
    );

    // Resume the stopped run (a fresh process: the script answers now).
    let healthy = script(
        dir.path(),
        "healthy.json",
        json!([
            {"tool_calls": [{"id": "c1", "name": "word_count", "arguments": {"text": "a b c"}}],
             "usage": {"input_tokens": 100, "output_tokens": 10}},
            {"text": "3 words", "usage": {"input_tokens": 200, "output_tokens": 20}}
        ]),
    );
    let run_id = active.run_id.to_string();
    let revision = held.revision.to_string();
    let healthy = scripted(&healthy);
    let mut resume = on("resume", &db, &conversation);
    resume.extend([
        run_id.as_str(),
        "--revision",
        &revision,
        "--model",
        &healthy,
    ]);
    let unknown = RunId::new().to_string();
    let mut missing = on("resume", &db, &conversation);
    missing.extend([
        unknown.as_str(),
        "--revision",
        &revision,
        "--model",
        &healthy,
    ]);
    turnstile(&missing).assert_error(4, "not found");

    let resumed = turnstile(&resume);
    resumed.assert_success();
    assert!(
        resumed.stdout.contains("turn 2 · model answered"),
        "{resumed:#?}"
    );
    assert!(
        resumed.stdout.contains("answer      3 words"),
        "{resumed:#?}"
    );
    assert!(
        resumed.stdout.contains("total 330"),
        "usage carried over: {resumed:#?}"
    );
    assert!(
        resumed
            .stdout
            .contains(&format!("(resumed from run {})", active.run_id)),
        "{resumed:#?}"
    );

    let store = open(&db).await;
    let record = store
        .request(request.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, RequestStatus::Completed);
    let outcome = record.outcome.unwrap();
    assert_eq!(outcome.usage.input_tokens, 300);
    assert_eq!(outcome.tool_calls, 1);
    let run = store.run(outcome.run_id).await.unwrap().unwrap();
    assert_eq!(run.resumed_from, Some(active.run_id));
}

#[tokio::test]
async fn a_stopped_run_with_json_prints_an_error_document_naming_what_continues_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("stopped.db");
    let conversation = uuid();
    let failing = script(
        dir.path(),
        "failing.json",
        json!([
            {"tool_calls": [{"id": "c1", "name": "word_count", "arguments": {"text": "a b c"}}],
             "usage": {"input_tokens": 100, "output_tokens": 10}},
            {"text": "3 words", "failure": "upstream overloaded", "fail_times": 1}
        ]),
    );
    let model = scripted(&failing);
    // No --request: the generated one is in the document.
    let mut run = on("run", &db, &conversation);
    run.extend(["--model", &model, "--json", "count: a b c"]);
    let failed = turnstile(&run);
    let doc = failed.assert_json_error(1, "upstream overloaded");
    let held = admission(&db, &conversation).await;
    let active = held
        .active
        .clone()
        .expect("a stopped run keeps the admission");
    assert_eq!(doc["kind"], "stopped", "{doc}");
    assert_eq!(doc["conversation_id"], conversation.as_str(), "{doc}");
    assert_eq!(doc["request_id"], active.request_id.to_string(), "{doc}");
    assert_eq!(doc["run_id"], active.run_id.to_string(), "{doc}");
    assert_eq!(doc["revision"], held.revision.0, "{doc}");
    let next = doc["next"].as_str().expect("the command that continues it");
    assert!(
        next.starts_with(&format!(
            "turnstile resume {} --revision {}",
            active.run_id, held.revision
        )),
        "{doc}"
    );
}

#[test]
fn times_with_a_numeric_offset_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("times.db");
    let conversation = uuid();
    let model = scripted(&add_script(dir.path()));
    let mut run = on("run", &db, &conversation);
    run.extend(["--model", &model, "--json", INPUT]);
    turnstile(&run).assert_success();
    let path = db.to_str().unwrap();
    // 2000-01-01T01:00:00+01:00 is midnight UTC: the conversation is after.
    let listed = turnstile(&[
        "ls",
        "conversations",
        "--db",
        path,
        "--created-after",
        "2000-01-01T01:00:00+01:00",
        "--json",
    ]);
    listed.assert_success();
    assert!(listed.stdout.contains(&conversation), "{listed:#?}");
    // A far future with an offset: nothing is after it.
    let none = turnstile(&[
        "ls",
        "conversations",
        "--db",
        path,
        "--created-after",
        "2999-01-01T00:00:00-05:00",
        "--json",
    ]);
    none.assert_success();
    assert!(!none.stdout.contains(&conversation), "{none:#?}");
}

#[tokio::test]
async fn a_closed_stdout_stops_the_printing_but_the_run_commits_and_replays() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("pipe.db");
    let conversation = uuid();
    let request = RequestId::new().to_string();
    let model = scripted(&add_script(dir.path()));
    let mut args = on("run", &db, &conversation);
    args.extend(["--request", &request, "--model", &model, INPUT]);
    let mut child = cli_support::command(&args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // `| head -0`: the reader is gone at once
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");

    let store = open(&db).await;
    let record = store
        .request(request.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, RequestStatus::Completed);
    assert!(admission(&db, &conversation).await.active.is_none());
    drop(store);
    let again = turnstile(&[args.as_slice(), &["--json"]].concat());
    again.assert_success();
    assert_eq!(again.json()["replayed"], true);

    // With the request id generated (its line printed first), the same.
    let other = uuid();
    let mut generated = on("run", &db, &other);
    generated.extend(["--model", &model, INPUT]);
    let mut child = cli_support::command(&generated)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    let conversation: turnstile::ConversationId = other.parse().unwrap();
    let namespace = turnstile::Namespace::new("default").unwrap();
    let store = open(&db).await;
    assert_eq!(
        store
            .conversation(&namespace, conversation)
            .await
            .unwrap()
            .version,
        1
    );
}

#[test]
fn a_multi_line_answer_is_indented_under_its_row_and_forges_no_line() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("forged.db");
    let conversation = uuid();
    let forger = script(
        dir.path(),
        "forger.json",
        json!([{"text": "fine\nerror: the database is corrupt\nstatus      abandoned"}]),
    );
    let model = scripted(&forger);
    let mut run = on("run", &db, &conversation);
    run.extend(["--model", &model, INPUT]);
    let shown = turnstile(&run);
    shown.assert_success();
    let statuses: Vec<&str> = shown
        .stdout
        .lines()
        .filter(|l| l.starts_with("status") || l.starts_with("error"))
        .collect();
    assert_eq!(statuses, ["status      committed"], "{shown:#?}");
    assert!(
        shown.stdout.contains(
            "answer      fine\n            error: the database is corrupt\n            status      abandoned\n"
        ),
        "continuation lines under the answer: {shown:#?}"
    );
}

#[test]
fn a_finished_command_leaves_the_database_file_complete_on_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("closed.db");
    let conversation = uuid();
    let model = scripted(&add_script(dir.path()));
    let mut args = on("run", &db, &conversation);
    args.extend(["--model", &model, "--json", INPUT]);
    turnstile(&args).assert_success();
    let mut wal = db.clone().into_os_string();
    wal.push("-wal");
    let wal_bytes = std::fs::metadata(&wal).map_or(0, |m| m.len());
    assert_eq!(wal_bytes, 0, "the write-ahead log was folded into the file");

    // The file alone, copied elsewhere, holds the committed answer.
    let copy = dir.path().join("copy.db");
    std::fs::copy(&db, &copy).unwrap();
    let shown = turnstile(&[
        "show",
        &conversation,
        "--db",
        copy.to_str().unwrap(),
        "--json",
    ]);
    shown.assert_success();
    assert!(shown.stdout.contains("2 + 3 = 5"), "{shown:#?}");
}

#[test]
fn terminal_control_sequences_in_model_and_user_text_are_shown_escaped_and_kept_exact() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("escape.db");
    let conversation = uuid();
    let hostile = "ok \u{1b}]0;OWNED\u{7}\u{1b}]52;c;ZXZpbA==\u{7}\u{1b}[2J \u{202e}done";
    let model = scripted(&script(
        dir.path(),
        "hostile.json",
        json!([{ "text": hostile }]),
    ));
    let input = "hi \u{1b}[1A\u{1b}[2Kforged";
    let request = RequestId::new().to_string();
    let mut run = on("run", &db, &conversation);
    run.extend(["--request", &request, "--model", &model, input]);
    let human = turnstile(&run);
    human.assert_success();
    let shown = turnstile(&["show", &conversation, "--db", db.to_str().unwrap()]);
    shown.assert_success();
    for out in [&human.stdout, &shown.stdout] {
        assert!(!out.contains('\u{1b}'), "{out:?}");
        assert!(!out.contains('\u{7}'), "{out:?}");
        assert!(!out.contains('\u{202e}'), "{out:?}");
        assert!(out.contains("\\u{1b}]0;OWNED\\u{7}"), "{out:?}");
    }
    assert!(
        shown.stdout.contains("hi \\u{1b}[1A\\u{1b}[2Kforged"),
        "{}",
        shown.stdout
    );

    // Scripts get the exact text.
    let json_run = turnstile(&[run.as_slice(), &["--json"]].concat());
    json_run.assert_success();
    assert_eq!(json_run.json()["final_text"], hostile);
    let export = turnstile(&["export", &conversation, "--db", db.to_str().unwrap()]);
    export.assert_success();
    let lines: Vec<serde_json::Value> = export
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["message"]["content"], input);
    assert_eq!(lines[1]["message"]["content"], hostile);
}

#[test]
fn the_error_line_shows_control_sequences_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("error.db");
    let conversation = uuid();
    let failing =
        json!([{ "text": "x", "failure": "down \u{1b}]0;OWNED\u{7}\u{1b}[2J", "fail_times": 1 }]);
    let model = scripted(&script(dir.path(), "failing.json", failing));
    let mut run = on("run", &db, &conversation);
    run.extend(["--model", &model, "--json", INPUT]);
    let failed = turnstile(&run);
    failed.assert_json_error(1, "down \\u{1b}]0;OWNED\\u{7}\\u{1b}[2J");
    assert!(!failed.stderr.contains('\u{1b}'), "{failed:#?}");
}

#[test]
fn the_resume_hint_pastes_and_runs_for_paths_with_odd_whitespace() {
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join("two  spaces\tand 'quote' \u{202e}");
    std::fs::create_dir(&odd).unwrap();
    let db = odd.join("odd.db");
    let conversation = uuid();
    let script_path = script(
        &odd,
        "model.json",
        json!([{ "text": "x", "failure": "down", "fail_times": 1 }]),
    );
    let model = scripted(&script_path);
    let mut run = on("run", &db, &conversation);
    run.extend(["--model", &model, "--json", INPUT]);
    let failed = turnstile(&run);
    let doc = failed.assert_json_error(1, "continue it with: turnstile resume");
    assert!(
        doc["next"]
            .as_str()
            .is_some_and(|next| next.starts_with("turnstile resume ")),
        "{doc}"
    );
    // The request id was generated, so the line ends with it.
    let (_, after) = failed.stderr.split_once("continue it with: ").unwrap();
    let (hint, _) = after.rsplit_once(" (request ").unwrap();
    assert!(hint.starts_with("turnstile resume "), "{hint}");

    // The same script path now answers: the pasted hint finishes the run.
    std::fs::write(&script_path, r#"[{"text": "2 + 3 = 5"}]"#).unwrap();
    let binary = env!("CARGO_BIN_EXE_turnstile");
    let pasted = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "{} --json",
            hint.replacen("turnstile", &format!("'{binary}'"), 1)
        ))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&pasted.stderr);
    assert!(pasted.status.success(), "{hint}\n{stderr}");
    assert!(
        String::from_utf8_lossy(&pasted.stdout).contains("2 + 3 = 5"),
        "{stderr}"
    );
}

#[test]
fn a_password_in_the_base_url_never_reaches_the_hint() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("secret.db");
    let conversation = uuid();
    let mut run = on("run", &db, &conversation);
    // Nothing listens on port 9 of the loopback: the model call fails fast.
    run.extend([
        "--model",
        "openai:m",
        "--base-url",
        "http://user:hunter2@127.0.0.1:9/v1",
        "--json",
        INPUT,
    ]);
    let failed = turnstile(&run);
    failed.assert_json_error(1, "continue it with: turnstile resume");
    assert!(!failed.stderr.contains("hunter2"), "{failed:#?}");
    assert!(!failed.stdout.contains("hunter2"), "{failed:#?}");
    assert!(
        failed.stderr.contains("user:REDACTED@127.0.0.1:9"),
        "{failed:#?}"
    );
}

#[test]
fn reasoning_replay_is_for_openai_models_and_the_hint_repeats_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("replay.db");
    let conversation = uuid();
    let mut run = on("run", &db, &conversation);
    run.extend([
        "--model",
        "openai:m",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--reasoning-replay",
        "always",
        INPUT,
    ]);
    let failed = turnstile(&run);
    assert_eq!(failed.code, 1, "{failed:#?}");
    assert!(
        failed.stderr.contains("--reasoning-replay always"),
        "{failed:#?}"
    );

    let model = scripted(&add_script(dir.path()));
    let (second, third) = (uuid(), uuid());
    let mut scripted_run = on("run", &db, &second);
    scripted_run.extend(["--model", &model, "--reasoning-replay", "never", INPUT]);
    turnstile(&scripted_run).assert_error(2, "apply to openai and anthropic models only");
    let mut unknown = on("run", &db, &third);
    unknown.extend([
        "--model",
        "openai:m",
        "--reasoning-replay",
        "sometimes",
        INPUT,
    ]);
    turnstile(&unknown).assert_error(2, "tool-cycle");
}

#[tokio::test]
async fn a_write_lock_held_elsewhere_past_the_busy_timeout_exits_busy() {
    use sqlx::{Connection, Executor};
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locked.db");
    let conversation = uuid();
    let model = scripted(&add_script(dir.path()));
    let mut first = on("run", &db, &conversation);
    first.extend(["--model", &model, "--json", INPUT]);
    turnstile(&first).assert_success();

    // Another process's write transaction, held for the whole command.
    let mut holder = sqlx::SqliteConnection::connect(&format!("sqlite:{}", db.display()))
        .await
        .unwrap();
    holder.execute("BEGIN IMMEDIATE").await.unwrap();
    let mut second = on("run", &db, &conversation);
    second.extend(["--model", &model, "--busy-timeout", "1s", "--json", "again"]);
    let started = std::time::Instant::now();
    let second: Vec<String> = second.into_iter().map(str::to_owned).collect();
    let busy = tokio::task::spawn_blocking(move || {
        turnstile(&second.iter().map(String::as_str).collect::<Vec<_>>())
    });
    let busy = busy.await.unwrap();
    holder.execute("ROLLBACK").await.unwrap();
    let doc = busy.assert_json_error(3, "busy");
    assert_eq!(doc["kind"], "locked", "{doc}");
    assert_eq!(doc["conversation_id"], conversation.as_str(), "{doc}");
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    let version = open(&db)
        .await
        .conversation(
            &turnstile::Namespace::new("default").unwrap(),
            conversation.parse().unwrap(),
        )
        .await
        .unwrap()
        .version;
    assert_eq!(version, 1, "the refused request wrote nothing");
}

#[tokio::test]
async fn a_write_lock_taken_mid_run_says_what_was_kept_and_the_resume_continues_it() {
    use sqlx::{Connection, Executor};
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("midrun.db");
    let conversation = uuid();
    // Turn 1's answer takes three seconds: the lock is taken meanwhile.
    let model = scripted(&script(
        dir.path(),
        "pause.json",
        json!([
            {"tool_calls": [{"id": "c1", "name": "add", "arguments": {"a": 2, "b": 3}}],
             "usage": {"input_tokens": 10, "output_tokens": 5}, "delay_ms": 3000},
            {"text": "2 + 3 = 5", "usage": {"input_tokens": 20, "output_tokens": 4}}
        ]),
    ));
    let mut run = on("run", &db, &conversation);
    run.extend(["--model", &model, "--busy-timeout", "1s", INPUT]);
    let mut child = cli_support::command(&run)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut seen = String::new();
    while !seen.contains("write-ahead checkpoint saved") {
        let mut line = String::new();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "{seen}");
        seen.push_str(&line);
    }
    let mut holder = sqlx::SqliteConnection::connect(&format!("sqlite:{}", db.display()))
        .await
        .unwrap();
    holder.execute("BEGIN IMMEDIATE").await.unwrap();
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    holder.execute("ROLLBACK").await.unwrap();
    drop(holder);
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    let line = errors[0];
    assert!(line.starts_with("error: busy"), "{line}");
    assert!(
        !line.contains("nothing was written"),
        "the run's first turn was written: {line}"
    );
    assert!(line.contains("earlier steps are kept"), "{line}");
    // The request id was generated, so the line ends with it.
    let (_, after) = line
        .split_once("continue it with: ")
        .expect("the command that continues it");
    let (resume, _) = after.rsplit_once(" (request ").unwrap();
    let resumed = cli_support::pasted(resume);
    resumed.assert_success();
    assert!(
        resumed.stdout.contains("answer      2 + 3 = 5"),
        "{resumed:#?}"
    );
}

#[test]
fn a_busy_timeout_past_what_sqlite_takes_is_clamped_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("patient.db");
    let conversation = uuid();
    let model = scripted(&add_script(dir.path()));
    let mut run = on("run", &db, &conversation);
    run.extend([
        "--model",
        &model,
        "--busy-timeout",
        "400days",
        "--json",
        INPUT,
    ]);
    let patient = turnstile(&run);
    patient.assert_success();
    assert!(patient.stderr.is_empty(), "{patient:#?}");
}
