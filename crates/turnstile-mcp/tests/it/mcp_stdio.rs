//! Tools from a stdio MCP server: listed with what they declare, gated by
//! it, called with the call's idempotency key in `_meta` (counted from the
//! server's own record of what ran), their results as parts.

use std::path::Path;
use std::sync::Arc;

use serde_json::json;
use turnstile::store::JournalStatus;
use turnstile::{
    Agent, AgentSession, AgentUpgrade, ContextPolicy, ConversationId, Error, McpPolicy, McpServer,
    Message, Namespace, Part, RequestId, ResumePolicy, RunContext, ScriptedModel, ScriptedReply,
    SqliteStore, ToolCall,
};
use turnstile_testkit::mcp::{calls_of, stdio_command};
use turnstile_testkit::session::tool_results;

async fn server(effects: &Path) -> Arc<McpServer> {
    McpServer::stdio("test-server", stdio_command(effects))
        .await
        .unwrap()
}

async fn session(agent: Agent) -> AgentSession {
    AgentSession::new(
        agent,
        Arc::new(SqliteStore::in_memory().await.unwrap()),
        ConversationId::new(),
        Namespace::new("mcp-test").unwrap(),
        ContextPolicy::default(),
    )
}

#[tokio::test]
async fn tools_are_listed_with_what_they_declare_and_the_policy_it_implies() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(&dir.path().join("effects.log")).await;
    let info = |name: &str| {
        server
            .tools()
            .iter()
            .find(|tool| tool.name == name)
            .unwrap_or_else(|| panic!("no tool {name}"))
            .clone()
    };
    let lookup = info("lookup");
    assert_eq!(lookup.annotations.read_only, Some(true));
    assert_eq!(lookup.input_schema["properties"]["key"]["type"], "string");
    assert!(!lookup.description.is_empty());
    let delete = info("delete_file");
    assert_eq!(delete.annotations.destructive, Some(true));
    let set_flag = info("set_flag");
    assert_eq!(
        (
            set_flag.annotations.idempotent,
            set_flag.annotations.destructive
        ),
        (Some(true), Some(false))
    );

    let policy = McpPolicy::default();
    assert!(!policy.requires_approval("lookup", &lookup.annotations));
    assert!(policy.requires_approval("delete_file", &delete.annotations));
    assert!(policy.requires_approval("set_flag", &set_flag.annotations));

    // Listed sorted by name, whatever the server's order.
    let tools = server.tools();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(names, sorted);

    // A name the agent already has is prefixed, never silently replaced;
    // one taken with its prefix too is refused.
    let agent = server.add_to(
        Agent::new(Arc::new(ScriptedModel::new(Vec::new()))),
        &policy,
    );
    let twice = server.add_to(agent.unwrap(), &policy).unwrap();
    assert_eq!(twice.tool_specs().len(), 2 * server.tools().len());
    let error = server.add_to(twice, &policy).unwrap_err();
    assert!(
        error.to_string().contains("which the agent already has"),
        "{error}"
    );
}

#[tokio::test]
async fn calls_carry_their_idempotency_key_and_results_become_parts() {
    let dir = tempfile::tempdir().unwrap();
    let effects = dir.path().join("effects.log");
    let server = server(&effects).await;
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedReply::tool_calls(vec![
            ToolCall::new("c1", "lookup", json!({ "key": "k1" })),
            ToolCall::new("c2", "snapshot", json!({})),
            ToolCall::new("c3", "bundle", json!({})),
            ToolCall::new("c4", "fail", json!({ "message": "no such row" })),
        ]),
        ScriptedReply::text("done"),
    ]));
    // Declaring nothing, snapshot, bundle and fail would need approval.
    let policy = McpPolicy::default()
        .without_approval("snapshot")
        .without_approval("bundle")
        .without_approval("fail");
    let session = session(server.add_to(Agent::new(model), &policy).unwrap()).await;
    let request = RequestId::new();
    let outcome = session
        .run(request, "look it up", RunContext::default())
        .await
        .unwrap();
    assert_eq!(outcome.final_text, "done");

    // The server's record: each call once, with turnstile's key.
    let lookups = calls_of(&effects, "lookup");
    assert_eq!(
        lookups,
        [(format!("{request}/1/c1"), r#"{"key":"k1"}"#.to_owned())]
    );
    assert_eq!(
        calls_of(&effects, "snapshot")[0].0,
        format!("{request}/1/c2")
    );

    let transcript = session
        .store()
        .transcript_window(session.conversation_id(), 20)
        .await
        .unwrap();
    let result = |call: &str| {
        transcript
            .iter()
            .find_map(|entry| match &entry.message {
                Message::Tool {
                    call_id,
                    content,
                    is_error,
                } if call_id == call => Some((content.clone(), *is_error)),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no result for {call}"))
    };
    let (lookup, failed) = result("c1");
    assert!(!failed);
    assert!(lookup.text().starts_with("value-of-k1"), "{lookup:?}");
    let (snapshot, _) = result("c2");
    let image = snapshot
        .parts()
        .iter()
        .find_map(Part::attachment)
        .expect("an image");
    assert_eq!(image.media_type(), "image/png");
    assert!(snapshot
        .parts()
        .iter()
        .any(|part| matches!(part, Part::Json { json } if json.as_str().contains("\"width\":1"))));
    let (bundle, _) = result("c3");
    let text = bundle.text();
    assert!(text.contains("file:///tmp/note.txt:\nhello"), "{text}");
    assert!(
        text.contains("[resource: big.bin file:///tmp/big.bin]"),
        "{text}"
    );
    let blob = bundle
        .parts()
        .iter()
        .find_map(Part::attachment)
        .expect("a file");
    assert_eq!(
        (blob.name(), blob.media_type()),
        (Some("file:///tmp/b.bin"), "application/octet-stream")
    );
    let (fail, failed) = result("c4");
    assert!(failed, "isError is a failed call");
    assert!(fail.text().contains("no such row"), "{fail:?}");
}

#[tokio::test]
async fn a_destructive_tool_runs_only_once_approved() {
    let dir = tempfile::tempdir().unwrap();
    let effects = dir.path().join("effects.log");
    let server = server(&effects).await;
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedReply::tool_calls(vec![ToolCall::new(
            "d1",
            "delete_file",
            json!({ "path": "/tmp/x" }),
        )]),
        ScriptedReply::text("deleted"),
    ]));
    let session = session(
        server
            .add_to(Agent::new(model), &McpPolicy::default())
            .unwrap(),
    )
    .await;
    let request = RequestId::new();
    let error = session
        .run(request, "delete it", RunContext::default())
        .await
        .unwrap_err();
    let Error::AwaitingApproval { revision, .. } = error else {
        panic!("expected a stop for approval, got {error:?}");
    };
    assert!(
        calls_of(&effects, "delete_file").is_empty(),
        "nothing ran yet"
    );

    let revision = session.approve(request, "d1", revision).await.unwrap();
    let outcome = session
        .continue_after_approval(request, RunContext::default(), revision)
        .await
        .unwrap();
    assert_eq!(outcome.final_text, "deleted");
    assert_eq!(
        calls_of(&effects, "delete_file"),
        [(format!("{request}/1/d1"), r#"{"path":"/tmp/x"}"#.to_owned())]
    );
}

#[tokio::test]
async fn a_server_that_dies_mid_call_leaves_the_call_in_doubt_and_is_started_again() {
    let dir = tempfile::tempdir().unwrap();
    let effects = dir.path().join("effects.log");
    let server = server(&effects).await;
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedReply::tool_calls(vec![ToolCall::new("x1", "crash", json!({}))]),
        ScriptedReply::text("unreachable"),
    ]));
    let policy = McpPolicy::default().without_approval("crash");
    let session = session(server.add_to(Agent::new(model), &policy).unwrap()).await;
    let request = RequestId::new();
    let stopped = session
        .run(request, "crash it", RunContext::default())
        .await
        .unwrap_err();
    // Never a success, nor a result for the model: the run stops with the
    // call unjournaled and its turn in flight.
    match &stopped {
        Error::ToolInDoubt { call, .. } => assert_eq!(
            (call.call_id.as_str(), call.tool.as_str(), call.turn),
            ("x1", "crash", 1)
        ),
        other => panic!("expected ToolInDoubt, got {other:?}"),
    }
    assert!(stopped
        .to_string()
        .contains("may or may not have taken effect"));
    assert_eq!(calls_of(&effects, "crash").len(), 1);
    let journal = session.store().journal(request, 1).await.unwrap();
    assert_eq!(journal[0].status, JournalStatus::Requested, "{journal:?}");
    // The crash tool declares nothing and the server cannot reconcile it:
    // the default policy refuses, and nothing runs again.
    let revision = session.admission().await.unwrap().revision;
    let refused = session
        .recover_after_owner_exit(
            request,
            "crash it",
            RunContext::default(),
            revision,
            ResumePolicy::RejectAmbiguous,
        )
        .await;
    assert!(
        matches!(refused, Err(Error::AmbiguousCheckpoint { turn: 1, .. })),
        "{refused:?}"
    );
    session.abandon(request, revision).await.unwrap();

    // The next call starts the server again.
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedReply::tool_calls(vec![ToolCall::new("l1", "lookup", json!({ "key": "k" }))]),
        ScriptedReply::text("looked up"),
    ]));
    let session = AgentSession::new(
        server.add_to(Agent::new(model), &policy).unwrap(),
        session.store().clone(),
        session.conversation_id(),
        Namespace::new("mcp-test").unwrap(),
        ContextPolicy::default(),
    );
    let outcome = session
        .run(RequestId::new(), "look it up", RunContext::default())
        .await
        .unwrap();
    assert_eq!(outcome.final_text, "looked up");
    assert_eq!(calls_of(&effects, "lookup").len(), 1);
}

#[tokio::test]
async fn a_call_whose_server_died_after_its_effect_is_reconciled_by_the_restarted_server() {
    let dir = tempfile::tempdir().unwrap();
    let effects = dir.path().join("effects.log");
    let mut command = stdio_command(&effects);
    command.arg("--reconcile");
    let server = McpServer::stdio("reconciling", command).await.unwrap();
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedReply::tool_calls(vec![ToolCall::new(
            "d1",
            "delete_file",
            json!({ "path": "/tmp/x", "crash": true }),
        )]),
        ScriptedReply::text("deleted"),
    ]));
    let policy = McpPolicy::default().without_approval("delete_file");
    let session = session(server.add_to(Agent::new(model), &policy).unwrap()).await;
    let request = RequestId::new();
    let stopped = session
        .run(request, "delete it", RunContext::default())
        .await
        .unwrap_err();
    assert!(matches!(stopped, Error::ToolInDoubt { .. }), "{stopped:?}");
    // In the same process: the recovery's reconcile starts the server
    // again, which finds the effect in its record.
    let revision = session.admission().await.unwrap().revision;
    let outcome = session
        .recover_after_owner_exit(
            request,
            "delete it",
            RunContext::default(),
            revision,
            ResumePolicy::RejectAmbiguous,
        )
        .await
        .unwrap();
    assert_eq!(outcome.final_text, "deleted");
    let answer = tool_results(&outcome.messages).remove(0).1;
    assert_eq!(answer, "deleted /tmp/x");
    assert_eq!(
        calls_of(&effects, "delete_file"),
        [(format!("{request}/1/d1"), r#"{"path":"/tmp/x"}"#.to_owned())],
        "it ran once"
    );
}

#[tokio::test]
async fn a_tool_name_the_agent_has_takes_the_servers_name_as_a_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (dir.path().join("first.log"), dir.path().join("second.log"));
    let one = McpServer::stdio("one", stdio_command(&first))
        .await
        .unwrap();
    let two = McpServer::stdio("two", stdio_command(&second))
        .await
        .unwrap();
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedReply::tool_calls(vec![
            ToolCall::new("a", "lookup", json!({ "key": "k" })),
            ToolCall::new("b", "two_lookup", json!({ "key": "k" })),
        ]),
        ScriptedReply::text("looked up twice"),
    ]));
    let agent = one
        .add_to(Agent::new(model), &McpPolicy::default())
        .unwrap();
    let agent = two.add_to(agent, &McpPolicy::default()).unwrap();
    let names: Vec<&str> = agent.tool_specs().iter().map(|s| s.name.as_str()).collect();
    assert!(
        names.contains(&"lookup") && names.contains(&"two_lookup"),
        "{names:?}"
    );
    let outcome = session(agent)
        .await
        .run(RequestId::new(), "look up", RunContext::default())
        .await
        .unwrap();
    assert_eq!(outcome.final_text, "looked up twice");
    // Each call reached its own server, under the tool's own name.
    assert_eq!(calls_of(&first, "lookup").len(), 1);
    assert_eq!(calls_of(&second, "lookup").len(), 1);

    // A prefixed name that is taken too is refused.
    let taken = vec!["lookup".to_owned(), "two_lookup".to_owned()];
    let error = two.exposed(&taken).unwrap_err();
    assert!(error.to_string().contains("two_lookup"), "{error}");
}

#[tokio::test]
async fn a_changed_tool_list_is_read_again_and_a_held_request_continues_only_as_an_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let effects = dir.path().join("effects.log");
    let server = server(&effects).await;
    let script = || {
        Arc::new(ScriptedModel::new(vec![
            ScriptedReply::tool_calls(vec![
                ToolCall::new("g1", "grow", json!({})),
                ToolCall::new("d1", "delete_file", json!({ "path": "/tmp/x" })),
            ]),
            ScriptedReply::text("grown and deleted"),
        ]))
    };
    let policy = McpPolicy::default().without_approval("grow");
    let before = server.add_to(Agent::new(script()), &policy).unwrap();
    let sleeper = server
        .add_to(
            Agent::new(Arc::new(ScriptedModel::new(vec![
                ScriptedReply::tool_calls(vec![ToolCall::new(
                    "s1",
                    "sleep",
                    json!({ "seconds": 0 }),
                )]),
                ScriptedReply::text("slept"),
            ]))),
            &McpPolicy::default().without_approval("sleep"),
        )
        .unwrap();
    let session = session(before.clone()).await;
    let request = RequestId::new();
    // `grow` adds a tool and says so; the delete waits for approval.
    let error = session
        .run(request, "grow, then delete", RunContext::default())
        .await
        .unwrap_err();
    let Error::AwaitingApproval { revision, .. } = error else {
        panic!("expected a stop for approval, got {error:?}");
    };
    let waited = std::time::Instant::now();
    while !server.tools_changed() {
        assert!(waited.elapsed() < std::time::Duration::from_secs(10));
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(server.refresh().await.unwrap(), "the list changed");
    assert!(!server.refresh().await.unwrap(), "read once");
    assert!(server.tools().iter().any(|t| t.name == "extra"));
    assert!(server.tools().iter().all(|t| t.name != "sleep"));

    // An agent built before keeps its tools: a call of one the server no
    // longer offers is not sent, and the model is told why.
    let outcome = self::session(sleeper)
        .await
        .run(RequestId::new(), "sleep", RunContext::default())
        .await
        .unwrap();
    let told = tool_results(&outcome.messages).remove(0).1;
    assert!(
        told.contains("no longer offers the tool \"sleep\""),
        "{told}"
    );
    assert!(calls_of(&effects, "sleep").is_empty());

    // An agent built now has the new tool, and another fingerprint: the
    // held request continues under it only as an upgrade.
    let after = server.add_to(Agent::new(script()), &policy).unwrap();
    assert_ne!(after.fingerprint(), before.fingerprint());
    let upgraded = AgentSession::new(
        after,
        session.store().clone(),
        session.conversation_id(),
        Namespace::new("mcp-test").unwrap(),
        ContextPolicy::default(),
    );
    let revision = upgraded.approve(request, "d1", revision).await.unwrap();
    let refused = upgraded
        .continue_after_approval(request, RunContext::default(), revision)
        .await;
    assert!(
        matches!(refused, Err(Error::ConfigurationMismatch { .. })),
        "{refused:?}"
    );
    let outcome = upgraded
        .continue_after_approval(
            request,
            RunContext::default().with_agent_upgrade(AgentUpgrade::Accept),
            revision,
        )
        .await
        .unwrap();
    assert_eq!(outcome.final_text, "grown and deleted");
    assert_eq!(calls_of(&effects, "delete_file").len(), 1);
}

#[tokio::test]
async fn a_call_unanswered_within_the_policys_timeout_is_in_doubt() {
    let dir = tempfile::tempdir().unwrap();
    let effects = dir.path().join("effects.log");
    let server = server(&effects).await;
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedReply::tool_calls(vec![ToolCall::new("s1", "sleep", json!({ "seconds": 30 }))]),
        ScriptedReply::text("slept"),
    ]));
    let policy = McpPolicy::default()
        .without_approval("sleep")
        .call_timeout(std::time::Duration::from_millis(500));
    let session = session(server.add_to(Agent::new(model), &policy).unwrap()).await;
    let started = std::time::Instant::now();
    let stopped = session
        .run(RequestId::new(), "sleep", RunContext::default())
        .await
        .unwrap_err();
    match &stopped {
        Error::ToolInDoubt { call, .. } => {
            assert!(call.message.contains("within 500 ms"), "{stopped}")
        }
        other => panic!("expected ToolInDoubt, got {other:?}"),
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    assert_eq!(calls_of(&effects, "sleep").len(), 1);
}

#[tokio::test]
async fn a_command_that_is_no_mcp_server_is_refused_with_its_name() {
    let error = McpServer::stdio("not-mcp", tokio::process::Command::new("true"))
        .await
        .unwrap_err();
    assert!(error.to_string().contains("not-mcp"), "{error}");
    let error = McpServer::stdio(
        "missing",
        tokio::process::Command::new("/nonexistent/server"),
    )
    .await
    .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("cannot start the MCP server missing"),
        "{error}"
    );
}
