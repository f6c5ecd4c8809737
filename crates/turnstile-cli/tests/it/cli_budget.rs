//! A request's budget from a shell: `run --max-turns` stores it, a budget
//! stop prints the resume that raises it and the abandon that gives up, a
//! resume without a raise is refused in a new process and writes nothing,
//! and a raise goes on from where the request stopped.

use std::path::Path;

use crate::cli_support::{admission, open, pasted, script, scripted, turnstile, uuid};
use serde_json::json;
use turnstile::agent::Budget;
use turnstile::store::RequestStatus;
use turnstile::{RequestId, RunId, Store};

/// Three tool turns, then the answer.
fn four_turn_script(dir: &Path) -> std::path::PathBuf {
    let add = |id: &str| {
        json!({"tool_calls": [{"id": id, "name": "add", "arguments": {"a": 1, "b": 1}}],
               "usage": {"input_tokens": 10, "output_tokens": 1}})
    };
    script(
        dir,
        "four.json",
        json!([add("c1"), add("c2"), add("c3"),
               {"text": "done", "usage": {"input_tokens": 10, "output_tokens": 1}}]),
    )
}

/// The command after `prefix` in `line`, up to the next "; " or the
/// " (request …)" a generated request id adds (or the end).
fn command_after<'a>(line: &'a str, prefix: &str) -> &'a str {
    let (_, after) = line
        .split_once(prefix)
        .unwrap_or_else(|| panic!("{prefix:?} in {line}"));
    let command = after.split("; ").next().unwrap();
    command.split(" (request ").next().unwrap().trim()
}

#[tokio::test]
async fn a_turn_budget_outlives_the_process_and_only_a_raise_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("budget.db");
    let conversation = uuid();
    let request = uuid();
    let model = scripted(&four_turn_script(dir.path()));
    let db_arg = db.to_str().unwrap();
    let stopped = turnstile(&[
        "run",
        "--db",
        db_arg,
        "--conversation",
        &conversation,
        "--request",
        &request,
        "--model",
        &model,
        "--max-turns",
        "1",
        "--json",
        "add",
    ]);
    let doc = stopped.assert_json_error(1, "exceeded its turns budget (1 of 1)");
    let request_id: RequestId = request.parse().unwrap();
    let stored = open(&db).await.request(request_id).await.unwrap().unwrap();
    assert_eq!(stored.budget.max_turns, Some(1));
    let raise = doc["next"].as_str().expect("a resume command").to_owned();
    assert!(raise.ends_with(" --max-turns 2"), "{raise}");
    let give_up = doc["give_up"].as_str().expect("an abandon command");
    assert!(
        give_up.starts_with(&format!("turnstile abandon {request} --revision ")),
        "{give_up}"
    );
    let line = stopped.stderr.lines().next().unwrap();
    assert_eq!(command_after(line, "continue it with: "), raise);
    assert_eq!(command_after(line, "give the request up with: "), give_up);

    // The same resume without the raise, in a new process: refused, and
    // nothing written (the revision and the run stay).
    let before = admission(&db, &conversation).await;
    let plain = raise.trim_end_matches(" --max-turns 2").to_owned() + " --json";
    let refused = pasted(&plain);
    let again = refused.assert_json_error(1, "exceeded its turns budget (1 of 1)");
    assert_eq!(again["next"], raise.as_str(), "{again}");
    let after = admission(&db, &conversation).await;
    assert_eq!(after.revision, before.revision);
    assert_eq!(
        after.active.map(|a| a.run_id),
        before.active.map(|a| a.run_id)
    );

    // The printed raise goes on: one more turn, stopped at two, and the run
    // records the change.
    let raised = pasted(&format!("{raise} --json"));
    let doc = raised.assert_json_error(1, "exceeded its turns budget (2 of 2)");
    let run: RunId = doc["run_id"].as_str().unwrap().parse().unwrap();
    let store = open(&db).await;
    let change = store.run(run).await.unwrap().unwrap().budget_change;
    assert_eq!(
        change.map(|c| (c.from.max_turns, c.to.max_turns)),
        Some((Some(1), Some(2)))
    );
    drop(store);
    let shown = turnstile(&["checkpoints", &run.to_string(), "--db", db_arg]);
    assert_eq!(shown.code, 0, "{shown:#?}");
    assert!(
        shown
            .stdout
            .contains("budget        changed from at most 1 turns to at most 2 turns"),
        "{}",
        shown.stdout
    );
    let shown = turnstile(&["checkpoints", &run.to_string(), "--db", db_arg, "--json"]);
    assert_eq!(
        shown.json()["budget_change"]["to"]["max_turns"],
        2,
        "{shown:#?}"
    );

    // A raise of its own finishes the request.
    let next = doc["next"].as_str().unwrap();
    let finished = pasted(&format!(
        "{} --max-turns 10 --json",
        next.trim_end_matches(" --max-turns 4")
    ));
    finished.assert_success();
    assert_eq!(finished.json()["final_text"], "done", "{finished:#?}");
    let record = open(&db).await.request(request_id).await.unwrap().unwrap();
    assert_eq!(record.status, RequestStatus::Completed);
    assert_eq!(
        record.budget,
        Budget {
            max_turns: Some(10),
            ..Budget::default()
        }
    );
}

#[test]
fn a_run_without_max_turns_stores_the_default_and_the_hint_gives_the_abandon_command() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tokens.db");
    let conversation = uuid();
    let model = scripted(&four_turn_script(dir.path()));
    let stopped = turnstile(&[
        "run",
        "--db",
        db.to_str().unwrap(),
        "--conversation",
        &conversation,
        "--model",
        &model,
        "--max-tokens",
        "11",
        "add",
    ]);
    assert_eq!(stopped.code, 1, "{stopped:#?}");
    let line = stopped.stderr.lines().next().unwrap();
    assert!(
        line.contains("exceeded its tokens budget (11 of 11)"),
        "{line}"
    );
    let raise = command_after(line, "continue it with: ");
    assert!(raise.ends_with(" --max-tokens 22"), "{raise}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let held = rt.block_on(admission(&db, &conversation)).active.unwrap();
    let stored = rt.block_on(async {
        let store = open(&db).await;
        store
            .request(held.request_id)
            .await
            .unwrap()
            .unwrap()
            .budget
    });
    let expected = Budget {
        max_turns: Some(32),
        max_tokens: Some(11),
        max_tool_calls: None,
    };
    assert_eq!(stored, expected);
    // Giving up, as printed, releases the conversation.
    let give_up = command_after(line, "give the request up with: ");
    let abandoned = pasted(give_up);
    assert_eq!(abandoned.code, 0, "{abandoned:#?}");
    let held = rt.block_on(admission(&db, &conversation));
    assert!(held.active.is_none());
}
