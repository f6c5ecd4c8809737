//! Human approval of tool calls from a shell: `run --require-approval`
//! stops with exit 6 and prints the calls and the commands that decide them;
//! `approvals` lists them, `approve` / `reject` decide them (each printing
//! the new revision and the next command) and `resume` / `recover` finish
//! the request.

use std::path::Path;

use serde_json::{json, Value};
use turnstile::RequestId;

use crate::cli_support::{admission, pasted, printed, script, scripted, turnstile, uuid};

const INPUT: &str = "add 2 and 3, and count two words";

/// The arguments of a command on `db` and `conversation`.
fn on<'a>(command: &'a str, db: &'a Path, conversation: &'a str) -> Vec<&'a str> {
    vec![
        command,
        "--db",
        db.to_str().unwrap(),
        "--conversation",
        conversation,
    ]
}

/// Turn 1 asks for `add` (c1) and `word_count` (c2); turn 2 answers.
fn two_calls(dir: &Path) -> String {
    scripted(&script(
        dir,
        "two.json",
        json!([
            {"tool_calls": [
                {"id": "c1", "name": "add", "arguments": {"a": 2, "b": 3}},
                {"id": "c2", "name": "word_count", "arguments": {"text": "one two"}}
             ],
             "usage": {"input_tokens": 10, "output_tokens": 5}},
            {"text": "done", "usage": {"input_tokens": 20, "output_tokens": 4}}
        ]),
    ))
}

/// The transcript's tool messages, as `export` writes them.
fn tool_messages(db: &Path, conversation: &str) -> Vec<Value> {
    let export = turnstile(&["export", conversation, "--db", db.to_str().unwrap()]);
    export.assert_success();
    export
        .stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["message"].clone())
        .filter(|m| m["role"] == "tool")
        .collect()
}

fn pending(db: &Path) -> Vec<Value> {
    let listed = turnstile(&["approvals", "--db", db.to_str().unwrap(), "--json"]);
    listed.assert_success();
    let listed = listed.json();
    assert_eq!(listed["next"], Value::Null, "{listed}");
    listed["approvals"].as_array().unwrap().clone()
}

#[tokio::test]
async fn an_approved_call_runs_once_when_the_request_is_resumed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("approve.db");
    let conversation = uuid();
    let request = RequestId::new().to_string();
    let model = two_calls(dir.path());

    let mut run = on("run", &db, &conversation);
    run.extend([
        "--request",
        &request,
        "--model",
        &model,
        "--require-approval",
        "add",
        INPUT,
    ]);
    let stopped = turnstile(&run);
    assert_eq!(stopped.code, 6, "{stopped:#?}");
    let errors: Vec<&str> = stopped.stderr.lines().collect();
    assert_eq!(errors.len(), 1, "{stopped:#?}");
    assert!(errors[0].starts_with("error: "), "{stopped:#?}");
    assert!(errors[0].contains("awaits approval"), "{stopped:#?}");
    assert!(errors[0].contains(r#""c1" (add)"#), "{stopped:#?}");
    let held = admission(&db, &conversation).await;
    let active = held
        .active
        .clone()
        .expect("the request holds the admission");
    let revision = held.revision.to_string();
    for expected in [
        // The call that needs no approval ran; the other waits.
        "✓ word_count {\"text\":\"one two\"} → 2",
        "? add {\"a\":2,\"b\":3} · awaits approval (call c1)",
        &format!(
            "awaiting approval · request {request} · run {} · revision {revision} · 1 tool call",
            active.run_id
        ),
        "  call c1 · add {\"a\":2,\"b\":3}",
        "each decision prints the new revision and the next command",
    ] {
        assert!(
            stopped.stdout.contains(expected),
            "{expected:?} in {stopped:#?}"
        );
    }
    assert!(!stopped.stdout.contains("✓ add"), "{stopped:#?}");
    let approve = printed(&stopped, "turnstile approve ");
    let reject = printed(&stopped, "turnstile reject ");
    let decided = format!("{request} c1 --revision {revision} --db ");
    assert!(approve.contains(&decided), "{approve}");
    assert!(reject.contains(&decided), "{reject}");
    assert!(approve.ends_with("--require-approval add"), "{approve}");
    // The reason is the user's to write: pasted as printed, the rejection
    // is refused (2) and nothing is decided.
    assert!(
        reject.ends_with("--require-approval add --reason"),
        "{reject}"
    );
    let unwritten = pasted(reject);
    assert_eq!(unwritten.code, 2, "{unwritten:#?}");
    assert!(unwritten.stderr.contains("--reason"), "{unwritten:#?}");
    assert!(unwritten.stdout.is_empty(), "{unwritten:#?}");
    assert_eq!(admission(&db, &conversation).await, held, "nothing decided");
    assert_eq!(pending(&db).len(), 1);

    // `approvals --json`: the call, with what deciding needs.
    let calls = pending(&db);
    assert_eq!(calls.len(), 1, "{calls:#?}");
    let call = &calls[0];
    assert_eq!(call["request_id"], request.as_str());
    assert_eq!(call["run_id"], active.run_id.to_string().as_str());
    assert_eq!(call["conversation_id"], conversation.as_str());
    assert_eq!(call["call_id"], "c1");
    assert_eq!(call["tool"], "add");
    assert_eq!(call["arguments"], r#"{"a":2,"b":3}"#);
    assert_eq!(call["revision"], held.revision.0);
    assert_eq!(call["turn"], 1);
    // Human: the call and the commands, on this conversation only too.
    let mut human = vec!["approvals", "--db", db.to_str().unwrap()];
    human.extend(["--conversation", &conversation]);
    let listed = turnstile(&human);
    listed.assert_success();
    assert!(
        listed
            .stdout
            .contains("call c1 · add {\"a\":2,\"b\":3} · asked "),
        "{listed:#?}"
    );
    assert!(
        printed(&listed, "turnstile approve ").contains(&decided),
        "{listed:#?}"
    );

    // A stale revision: the state moved (5), nothing changes.
    let stale = (held.revision.0 - 1).to_string();
    let mut conflict = on("approve", &db, &conversation);
    conflict.extend([request.as_str(), "c1", "--revision", &stale]);
    turnstile(&conflict).assert_error(5, "conflict");
    // A call that awaits no decision: 5 too. An unknown request: 4.
    let mut unknown_call = on("approve", &db, &conversation);
    unknown_call.extend([request.as_str(), "c2", "--revision", &revision]);
    turnstile(&unknown_call).assert_error(5, "not awaiting approval");
    let other = RequestId::new().to_string();
    let mut unknown_request = on("approve", &db, &conversation);
    unknown_request.extend([other.as_str(), "c1", "--revision", &revision]);
    turnstile(&unknown_request).assert_error(4, "not found");
    assert_eq!(admission(&db, &conversation).await, held, "nothing written");
    assert_eq!(pending(&db).len(), 1);

    // The printed command approves, and prints the new revision and the
    // `resume` that continues (the same agent options).
    let approved = pasted(approve);
    approved.assert_success();
    let next = held.revision.0 + 1;
    assert_eq!(
        approved.stdout.lines().next().unwrap(),
        format!("approved call c1 of request {request} · revision {next}")
    );
    assert!(
        approved
            .stdout
            .contains("every call is decided; continue the request with:\n"),
        "{approved:#?}"
    );
    let resume = printed(&approved, "turnstile resume ");
    assert!(
        resume.contains(&format!("{} --revision {next} --db ", active.run_id)),
        "{resume}"
    );
    assert!(pending(&db).is_empty());
    assert!(
        tool_messages(&db, &conversation).is_empty(),
        "nothing ran yet"
    );
    // Decided already: 5.
    let mut again = on("approve", &db, &conversation);
    let next_revision = next.to_string();
    again.extend([request.as_str(), "c1", "--revision", &next_revision]);
    turnstile(&again).assert_error(5, "not awaiting approval");

    // The printed `resume` finishes the request: the approved call runs
    // (once), the other's journaled result is reused.
    let resumed = pasted(resume);
    resumed.assert_success();
    assert_eq!(
        resumed
            .stdout
            .matches("✓ add {\"a\":2,\"b\":3} → 5")
            .count(),
        1,
        "{resumed:#?}"
    );
    assert!(
        resumed
            .stdout
            .contains("word_count · result reused from the journal"),
        "{resumed:#?}"
    );
    assert!(resumed.stdout.contains("answer      done"), "{resumed:#?}");
    let tools = tool_messages(&db, &conversation);
    assert_eq!(
        tools,
        [
            json!({"role": "tool", "call_id": "c1", "content": "5"}),
            json!({"role": "tool", "call_id": "c2", "content": "2"}),
        ]
    );
    assert!(admission(&db, &conversation).await.active.is_none());
    // The request is over: deciding is refused (5), none waits.
    let idle = admission(&db, &conversation).await.revision.to_string();
    let mut late = on("approve", &db, &conversation);
    late.extend([request.as_str(), "c1", "--revision", &idle]);
    assert_eq!(turnstile(&late).code, 5);
    let none = turnstile(&["approvals", "--db", db.to_str().unwrap()]);
    none.assert_success();
    assert_eq!(none.stdout, "no tool calls await approval\n");
}

#[test]
fn a_request_awaiting_approval_is_not_stuck_and_is_counted_apart() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("waiting.db");
    let path = db.to_str().unwrap();
    let conversation = uuid();
    let request = RequestId::new().to_string();
    let model = two_calls(dir.path());
    let mut run = on("run", &db, &conversation);
    run.extend(["--request", &request, "--model", &model]);
    run.extend(["--require-approval", "add", INPUT]);
    assert_eq!(turnstile(&run).code, 6);

    // `approvals --namespace` alone filters every conversation's calls.
    let listed = |namespace: &str| {
        let listed = turnstile(&[
            "approvals",
            "--db",
            path,
            "--namespace",
            namespace,
            "--json",
        ]);
        listed.assert_success();
        listed.json()["approvals"].as_array().unwrap().len()
    };
    assert_eq!(listed("default"), 1);
    assert_eq!(listed("elsewhere"), 0);

    // `ls --stuck`: nothing is stuck, in every listing.
    for kind in ["conversations", "requests", "runs"] {
        let stuck = turnstile(&["ls", kind, "--stuck", "--db", path]);
        stuck.assert_success();
        assert_eq!(stuck.stdout, format!("no {kind}\n"), "{stuck:#?}");
    }
    // The plain listings say what it waits for.
    let requests = turnstile(&["ls", "requests", "--db", path]);
    requests.assert_success();
    assert!(
        requests.stdout.contains("active, awaiting approval"),
        "{requests:#?}"
    );
    assert!(!requests.stdout.contains("stuck"), "{requests:#?}");
    let listed = turnstile(&["ls", "requests", "--db", path, "--json"]);
    listed.assert_success();
    let held = &listed.json()["requests"][0]["held"];
    assert_eq!(held["awaiting_approval"], true, "{held}");
    assert_eq!(held["stuck"], false, "{held}");

    // `show`: awaiting approval, not stuck.
    let shown = turnstile(&["show", &conversation, "--db", path]);
    shown.assert_success();
    let revision = printed(&shown, "revision");
    assert!(revision.contains("awaiting approval"), "{shown:#?}");
    assert!(!revision.contains("stuck"), "{shown:#?}");
    let shown = turnstile(&["show", &conversation, "--db", path, "--json"]);
    shown.assert_success();
    assert_eq!(shown.json()["conversation"]["held"]["stuck"], false);

    // `doctor`: held, not stuck, one awaiting approval.
    let doctor = turnstile(&["doctor", "--db", path]);
    doctor.assert_success();
    assert!(
        printed(&doctor, "admissions").contains("1 held · 0 stuck · 1 awaiting approval"),
        "{doctor:#?}"
    );
    let doctor = turnstile(&["doctor", "--db", path, "--json"]);
    doctor.assert_success();
    let report = doctor.json();
    assert_eq!(report["held_admissions"], 1, "{report}");
    assert_eq!(report["stuck_admissions"], 0, "{report}");
    assert_eq!(report["awaiting_approval_admissions"], 1, "{report}");
}

#[tokio::test]
async fn a_rejected_call_never_runs_and_the_model_is_given_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("reject.db");
    let conversation = uuid();
    let request = RequestId::new().to_string();
    let model = two_calls(dir.path());

    // Both calls need approval; with --json, exit 6 prints the calls.
    let mut run = on("run", &db, &conversation);
    run.extend(["--request", &request, "--model", &model]);
    run.extend(["--require-approval", "word_count,add", "--json", INPUT]);
    let stopped = turnstile(&run);
    assert_eq!(stopped.code, 6, "{stopped:#?}");
    let doc = stopped.json();
    assert_eq!(doc["status"], "awaiting_approval");
    assert_eq!(doc["request_id"], request.as_str());
    let calls: Vec<&str> = doc["pending"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["call_id"].as_str().unwrap())
        .collect();
    assert_eq!(calls, ["c1", "c2"]);
    let revision = doc["revision"].as_u64().unwrap();
    assert_eq!(doc["pending"][1]["tool"], "word_count");
    assert_eq!(doc["pending"][1]["revision"], revision);

    // A reason over the limit is refused before anything is opened (2).
    let long = "x".repeat(4097);
    let r = revision.to_string();
    let mut too_long = on("reject", &db, &conversation);
    too_long.extend([request.as_str(), "c1", "--revision", &r, "--reason", &long]);
    turnstile(&too_long).assert_error(2, "limit");

    // Reject c1 (--json: the new revision alone); c2 still waits.
    let reason = "adding is not allowed today";
    let mut reject = on("reject", &db, &conversation);
    reject.extend([request.as_str(), "c1", "--revision", &r, "--reason", reason]);
    reject.push("--json");
    let rejected = turnstile(&reject);
    rejected.assert_success();
    assert_eq!(rejected.json(), json!({"revision": revision + 1}));
    let left = pending(&db);
    assert_eq!(left.len(), 1, "{left:#?}");
    assert_eq!(left[0]["call_id"], "c2");
    assert_eq!(left[0]["revision"], revision + 1);

    // The old revision is stale now (5); the next one approves c2, and the
    // human output names the `recover`-able run with the final revision.
    let mut stale = on("approve", &db, &conversation);
    stale.extend([request.as_str(), "c2", "--revision", &r]);
    turnstile(&stale).assert_error(5, "conflict");
    let r1 = (revision + 1).to_string();
    let mut approve = on("approve", &db, &conversation);
    approve.extend([request.as_str(), "c2", "--revision", &r1]);
    let approved = turnstile(&approve);
    approved.assert_success();
    assert!(
        approved
            .stdout
            .contains("(add the run's --model and --require-approval)"),
        "{approved:#?}"
    );
    let r2 = (revision + 2).to_string();
    assert!(
        printed(&approved, "turnstile resume ").contains(&format!("--revision {r2} --db ")),
        "{approved:#?}"
    );

    // Continuing needs the same approval set (order does not matter).
    let mut recover = on("recover", &db, &conversation);
    recover.extend([request.as_str(), "--revision", &r2, "--model", &model]);
    let mut mismatch = recover.clone();
    mismatch.extend(["--require-approval", "add", INPUT]);
    turnstile(&mismatch).assert_error(2, "--require-approval");
    recover.extend(["--require-approval", "add,word_count", "--json", INPUT]);
    let recovered = turnstile(&recover);
    recovered.assert_success();
    assert_eq!(recovered.json()["final_text"], "done");

    // The model was given the reason as c1's error result; c1 never ran.
    let tools = tool_messages(&db, &conversation);
    assert_eq!(tools.len(), 2, "{tools:#?}");
    assert_eq!(tools[0]["call_id"], "c1");
    assert_eq!(tools[0]["is_error"], true);
    assert_eq!(
        tools[0]["content"],
        format!("not run: the tool call was rejected by the approver: {reason}")
    );
    assert_eq!(
        tools[1],
        json!({"role": "tool", "call_id": "c2", "content": "2"})
    );
    assert!(pending(&db).is_empty());
}

#[tokio::test]
async fn resuming_before_every_call_is_decided_stops_again_with_new_commands() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("partial.db");
    let conversation = uuid();
    let request = RequestId::new().to_string();
    let model = two_calls(dir.path());
    let mut run = on("run", &db, &conversation);
    run.extend(["--request", &request, "--model", &model]);
    run.extend(["--require-approval", "add,word_count", INPUT]);
    assert_eq!(turnstile(&run).code, 6);
    let held = admission(&db, &conversation).await;
    let run_id = held.active.unwrap().run_id.to_string();

    let r = held.revision.to_string();
    let mut reject = on("reject", &db, &conversation);
    reject.extend([request.as_str(), "c1", "--revision", &r, "--reason", "no"]);
    reject.extend(["--model", &model, "--require-approval", "add,word_count"]);
    let rejected = turnstile(&reject);
    rejected.assert_success();
    assert!(
        rejected
            .stdout
            .contains("1 call still awaits a decision:\n"),
        "{rejected:#?}"
    );
    assert!(
        rejected
            .stdout
            .contains("  call c2 · word_count {\"text\":\"one two\"}"),
        "{rejected:#?}"
    );
    let r1 = (held.revision.0 + 1).to_string();
    let next = printed(&rejected, "turnstile approve ");
    assert!(
        next.contains(&format!("{request} c2 --revision {r1} --db ")),
        "{next}"
    );

    // Resumed now, the run answers c1 with the rejection and stops for c2.
    let mut resume = on("resume", &db, &conversation);
    resume.extend([run_id.as_str(), "--revision", &r1, "--model", &model]);
    resume.extend(["--require-approval", "add,word_count"]);
    let again = turnstile(&resume);
    assert_eq!(again.code, 6, "{again:#?}");
    assert!(
        again
            .stdout
            .contains("✗ add → error: not run: the tool call was rejected"),
        "{again:#?}"
    );
    let now = admission(&db, &conversation).await;
    let approve = printed(&again, "turnstile approve ");
    assert!(
        approve.contains(&format!("{request} c2 --revision {} --db ", now.revision)),
        "{approve}"
    );
    let approved = pasted(approve);
    approved.assert_success();
    let finished = pasted(printed(&approved, "turnstile resume "));
    finished.assert_success();
    assert!(
        finished.stdout.contains("answer      done"),
        "{finished:#?}"
    );
    let tools = tool_messages(&db, &conversation);
    assert_eq!(tools[0]["is_error"], true);
    assert_eq!(tools[1]["content"], "2");
}

#[test]
fn unknown_tool_names_are_usage_errors_before_anything_is_opened() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("never.db");
    let conversation = uuid();
    let model = two_calls(dir.path());
    let run_id = uuid();
    let request = RequestId::new().to_string();
    let cases: Vec<Vec<&str>> = vec![
        vec![
            "run",
            "--model",
            &model,
            "--require-approval",
            "add,nope",
            INPUT,
        ],
        vec!["run", "--model", &model, "--require-approval", "", INPUT],
        vec![
            "resume",
            &run_id,
            "--revision",
            "1",
            "--model",
            &model,
            "--require-approval",
            "Add",
        ],
        vec![
            "recover",
            &request,
            "--revision",
            "1",
            "--model",
            &model,
            "--require-approval",
            "nope",
            INPUT,
        ],
        vec![
            "approve",
            &request,
            "c1",
            "--revision",
            "1",
            "--require-approval",
            "nope",
        ],
    ];
    for case in cases {
        let mut args = on(case[0], &db, &conversation);
        args.extend(&case[1..]);
        turnstile(&args).assert_error(2, "unknown tool");
        assert!(!db.exists(), "{case:?} created the database");
    }
}

#[test]
fn approvals_reads_and_never_creates_a_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("missing.db");
    let path = db.to_str().unwrap();
    turnstile(&["approvals", "--db", path]).assert_error(4, "not found");
    let doc = turnstile(&["approvals", "--db", path, "--json"]).assert_json_error(4, "not found");
    assert_eq!(doc["kind"], "not_found", "{doc}");
    let conversation = uuid();
    let request = RequestId::new().to_string();
    let mut approve = on("approve", &db, &conversation);
    approve.extend([request.as_str(), "c1", "--revision", "1"]);
    turnstile(&approve).assert_error(4, "not found");
    assert!(!db.exists(), "nothing created");

    // A database where nothing waits: an empty list; an unknown
    // conversation is not found.
    let model = two_calls(dir.path());
    let mut run = on("run", &db, &conversation);
    run.extend(["--model", &model, "--json", INPUT]);
    turnstile(&run).assert_success();
    let none = turnstile(&["approvals", "--db", path]);
    none.assert_success();
    assert_eq!(none.stdout, "no tool calls await approval\n");
    let empty = turnstile(&["approvals", "--db", path, "--json"]);
    empty.assert_success();
    assert_eq!(empty.stdout, "{\"approvals\":[],\"next\":null}\n");
    let mut mine = vec!["approvals", "--db", path, "--conversation", &conversation];
    turnstile(&mine).assert_success();
    mine.extend(["--namespace", "elsewhere"]);
    assert_eq!(turnstile(&mine).code, 2, "in another namespace");
    let other = uuid();
    let unknown = turnstile(&["approvals", "--db", path, "--conversation", &other]);
    unknown.assert_error(4, "not found");
}

#[test]
fn printed_commands_quote_a_call_id_from_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("odd.db");
    let conversation = uuid();
    // A call id that looks like an option, with a quote, a newline and an
    // escape sequence; arguments spread over lines.
    let odd = "-x'\n\u{1b}[2J";
    let model = scripted(&script(
        dir.path(),
        "odd.json",
        json!([
            {"tool_calls": [{"id": odd, "name": "clock", "arguments": "{\n}"}]},
            {"text": "it is now"}
        ]),
    ));
    let mut run = on("run", &db, &conversation);
    run.extend(["--model", &model, "--require-approval", "clock", INPUT]);
    let stopped = turnstile(&run);
    assert_eq!(stopped.code, 6, "{stopped:#?}");
    assert!(!stopped.stdout.contains('\u{1b}'), "{stopped:#?}");
    assert!(!stopped.stderr.contains('\u{1b}'), "{stopped:#?}");
    assert!(
        stopped
            .stdout
            .contains("call -x'\\u{a}\\u{1b}[2J · clock {\\u{a}}"),
        "{stopped:#?}"
    );
    let approved = pasted(printed(&stopped, "turnstile approve "));
    approved.assert_success();
    let finished = pasted(printed(&approved, "turnstile resume "));
    finished.assert_success();
    assert!(
        finished.stdout.contains("answer      it is now"),
        "{finished:#?}"
    );
}

#[tokio::test]
async fn an_upgraded_agent_continues_only_with_accept_agent_change_and_checkpoints_show_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("upgrade.db");
    let conversation = uuid();
    let request = RequestId::new().to_string();
    let model = two_calls(dir.path());
    let mut run = on("run", &db, &conversation);
    run.extend([
        "--request",
        &request,
        "--model",
        &model,
        "--require-approval",
        "add",
        INPUT,
    ]);
    assert_eq!(turnstile(&run).code, 6);
    let held = admission(&db, &conversation).await;
    let active = held.active.clone().unwrap();
    let (run_id, revision) = (active.run_id.to_string(), held.revision.to_string());

    // The same model without the approval rule is another agent.
    let mut resume = on("resume", &db, &conversation);
    resume.extend([run_id.as_str(), "--revision", &revision, "--model", &model]);
    let refused = turnstile(&resume);
    assert_eq!(refused.code, 2, "{refused:#?}");
    assert!(
        refused.stderr.contains("--accept-agent-change"),
        "{refused:#?}"
    );
    assert_eq!(admission(&db, &conversation).await, held, "nothing moved");

    resume.push("--accept-agent-change");
    let upgraded = turnstile(&resume);
    // The new agent would not ask, but a human was asked: the call waits.
    assert_eq!(upgraded.code, 6, "{upgraded:#?}");
    assert!(
        upgraded.stdout.contains("the agent changed: "),
        "{upgraded:#?}"
    );
    let new_run = upgraded
        .stdout
        .lines()
        .find_map(|l| l.split("run ").nth(1)?.split(' ').next().map(str::to_owned))
        .unwrap();
    let calls = pending(&db);
    let revision = calls[0]["revision"].to_string();
    let mut approve = on("approve", &db, &conversation);
    approve.extend([request.as_str(), "c1", "--revision", &revision]);
    turnstile(&approve).assert_success();
    // The request holds the new agent's fingerprint now: no flag needed.
    let held = admission(&db, &conversation).await;
    let (run_now, revision) = (
        held.active.unwrap().run_id.to_string(),
        held.revision.to_string(),
    );
    let mut finish = on("resume", &db, &conversation);
    finish.extend([run_now.as_str(), "--revision", &revision, "--model", &model]);
    turnstile(&finish).assert_success();
    let results: Vec<String> = tool_messages(&db, &conversation)
        .iter()
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .collect();
    assert!(results.contains(&"5".to_owned()), "{results:?}");

    let shown = turnstile(&[
        "checkpoints",
        &new_run,
        "--db",
        db.to_str().unwrap(),
        "--json",
    ]);
    shown.assert_success();
    let change = &shown.json()["agent_change"];
    assert_eq!(
        change["from"],
        active.agent_fingerprint.as_str(),
        "{shown:#?}"
    );
    assert_ne!(change["to"], change["from"]);
    assert_eq!(change["to"].as_str().unwrap().len(), 64);
    let human = turnstile(&["checkpoints", &new_run, "--db", db.to_str().unwrap()]);
    human.assert_success();
    assert!(
        human.stdout.contains(&format!(
            "upgraded from {}",
            &active.agent_fingerprint[..12]
        )),
        "{human:#?}"
    );
    let old = turnstile(&[
        "checkpoints",
        &run_id,
        "--db",
        db.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(old.json()["agent_change"], Value::Null);
}
