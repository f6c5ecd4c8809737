//! `--mcp-stdio` and `--mcp-http`: a run takes tools from a real MCP server
//! (the test kit's, on the official Python SDK); a call the server's own record counts;
//! a destructive tool's call waits for approval, and the printed commands
//! that decide and continue it carry the server (the `resume` starts it
//! again).

use serde_json::json;
use turnstile_testkit::mcp::{calls_of, command_line, HttpServer};

use crate::cli_support::{command, pasted, printed, script, scripted, turnstile};

#[test]
fn a_run_takes_tools_from_an_mcp_server_and_a_destructive_call_waits_for_approval() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("mcp.db");
    let db = db.to_str().unwrap();
    let effects = dir.path().join("effects.log");
    let server = command_line(&effects);

    // A read-only tool runs at once, with the call's idempotency key.
    let lookup = scripted(&script(
        dir.path(),
        "lookup.json",
        json!([
            { "tool_calls": [{ "id": "c1", "name": "lookup", "arguments": { "key": "k1" } }] },
            { "text": "found it" },
        ]),
    ));
    let run = turnstile(&[
        "run",
        "--db",
        db,
        "--model",
        &lookup,
        "--mcp-stdio",
        &server,
        "--json",
        "look it up",
    ]);
    run.assert_success();
    let outcome = run.json();
    assert_eq!(outcome["final_text"], "found it");
    let request = outcome["request_id"].as_str().unwrap().to_owned();
    assert_eq!(
        calls_of(&effects, "lookup"),
        [(format!("{request}/1/c1"), r#"{"key":"k1"}"#.to_owned())]
    );

    // A destructive one waits; the printed commands carry the server.
    let delete = scripted(&script(
        dir.path(),
        "delete.json",
        json!([
            { "tool_calls": [{ "id": "d1", "name": "delete_file", "arguments": { "path": "/tmp/x" } }] },
            { "text": "deleted" },
        ]),
    ));
    let stopped = turnstile(&[
        "run",
        "--db",
        db,
        "--model",
        &delete,
        "--mcp-stdio",
        &server,
        "delete it",
    ]);
    assert_eq!(stopped.code, 6, "{stopped:#?}");
    assert!(
        calls_of(&effects, "delete_file").is_empty(),
        "nothing ran yet"
    );
    let approve = printed(&stopped, "turnstile approve ");
    assert!(approve.contains("--mcp-stdio"), "{approve}");
    let approved = pasted(approve);
    assert_eq!(approved.code, 0, "{approved:#?}");
    let resumed = pasted(printed(&approved, "turnstile resume "));
    assert_eq!(resumed.code, 0, "{resumed:#?}");
    assert!(resumed.stdout.contains("deleted"), "{resumed:#?}");
    assert_eq!(calls_of(&effects, "delete_file").len(), 1);
}

#[test]
fn an_mcp_server_that_does_not_start_is_a_usage_error_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("none.db");
    let model = scripted(&script(dir.path(), "s.json", json!([{ "text": "hi" }])));
    for (server, needle) in [
        (
            "/nonexistent/server --flag",
            "--mcp-stdio #1 (/nonexistent/server): cannot start the MCP server mcp1",
        ),
        ("'unclosed", "is not a command line"),
        ("true", "did not complete the MCP handshake"),
    ] {
        let run = turnstile(&[
            "run",
            "--db",
            db.to_str().unwrap(),
            "--model",
            &model,
            "--mcp-stdio",
            server,
            "hi",
        ]);
        run.assert_error(2, needle);
        assert!(!db.exists(), "no database for a bad server");
    }
}

#[test]
fn a_second_server_with_the_same_tool_names_gets_its_name_as_a_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("two.db");
    let (first, second) = (dir.path().join("first.log"), dir.path().join("second.log"));
    let servers = [command_line(&first), command_line(&second)];
    let model = scripted(&script(
        dir.path(),
        "s.json",
        json!([
            { "tool_calls": [{ "id": "l1", "name": "mcp2_lookup", "arguments": { "key": "k" } }] },
            { "text": "looked up" }
        ]),
    ));
    let run = turnstile(&[
        "run",
        "--db",
        db.to_str().unwrap(),
        "--model",
        &model,
        "--mcp-stdio",
        &servers[0],
        "--mcp-stdio",
        &servers[1],
        "look it up",
    ]);
    run.assert_success();
    // The call went to the second server, under the tool's own name.
    assert_eq!(calls_of(&second, "lookup").len(), 1);
    assert!(calls_of(&first, "lookup").is_empty());

    let listed = turnstile(&[
        "tools",
        "--mcp-stdio",
        &servers[0],
        "--mcp-stdio",
        &servers[1],
        "--json",
    ]);
    listed.assert_success();
    let tools = listed.json()["tools"].as_array().unwrap().clone();
    let source = |name: &str| {
        tools
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {tools:?}"))["source"]
            .clone()
    };
    assert_eq!(source("lookup"), "mcp1");
    assert_eq!(source("mcp2_lookup"), "mcp2");
}

#[test]
fn tools_lists_each_tool_with_what_it_declares_and_whether_it_asks() {
    let dir = tempfile::tempdir().unwrap();
    let server = command_line(&dir.path().join("effects.log"));
    let listed = turnstile(&[
        "tools",
        "--mcp-stdio",
        &server,
        "--require-approval",
        "add",
        "--json",
    ]);
    listed.assert_success();
    let tools = listed.json()["tools"].as_array().unwrap().clone();
    let tool = |name: &str| {
        tools
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {tools:?}"))
            .clone()
    };
    assert_eq!(tool("add")["source"], "builtin");
    assert_eq!(
        tool("add")["requires_approval"],
        true,
        "--require-approval add"
    );
    assert_eq!(tool("clock")["requires_approval"], false);
    assert_eq!(tool("lookup")["read_only"], true);
    assert_eq!(tool("lookup")["requires_approval"], false);
    assert_eq!(tool("delete_file")["destructive"], true);
    assert_eq!(tool("delete_file")["requires_approval"], true);
    assert_eq!(tool("set_flag")["idempotent"], true);
    assert_eq!(tool("set_flag")["requires_approval"], true);
    // What a recovery does with a call in doubt.
    assert_eq!(tool("add")["in_doubt"], "ambiguous");
    assert_eq!(tool("lookup")["in_doubt"], "retry", "read-only");
    assert_eq!(tool("set_flag")["in_doubt"], "retry", "idempotent");
    assert_eq!(tool("delete_file")["in_doubt"], "ambiguous");
    assert!(tool("set_flag")["source"]
        .as_str()
        .unwrap()
        .starts_with("mcp1"));

    let table = turnstile(&["tools", "--mcp-stdio", &server]);
    table.assert_success();
    assert!(table.stdout.starts_with("TOOL"), "{}", table.stdout);
    let delete = table
        .stdout
        .lines()
        .find(|line| line.starts_with("delete_file"))
        .unwrap();
    assert!(
        delete.contains("yes") && delete.contains("asks") && delete.ends_with("ambiguous"),
        "{delete}"
    );

    // A server that reconciles is asked about every call of its tools.
    let reconciling = format!("{server} --reconcile");
    let listed = turnstile(&["tools", "--mcp-stdio", &reconciling, "--json"]);
    listed.assert_success();
    let tools = listed.json()["tools"].as_array().unwrap().clone();
    assert!(
        tools.iter().all(|t| t["name"] != "turnstile_reconcile"),
        "the convention's tool is not the model's: {tools:?}"
    );
    let delete = tools.iter().find(|t| t["name"] == "delete_file").unwrap();
    assert_eq!(delete["in_doubt"], "reconcile");
}

#[test]
fn a_run_reaches_an_http_server_with_headers_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("http.db");
    let db = db.to_str().unwrap();
    let effects = dir.path().join("effects.log");
    let http = HttpServer::start(&effects, Some("t0ken"), false);
    let flag = format!("{} --headers-env MCP_TEST_HEADERS", http.url);
    let model = scripted(&script(
        dir.path(),
        "lookup.json",
        json!([
            { "tool_calls": [{ "id": "c1", "name": "lookup", "arguments": { "key": "k1" } }] },
            { "text": "found it" },
        ]),
    ));
    let args = [
        "run",
        "--db",
        db,
        "--model",
        &model,
        "--mcp-http",
        &flag,
        "--json",
        "look it up",
    ];
    let run = |headers: Option<&str>| {
        let mut command = command(&args);
        match headers {
            Some(headers) => command.env("MCP_TEST_HEADERS", headers),
            None => command.env_remove("MCP_TEST_HEADERS"),
        };
        let output = command.output().unwrap();
        let stderr = String::from_utf8(output.stderr).unwrap();
        (
            output.status.code(),
            String::from_utf8(output.stdout).unwrap() + &stderr,
        )
    };

    // No variable, or a wrong token: exit 2, no database, no secret quoted.
    let (code, stdout) = run(None);
    assert_eq!(code, Some(2), "{stdout}");
    assert!(stdout.contains("MCP_TEST_HEADERS"), "{stdout}");
    let (code, stdout) = run(Some("Authorization: Bearer wr0ng"));
    assert_eq!(code, Some(2), "{stdout}");
    assert!(!stdout.contains("wr0ng"), "{stdout}");
    assert!(!std::path::Path::new(db).exists());

    let (code, output) = run(Some("Authorization: Bearer t0ken\n"));
    assert_eq!(code, Some(0), "{output}");
    assert!(!output.contains("t0ken"), "{output}");
    let outcome: serde_json::Value = serde_json::from_str(&output).unwrap();
    assert_eq!(outcome["final_text"], "found it");
    assert_eq!(calls_of(&effects, "lookup").len(), 1);
}
