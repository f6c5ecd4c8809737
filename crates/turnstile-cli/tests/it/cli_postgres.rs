//! The command line on PostgreSQL: `--db postgres://…` through the built
//! binary, against a real throwaway server (`turnstile-test-postgres`, or
//! the one in `TURNSTILE_TEST_POSTGRES_URL`). Each test works in a fresh
//! database of its own; the state commands leave is read back through
//! `PostgresStore` or psql.

use std::path::Path;

use crate::cli_support::{
    add_script, command, pasted, printed, run_and_kill_at, script, scripted, turnstile, uuid, Run,
};
use serde_json::{json, Value};
use turnstile::store::{Admission, RequestStatus, RunStatus};
use turnstile::{ConversationId, PostgresStore, RequestId, RunId, Store};
use turnstile_test_postgres::Server;

const INPUT: &str = "what is 2 + 3?";

/// A new empty database on the shared server: `(name, url)`.
fn fresh() -> (String, String) {
    Server::shared().fresh_database_named()
}

/// A session command on `db` and `conversation`.
fn on<'a>(command: &'a str, db: &'a str, conversation: &'a str) -> Vec<&'a str> {
    vec![command, "--db", db, "--conversation", conversation]
}

/// An operations command on `db`, with `--json`, which must succeed.
fn ops(args: &[&str], db: &str) -> Value {
    let mut all = args.to_vec();
    all.extend(["--db", db, "--json"]);
    let run = turnstile(&all);
    run.assert_success();
    run.json()
}

/// Runs `INPUT` as a new request and returns the outcome.
fn commit(db: &str, conversation: &str, model: &str) -> Value {
    let mut args = on("run", db, conversation);
    args.extend(["--model", model, "--json", INPUT]);
    let run = turnstile(&args);
    run.assert_success();
    run.json()
}

/// A script whose second answer fails (once per process): the run stops
/// after its first turn, keeping the admission.
fn failing_script(dir: &Path) -> String {
    scripted(&script(
        dir,
        "failing.json",
        json!([
            {"tool_calls": [{"id": "c1", "name": "add", "arguments": {"a": 2, "b": 3}}],
             "usage": {"input_tokens": 10, "output_tokens": 5}},
            {"text": "2 + 3 = 5", "usage": {"input_tokens": 20, "output_tokens": 4},
             "failure": "upstream overloaded", "fail_times": 1}
        ]),
    ))
}

/// A script whose first answer takes a minute.
fn slow_script(dir: &Path) -> String {
    scripted(&script(
        dir,
        "slow.json",
        json!([
            {"tool_calls": [{"id": "c1", "name": "add", "arguments": {"a": 2, "b": 3}}],
             "usage": {"input_tokens": 10, "output_tokens": 5}, "delay_ms": 60000},
            {"text": "2 + 3 = 5", "usage": {"input_tokens": 20, "output_tokens": 4}}
        ]),
    ))
}

async fn store(url: &str) -> PostgresStore {
    PostgresStore::connect(url)
        .await
        .expect("connect to the test database")
}

async fn admission(url: &str, conversation: &str) -> Admission {
    let store = store(url).await;
    let admission = store
        .admission(conversation.parse().unwrap())
        .await
        .unwrap();
    store.close().await;
    admission
}

/// Whether database `name` has turnstile's tables.
fn has_schema(name: &str) -> bool {
    Server::shared().psql(name, "SELECT to_regclass('_sqlx_migrations') IS NOT NULL") == "t"
}

/// A URL of the shared server's port where nothing listens.
fn nothing_listening() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("postgres://turnstile:not-a-secret@127.0.0.1:{port}/postgres")
}

fn assert_no_panic(run: &Run) {
    assert!(!run.stderr.contains("panicked"), "{run:#?}");
}

#[tokio::test]
async fn run_then_ls_show_checkpoints_and_export_read_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let (name, url) = fresh();
    let conversation = uuid();
    let fast = scripted(&add_script(dir.path()));
    let outcome = commit(&url, &conversation, &fast);
    assert_eq!(outcome["final_text"], "2 + 3 = 5");
    assert_eq!(outcome["tool_calls"], 1);
    assert!(has_schema(&name), "run creates the schema");
    let run_id = outcome["run_id"].as_str().unwrap();

    // `postgresql://` is the same server.
    let alias = url.replacen("postgres://", "postgresql://", 1);
    let conversations = ops(&["ls", "conversations"], &alias)["conversations"].clone();
    assert_eq!(
        conversations[0]["conversation_id"],
        conversation.as_str(),
        "{conversations:#}"
    );
    assert_eq!(conversations[0]["version"], 1);
    assert_eq!(conversations[0]["held"], Value::Null);
    let requests = ops(&["ls", "requests"], &url)["requests"].clone();
    assert_eq!(requests[0]["request_id"], outcome["request_id"]);
    assert_eq!(requests[0]["status"], "completed");
    let runs = ops(&["ls", "runs"], &url)["runs"].clone();
    assert_eq!(runs[0]["run_id"], run_id);

    let shown = ops(&["show", &conversation], &url);
    assert_eq!(shown["conversation"]["transcript_entries"], 4);
    assert_eq!(shown["transcript"][3]["message"]["content"], "2 + 3 = 5");
    let human = turnstile(&["show", &conversation, "--db", &url]);
    human.assert_success();
    assert!(human.stdout.contains("#2  tool       [c1] 5"), "{human:#?}");

    let checkpoints = ops(&["checkpoints", run_id], &url);
    assert_eq!(checkpoints["run"]["status"], "completed");
    let phases: Vec<&Value> = checkpoints["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["phase"])
        .collect();
    assert_eq!(phases, [&json!("ready"), &json!("completed")]);

    let export = turnstile(&["export", &conversation, "--db", &url]);
    export.assert_success();
    let lines: Vec<Value> = export
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let store = store(&url).await;
    let id: ConversationId = conversation.parse().unwrap();
    let transcript = store.transcript_range(id, 0, u64::MAX).await.unwrap();
    store.close().await;
    let expected: Vec<Value> = transcript
        .iter()
        .map(|e| json!({"seq": e.seq, "request_id": e.request_id, "message": e.message}))
        .collect();
    assert_eq!(lines, expected);

    // The same request again replays.
    let request = outcome["request_id"].as_str().unwrap();
    let mut again = on("run", &url, &conversation);
    again.extend(["--request", request, "--model", &fast, "--json", INPUT]);
    let replay = turnstile(&again);
    replay.assert_success();
    assert_eq!(replay.json()["replayed"], true);
}

#[tokio::test]
async fn a_failed_run_is_resumed_by_a_second_process_with_usage_carried_over() {
    let dir = tempfile::tempdir().unwrap();
    let (_, url) = fresh();
    let conversation = uuid();
    let request = RequestId::new().to_string();
    let failing = failing_script(dir.path());
    let mut run = on("run", &url, &conversation);
    run.extend(["--request", &request, "--model", &failing, INPUT]);
    let failed = turnstile(&run);
    assert_eq!(failed.code, 1, "{failed:#?}");
    assert_eq!(failed.stderr.lines().count(), 1, "{failed:#?}");
    assert!(failed.stderr.contains("upstream overloaded"), "{failed:#?}");

    let held = admission(&url, &conversation).await;
    let active = held
        .active
        .clone()
        .expect("a failed run keeps the admission");
    let hint = format!(
        "turnstile resume {} --revision {} --db {url} --conversation {conversation}",
        active.run_id, held.revision
    );
    assert!(failed.stderr.contains(&hint), "{hint}\n{failed:#?}");

    // Another process: a second request is busy, the resume finishes it.
    let fast = scripted(&add_script(dir.path()));
    let mut other = on("run", &url, &conversation);
    other.extend(["--model", &fast, "--json", "something else"]);
    let doc = turnstile(&other).assert_json_error(3, "busy");
    assert_eq!(doc["revision"], held.revision.0, "{doc}");
    assert_eq!(
        doc["holder_request_id"],
        active.request_id.to_string(),
        "{doc}"
    );
    let run_id = active.run_id.to_string();
    let revision = held.revision.to_string();
    let mut resume = on("resume", &url, &conversation);
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
    assert_eq!(outcome["usage"]["input_tokens"], 30, "usage carried over");

    let store = store(&url).await;
    let record = store
        .request(request.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, RequestStatus::Completed);
    let new_run: RunId = outcome["run_id"].as_str().unwrap().parse().unwrap();
    let new_run = store.run(new_run).await.unwrap().unwrap();
    assert_eq!(new_run.resumed_from, Some(active.run_id));
    store.close().await;
}

#[tokio::test]
async fn a_killed_run_is_recovered_by_a_second_process() {
    let dir = tempfile::tempdir().unwrap();
    let (_, url) = fresh();
    let conversation = uuid();
    let request = RequestId::new().to_string();
    let slow = slow_script(dir.path());
    let mut args = on("run", &url, &conversation);
    args.extend(["--request", &request, "--model", &slow, INPUT]);
    run_and_kill_at(&args, "turn 1 · write-ahead checkpoint saved");
    let held = admission(&url, &conversation).await;
    let active = held
        .active
        .clone()
        .expect("the killed run holds the admission");
    let revision = held.revision.to_string();

    let stuck =
        ops(&["ls", "requests", "--stuck", "--stale-after", "0s"], &url)["requests"].clone();
    assert_eq!(stuck[0]["request_id"], request.as_str(), "{stuck:#}");

    let fast = scripted(&add_script(dir.path()));
    let mut recover = on("recover", &url, &conversation);
    recover.extend([request.as_str(), "--revision", &revision, "--model", &fast]);
    let mut refused = recover.clone();
    refused.push(INPUT);
    turnstile(&refused).assert_error(5, "in flight");
    recover.extend(["--retry-interrupted", "--json", INPUT]);
    let recovered = turnstile(&recover);
    recovered.assert_success();
    assert_eq!(recovered.json()["final_text"], "2 + 3 = 5");

    let store = store(&url).await;
    let killed = store.run(active.run_id).await.unwrap().unwrap();
    assert_eq!(killed.status, RunStatus::Superseded);
    assert!(store
        .admission(conversation.parse().unwrap())
        .await
        .unwrap()
        .active
        .is_none());
    store.close().await;
}

#[tokio::test]
async fn abandon_releases_the_admission_and_burns_the_request() {
    let dir = tempfile::tempdir().unwrap();
    let (_, url) = fresh();
    let conversation = uuid();
    let request = RequestId::new().to_string();
    let mut run = on("run", &url, &conversation);
    let failing = failing_script(dir.path());
    run.extend(["--request", &request, "--model", &failing, INPUT]);
    assert_eq!(turnstile(&run).code, 1);
    let held = admission(&url, &conversation).await;

    let stale = (held.revision.0 + 7).to_string();
    let mut wrong = on("abandon", &url, &conversation);
    wrong.extend([request.as_str(), "--revision", &stale]);
    turnstile(&wrong).assert_error(5, "conflict");

    let revision = held.revision.to_string();
    let mut abandon = on("abandon", &url, &conversation);
    abandon.extend([request.as_str(), "--revision", &revision, "--json"]);
    let done = turnstile(&abandon);
    done.assert_success();
    assert_eq!(done.json()["revision"], held.revision.0 + 1);
    assert!(admission(&url, &conversation).await.active.is_none());

    let fast = scripted(&add_script(dir.path()));
    let mut reuse = on("run", &url, &conversation);
    reuse.extend(["--request", &request, "--model", &fast, INPUT]);
    turnstile(&reuse).assert_error(2, "abandoned");
}

#[tokio::test]
async fn prune_counts_in_a_dry_run_then_trims_old_finished_requests() {
    let dir = tempfile::tempdir().unwrap();
    let (name, url) = fresh();
    let fast = scripted(&add_script(dir.path()));
    let conversation = uuid();
    commit(&url, &conversation, &fast);
    // A failed run, then a resume: the failed run is what no replay needs.
    let request = RequestId::new().to_string();
    let mut run = on("run", &url, &conversation);
    let failing = failing_script(dir.path());
    run.extend(["--request", &request, "--model", &failing, INPUT]);
    assert_eq!(turnstile(&run).code, 1);
    let held = admission(&url, &conversation).await;
    let (run_id, revision) = (
        held.active.unwrap().run_id.to_string(),
        held.revision.to_string(),
    );
    let mut resume = on("resume", &url, &conversation);
    resume.extend([run_id.as_str(), "--revision", &revision, "--model", &fast]);
    turnstile(&resume).assert_success();
    let runs = || Server::shared().psql(&name, "SELECT COUNT(*) FROM all_runs");
    assert_eq!(runs(), "3");

    let dry = ops(&["prune", "--older-than", "0s", "--dry-run"], &url);
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["deleted"]["runs"], 1, "{dry:#}");
    assert_eq!(runs(), "3", "a dry run deletes nothing");
    let report = ops(&["prune", "--older-than", "0s"], &url);
    assert_eq!(report["deleted"], dry["deleted"]);
    assert_eq!(report["requests_examined"], 2);
    assert_eq!(runs(), "2");
    assert!(report["database_bytes_after"].as_u64().unwrap() > 0);

    let human = turnstile(&["prune", "--db", &url, "--older-than", "7d"]);
    human.assert_success();
    assert!(human.stdout.contains("tables"), "{human:#?}");
}

#[tokio::test]
async fn doctor_reports_the_server_schema_tables_and_admissions() {
    let dir = tempfile::tempdir().unwrap();
    let (_, url) = fresh();
    let conversation = uuid();
    let request = RequestId::new().to_string();
    let mut run = on("run", &url, &conversation);
    let failing = failing_script(dir.path());
    run.extend(["--request", &request, "--model", &failing, INPUT]);
    assert_eq!(turnstile(&run).code, 1);

    let report = ops(&["doctor", "--stale-after", "1h"], &url);
    let server = report["server_version"].as_str().unwrap();
    assert!(server.starts_with("15"), "{report:#}");
    assert_eq!(report["schema"], "public");
    assert_eq!(report["integrity_ok"], true);
    assert_eq!(report["integrity"], json!(["ok"]));
    assert_eq!(report["cannot_open"], Value::Null);
    assert_eq!(report["schema_version"], report["supported_schema_version"]);
    let tables = report["table_bytes"].as_object().unwrap();
    for table in [
        "conversations",
        "admissions",
        "transcript",
        "requests",
        "runs",
    ] {
        assert!(tables[table].as_u64().unwrap() > 0, "{table}: {report:#}");
    }
    let total: u64 = tables.values().map(|n| n.as_u64().unwrap()).sum();
    assert_eq!(report["database_bytes"], total);
    assert_eq!(report["held_admissions"], 1);
    assert_eq!(report["stuck_admissions"], 1, "its run failed");
    assert_eq!(report["not_checked"], json!([]));
    assert!(!report["location"].as_str().unwrap().contains("password"));

    let human = turnstile(&["doctor", "--db", &url]);
    human.assert_success();
    let row = |key: &str| {
        let line = human.stdout.lines().find(|line| line.starts_with(key));
        line.map_or("", |line| line[key.len()..].trim())
    };
    assert!(row("server ").starts_with("PostgreSQL 15"), "{human:#?}");
    assert_eq!(row("integrity "), "ok", "{human:#?}");
    assert!(
        row("admissions ").starts_with("1 held · 1 stuck"),
        "{human:#?}"
    );
    assert!(row("  transcript ").ends_with("KiB)"), "{human:#?}");
}

#[tokio::test]
async fn demo_runs_on_a_server() {
    let (name, url) = fresh();
    let run = turnstile(&["demo", "--db", &url, "--json"]);
    run.assert_success();
    let report = run.json();
    assert_eq!(report["database"], url.as_str());
    assert_eq!(report["totals"]["requests_committed"], 2);
    assert_eq!(report["recovered"]["worker_signal"], 9);
    assert_eq!(report["replay"]["replayed"], true);
    assert!(report["database_bytes"].as_u64().unwrap() > 0);
    assert_eq!(
        Server::shared().psql(
            &name,
            "SELECT COUNT(*) FROM requests WHERE status = 'completed'"
        ),
        "2"
    );
    turnstile(&["demo", "--db", &url, "--fresh"]).assert_error(2, "--fresh");
}

#[tokio::test]
async fn a_password_in_the_url_is_never_printed() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::shared();
    let (name, url) = fresh();
    // The shared cluster trusts loopback, so the password is not checked:
    // what matters is that no output ever shows it.
    let password = format!("pw-{}", uuid().replace('-', ""));
    let role = format!("cli_{}", name.trim_start_matches("turnstile_test_"));
    server.psql(
        "postgres",
        &format!("CREATE ROLE {role} LOGIN PASSWORD '{password}'"),
    );
    server.psql(
        "postgres",
        &format!("ALTER DATABASE {name} OWNER TO {role}"),
    );
    let plain = url.replacen("postgres://turnstile@", &format!("postgres://{role}@"), 1);
    let secret = plain.replacen(&format!("{role}@"), &format!("{role}:{password}@"), 1);
    let in_query = format!("{plain}?sslmode=disable&password={password}");
    let mut runs: Vec<Run> = Vec::new();

    let conversation = uuid();
    let fast = scripted(&add_script(dir.path()));
    let failing = failing_script(dir.path());
    let mut ok = on("run", &secret, &conversation);
    ok.extend(["--model", &fast, INPUT]);
    runs.push(turnstile(&ok));
    runs.last().unwrap().assert_success();

    // A failure with its resume hint: the URL in it has no password, and
    // pastes and runs (the password then comes from PGPASSWORD or .pgpass).
    let mut failed = on("run", &in_query, &conversation);
    failed.extend(["--model", &failing, INPUT]);
    runs.push(turnstile(&failed));
    let stopped = runs.last().unwrap();
    assert_eq!(stopped.code, 1, "{stopped:#?}");
    let hinted = format!("--db '{plain}?sslmode=disable' --conversation");
    assert!(stopped.stderr.contains(&hinted), "{hinted}\n{stopped:#?}");
    let held = admission(&plain, &conversation).await;
    let (run_id, revision) = (
        held.active.unwrap().run_id.to_string(),
        held.revision.to_string(),
    );
    let with_pgpassword = command(&[
        "resume",
        &run_id,
        "--revision",
        &revision,
        "--db",
        &format!("{plain}?sslmode=disable"),
        "--conversation",
        &conversation,
        "--model",
        &fast,
    ])
    .env("PGPASSWORD", &password)
    .output()
    .unwrap();
    assert!(with_pgpassword.status.success(), "{with_pgpassword:?}");

    for args in [
        vec!["ls", "conversations", "--db", &secret],
        vec!["ls", "runs", "--db", &in_query, "--json"],
        vec!["show", &conversation, "--db", &secret],
        vec!["doctor", "--db", &secret],
        vec!["doctor", "--db", &in_query, "--json"],
        vec!["prune", "--db", &secret, "--older-than", "7d", "--dry-run"],
    ] {
        runs.push(turnstile(&args));
        runs.last().unwrap().assert_success();
    }
    runs.push(turnstile(&["demo", "--db", &secret]));
    runs.last().unwrap().assert_success();
    assert!(runs.last().unwrap().stdout.contains(&plain));

    // Logging on, and errors of every kind.
    let logged = command(&["ls", "runs", "--db", &secret])
        .env("RUST_LOG", "debug")
        .output()
        .unwrap();
    runs.push(Run {
        code: logged.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&logged.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&logged.stderr).into_owned(),
    });
    let nowhere = nothing_listening().replace("not-a-secret", &password);
    let missing = secret.replacen(&format!("/{name}"), "/no_such_database", 1);
    let bad_port = secret.replacen("@127.0.0.1:", "@127.0.0.1:x", 1);
    let unknown = format!("{secret}?passwd={password}");
    for (args, code) in [
        (vec!["ls", "runs", "--db", &nowhere], 1),
        (vec!["doctor", "--db", &nowhere, "--json"], 7),
        (vec!["ls", "runs", "--db", &missing], 4),
        (vec!["ls", "runs", "--db", &bad_port], 2),
        (vec!["ls", "runs", "--db", &unknown], 2),
        (
            vec![
                "run",
                "--db",
                &secret,
                "--conversation",
                &conversation,
                "--model",
                &fast,
                "--max-db-bytes",
                "1000000",
                INPUT,
            ],
            2,
        ),
        (
            vec![
                "abandon",
                &uuid(),
                "--revision",
                "1",
                "--db",
                &secret,
                "--conversation",
                &conversation,
            ],
            4,
        ),
    ] {
        let run = turnstile(&args);
        assert_eq!(run.code, code, "{args:?}: {run:#?}");
        runs.push(run);
    }
    for run in &runs {
        assert_no_panic(run);
        assert!(
            !run.stdout.contains(&password) && !run.stderr.contains(&password),
            "the password is printed: {run:#?}"
        );
    }
    // No role is left behind on a long-lived server (TURNSTILE_TEST_POSTGRES_URL).
    server.psql(&name, &format!("REASSIGN OWNED BY {role} TO CURRENT_USER"));
    server.psql(&name, &format!("DROP OWNED BY {role}"));
    server.psql("postgres", &format!("DROP ROLE {role}"));
}

#[tokio::test]
async fn a_call_awaiting_approval_is_listed_approved_and_resumed_on_a_server() {
    let dir = tempfile::tempdir().unwrap();
    let (_, url) = fresh();
    // The shared cluster trusts loopback: the password is not checked, and
    // must never be printed.
    let password = format!("pw-{}", uuid().replace('-', ""));
    let join = if url.contains('?') { '&' } else { '?' };
    let secret = format!("{url}{join}password={password}");
    let conversation = uuid();
    let model = scripted(&add_script(dir.path()));
    let mut run = on("run", &secret, &conversation);
    run.extend(["--model", &model, "--require-approval", "add", INPUT]);
    let stopped = turnstile(&run);
    assert_eq!(stopped.code, 6, "{stopped:#?}");
    assert!(
        stopped.stdout.contains("call c1 · add {\"a\":2,\"b\":3}"),
        "{stopped:#?}"
    );
    let approve = printed(&stopped, "turnstile approve ");
    assert!(approve.contains(&url), "{approve}");

    let listed = turnstile(&["approvals", "--db", &secret, "--json"]);
    listed.assert_success();
    let calls = listed.json()["approvals"].clone();
    assert_eq!(calls.as_array().unwrap().len(), 1, "{calls:#}");
    assert_eq!(calls[0]["call_id"], "c1");
    let held = admission(&url, &conversation).await;
    assert_eq!(calls[0]["revision"], held.revision.0);
    // Waiting for a human is not stuck, on a server too.
    assert_eq!(
        ops(&["ls", "requests", "--stuck"], &url)["requests"].clone(),
        json!([])
    );
    let report = ops(&["doctor"], &url);
    assert_eq!(report["held_admissions"], 1, "{report:#}");
    assert_eq!(report["stuck_admissions"], 0, "{report:#}");
    assert_eq!(report["awaiting_approval_admissions"], 1, "{report:#}");

    let approved = pasted(approve);
    approved.assert_success();
    let resume = printed(&approved, "turnstile resume ");
    let resumed = pasted(resume);
    resumed.assert_success();
    assert!(
        resumed.stdout.contains("✓ add {\"a\":2,\"b\":3} → 5"),
        "{resumed:#?}"
    );
    assert!(
        resumed.stdout.contains("answer      2 + 3 = 5"),
        "{resumed:#?}"
    );
    assert!(admission(&url, &conversation).await.active.is_none());
    let none = turnstile(&["approvals", "--db", &secret]);
    none.assert_success();
    assert_eq!(none.stdout, "no tool calls await approval\n");
    for run in [&stopped, &listed, &approved, &resumed, &none] {
        assert_no_panic(run);
        assert!(
            !run.stdout.contains(&password) && !run.stderr.contains(&password),
            "the password is printed: {run:#?}"
        );
    }
}

#[tokio::test]
async fn a_server_gone_mid_run_is_unreachable_not_busy_and_the_printed_command_continues_it() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_own();
    let url = server.fresh_database();
    let conversation = uuid();
    let request = RequestId::new().to_string();
    // Turn 1's answer takes three seconds: the server is stopped meanwhile.
    let model = scripted(&script(
        dir.path(),
        "pause.json",
        json!([
            {"tool_calls": [{"id": "c1", "name": "add", "arguments": {"a": 2, "b": 3}}],
             "usage": {"input_tokens": 10, "output_tokens": 5}, "delay_ms": 3000},
            {"text": "2 + 3 = 5", "usage": {"input_tokens": 20, "output_tokens": 4}}
        ]),
    ));
    let mut run = on("run", &url, &conversation);
    run.extend(["--request", &request, "--model", &model]);
    run.extend(["--busy-timeout", "1s", INPUT]);
    let mut child = command(&run)
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
    server.stop_immediate();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(
        output.status.code(),
        Some(1),
        "unreachable, not busy: {stderr}"
    );
    // Logged warnings (the server's shutdown notices) may come before it.
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    let stderr = errors[0];
    assert!(!stderr.starts_with("error: busy"), "{stderr}");
    assert!(!stderr.contains("write lock"), "{stderr}");
    assert!(!stderr.contains("nothing was written"), "{stderr}");
    assert!(stderr.contains("could not be reached"), "{stderr}");
    assert!(stderr.contains("may have written"), "{stderr}");
    let command_line = stderr
        .split("continue it with: ")
        .nth(1)
        .expect("the command that continues it");
    assert!(
        command_line.starts_with("turnstile resume ")
            && command_line.contains(" --retry-interrupted"),
        "{stderr}"
    );

    // Once the server is back, the printed command finishes the request.
    server.restart();
    let resumed = pasted(command_line);
    resumed.assert_success();
    assert!(
        resumed.stdout.contains("answer      2 + 3 = 5"),
        "{resumed:#?}"
    );
    let store = store(&url).await;
    let record = store
        .request(request.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, RequestStatus::Completed);
}

#[test]
fn a_server_that_is_not_there_is_one_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let url = nothing_listening();
    let conversation = uuid();
    let fast = scripted(&add_script(dir.path()));
    let mut run = on("run", &url, &conversation);
    run.extend(["--model", &fast, INPUT]);
    for args in [
        run,
        vec!["ls", "conversations", "--db", &url],
        vec!["export", &conversation, "--db", &url],
    ] {
        let failed = turnstile(&args);
        failed.assert_error(1, "cannot connect to postgres://turnstile@127.0.0.1:");
        assert!(failed.stderr.contains("refused"), "{failed:#?}");
        assert_no_panic(&failed);
    }
    turnstile(&["doctor", "--db", &url]).assert_error(7, "cannot open");
    let json = turnstile(&["doctor", "--db", &url, "--json"]);
    assert_eq!(json.code, 7, "{json:#?}");
    let report = json.json();
    assert_eq!(report["integrity_ok"], Value::Null);
    assert!(
        report["cannot_open"].as_str().unwrap().contains("refused"),
        "{report:#}"
    );
}

#[test]
fn read_commands_on_a_database_without_the_schema_are_not_found_and_create_nothing() {
    let (name, url) = fresh();
    let conversation = uuid();
    let run = RunId::new().to_string();
    for args in [
        vec!["ls", "requests", "--db", &url],
        vec!["show", &conversation, "--db", &url],
        vec!["checkpoints", &run, "--db", &url],
        vec!["export", &conversation, "--db", &url],
        vec!["approvals", "--db", &url],
        vec!["doctor", "--db", &url],
    ] {
        turnstile(&args).assert_error(4, "no turnstile schema");
    }
    assert!(!has_schema(&name), "nothing created");
    // A database the server does not have is not found either.
    let missing = url.replacen(&format!("/{name}"), "/no_such_database", 1);
    turnstile(&["ls", "runs", "--db", &missing]).assert_error(4, "not found");
    turnstile(&["doctor", "--db", &missing]).assert_error(4, "not found");
}

#[test]
fn bench_runs_on_the_server_against_a_bare_commit_baseline() {
    let (name, url) = fresh();
    let run = turnstile(&[
        "bench",
        "--db",
        &url,
        "--conversations",
        "64",
        "--turns",
        "1",
        "--message-bytes",
        "100",
        "--json",
    ]);
    run.assert_success();
    let report = run.json();
    assert_eq!(report["backend"], "postgres");
    assert_eq!(report["workload"]["concurrency"], json!([1, 8, 64]));
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3, "{report:#}");
    for (run, concurrency) in runs.iter().zip([1, 8, 64]) {
        assert_eq!(run["concurrency"], concurrency);
        assert_eq!(run["turns"], 64);
        assert!(run["turns_per_second"].as_f64().unwrap() > 0.0);
        assert!(run["turn_latency"]["p50_ms"].as_f64().unwrap() > 0.0);
        assert!(run["storage"]["bytes_per_message_byte"].as_f64().unwrap() > 1.0);
        // As many requests timed step by step as the workload's.
        for step in ["claim_context", "claim", "commit"] {
            assert_eq!(run["steps"][step]["samples"], 64, "{report:#}");
            assert!(run["steps"][step]["p50_ms"].as_f64().unwrap() > 0.0);
        }
    }
    let baseline = &report["baseline"];
    for (which, connections) in [("single_connection", 1), ("concurrent", 64)] {
        let commits = &baseline[which];
        assert_eq!(commits["connections"], connections, "{report:#}");
        assert!(commits["commits"].as_u64().unwrap() >= 100);
        assert!(commits["commits_per_second"].as_f64().unwrap() > 0.0);
        assert!(commits["latency"]["p50_ms"].as_f64().unwrap() > 0.0);
    }
    let ratios = &report["ratios"];
    assert!(
        ratios["turn_p50_over_commit_p50"].as_f64().unwrap() > 0.0,
        "{report:#}"
    );
    assert!(
        ratios["turns_per_second_over_commits_per_second"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert_eq!(ratios["at_concurrency"], 64);
    assert_eq!(report["schemas_dropped"], true);
    let left = Server::shared().psql(
        &name,
        "SELECT COUNT(*) FROM pg_namespace WHERE nspname LIKE 'turnstile_bench_%'",
    );
    assert_eq!(left, "0", "every bench schema is dropped");

    // --concurrency and --durability are SQLite's; the levels are fixed.
    turnstile(&["bench", "--db", &url, "--concurrency", "2"]).assert_error(2, "--concurrency");
    turnstile(&["bench", "--db", &url, "--durability", "normal"]).assert_error(2, "--durability");
}
