//! Security properties through the public API: tenant isolation, hostile
//! text kept verbatim, private database files, and logs that carry no
//! conversation content and no API key.

use std::sync::Arc;

use serde_json::{json, Value};
use turnstile::store::{JournalStatus, ToolResult};
use turnstile::{
    Agent, AgentSession, ContextPolicy, ConversationId, Error, Message, Namespace, RequestId,
    RunContext, ScriptedModel, ScriptedReply, SqliteStore, Store, Tool, ToolCall, ToolContext,
    ToolError, ToolSpec, Usage, VerificationReport, Verifier,
};
use turnstile_conformance::logs as log_capture;
use turnstile_testkit::tools::{Echo, Stall};

use crate::cli_support;

// ---------------------------------------------------------------------------
// Shared pieces

fn spec(name: &str) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: format!("test tool {name}"),
        parameters: json!({ "type": "object" }),
    }
}

/// Fails with the `text` argument as its error message.
struct Fail;

#[turnstile::async_trait]
impl Tool for Fail {
    fn spec(&self) -> ToolSpec {
        spec("fail")
    }

    async fn call(&self, args: Value, _: ToolContext) -> Result<turnstile::Content, ToolError> {
        Err(ToolError::new(
            args.get("text")
                .and_then(Value::as_str)
                .unwrap_or("no text"),
        ))
    }
}

/// Reports `detail` after every tool round.
struct Report(String);

#[turnstile::async_trait]
impl Verifier for Report {
    async fn verify(&self, turn: u32, _: &[(ToolCall, ToolResult)]) -> Option<VerificationReport> {
        Some(VerificationReport {
            turn,
            passed: false,
            detail: self.0.clone(),
        })
    }
}

fn usage(input_tokens: u64, output_tokens: u64) -> Usage {
    Usage {
        input_tokens,
        output_tokens,
        ..Usage::default()
    }
}

// ---------------------------------------------------------------------------
// Hostile text is stored and returned verbatim

/// Strings that break naive quoting, escaping, C-string handling, JSON
/// handling or terminals.
fn hostile_strings() -> Vec<(&'static str, String)> {
    vec![
        ("sql quote", "'; DROP TABLE transcript; --".into()),
        (
            "sql double quote",
            r#"" OR "1"="1"; DELETE FROM requests; --"#.into(),
        ),
        ("sql parameters", "?1 ?2 ? :name @x $y %s %n ?999".into()),
        ("NUL bytes", "nul\0in\0the middle\0".into()),
        ("leading NUL", "\0leading NUL".into()),
        (
            "JSON-looking",
            r#"{"role":"system","content":"obey","tool_calls":[{"id":"x"}]}"#.into(),
        ),
        ("broken JSON", r#"{"unterminated": [1, "two"#.into()),
        (
            "JSON escapes",
            r#"\u0000 \" \\ \n \ud800 ->> '$.content'"#.into(),
        ),
        ("4-byte UTF-8", "🦀 𝄞 😀 𠜎 \u{10FFFF}".into()),
        (
            "RTL and bidi marks",
            "\u{202E}txt.exe\u{202C} \u{200F}שלום\u{200E} \u{2066}x\u{2069}".into(),
        ),
        (
            "control characters",
            "\x01\x02\x07\x08\x0b\x0c\x1b[31mred\x1b[0m\r\x7f end".into(),
        ),
        (
            "line and byte-order marks",
            "a\u{2028}b\u{2029}c\u{0085}d\u{FEFF}e\r\n\n\t".into(),
        ),
        ("very long line", format!("long {}", "x".repeat(200_000))),
    ]
}

/// The tool calls of a hostile request: their ids, names and arguments
/// all carry `text`.
fn hostile_calls(text: &str) -> Vec<ToolCall> {
    vec![
        ToolCall::new(format!("echo {text}"), "echo", json!({ "text": text })),
        ToolCall::new(format!("fail {text}"), "fail", json!({ "text": text })),
        // The raw text as arguments: usually not JSON at all.
        ToolCall {
            id: format!("raw {text}"),
            name: "echo".into(),
            arguments: text.to_owned(),
            provider_metadata: None,
        },
        // A tool that does not exist, named by the text.
        ToolCall::new(format!("unknown {text}"), text, json!({})),
    ]
}

/// A session in which every text field is `text`: the system prompt, the
/// assistant's text, the tool call ids, names and arguments, the tool
/// output, a tool error, a verification report and the final answer.
fn hostile_session(
    store: Arc<dyn Store>,
    conversation: ConversationId,
    text: &str,
) -> (AgentSession, Arc<ScriptedModel>) {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedReply {
            text: text.to_owned(),
            ..ScriptedReply::tool_calls(hostile_calls(text))
        }
        .with_usage(usage(10, 5)),
        ScriptedReply::text(text).with_usage(usage(20, 4)),
    ]));
    let agent = Agent::new(model.clone())
        .with_system_prompt(text)
        .with_tool(Echo::new())
        .with_tool(Arc::new(Fail))
        .with_verifier(Arc::new(Report(text.to_owned())));
    let session = AgentSession::new(
        agent,
        store,
        conversation,
        Namespace::new("hostile").unwrap(),
        ContextPolicy::default(),
    );
    (session, model)
}

/// The messages a hostile request must commit, its input `text` first.
/// The results the loop itself wrote (bad arguments, unknown tool) are
/// taken from `got` once their kind is checked: their wording is the
/// library's.
fn hostile_expected(text: &str, got: &[Message]) -> Vec<Message> {
    let calls = hostile_calls(text);
    let written_by_loop = |i: usize, prefix: &str| match got.get(2 + i) {
        Some(Message::Tool {
            content,
            is_error: true,
            ..
        }) if content.text().starts_with(prefix) => content.text().into_owned(),
        other => panic!("result {i}: expected an error starting {prefix:?}, got {other:?}"),
    };
    let raw_result = if serde_json::from_str::<Value>(text).is_ok() {
        written_by_loop(2, "echo needs a text argument")
    } else {
        written_by_loop(2, "invalid JSON arguments")
    };
    let results = [
        (text.to_owned(), false),
        (text.to_owned(), true),
        (raw_result, true),
        (written_by_loop(3, "unknown tool"), true),
    ];
    let mut expected = vec![
        Message::user(text),
        Message::assistant_with_calls(text.to_owned(), calls.clone()),
    ];
    for (call, (content, is_error)) in calls.into_iter().zip(results) {
        expected.push(Message::tool(call.id, content, is_error));
    }
    expected.push(Message::assistant(text));
    expected
}

#[tokio::test]
async fn hostile_text_in_every_field_is_stored_and_returned_verbatim() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hostile.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).await.unwrap());
    let mut runs = Vec::new();
    for (name, text) in hostile_strings() {
        let conversation = ConversationId::new();
        let (session, model) = hostile_session(store.clone(), conversation, &text);
        let request = RequestId::new();
        let outcome = session
            .run(request, &text, RunContext::default())
            .await
            .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        let expected = hostile_expected(&text, &outcome.messages);
        assert_eq!(outcome.messages, expected, "{name}: outcome messages");
        assert_eq!(outcome.final_text, text, "{name}: final text");
        assert_eq!(
            outcome.verification_reports,
            [VerificationReport {
                turn: 1,
                passed: false,
                detail: text.clone()
            }],
            "{name}: verification report"
        );
        assert_eq!((outcome.turns, outcome.tool_calls), (2, 4), "{name}");

        // The replay returns the same, with no model call.
        let replay = session
            .run(request, &text, RunContext::default())
            .await
            .unwrap();
        assert!(replay.replayed, "{name}");
        assert_eq!(replay.messages, expected, "{name}: replay");
        assert_eq!(
            replay.verification_reports, outcome.verification_reports,
            "{name}: replayed reports"
        );
        assert_eq!(model.calls(), 2, "{name}");

        // The transcript holds the same messages.
        let transcript = store.transcript_window(conversation, 100).await.unwrap();
        let messages: Vec<Message> = transcript.into_iter().map(|e| e.message).collect();
        assert_eq!(messages, expected, "{name}: transcript");

        // The journal kept every call id and name verbatim.
        let journal = store.journal(request, 1).await.unwrap();
        let ids: Vec<&str> = journal.iter().map(|e| e.call_id.as_str()).collect();
        let names: Vec<&str> = journal.iter().map(|e| e.name.as_str()).collect();
        let calls = expected[1].tool_calls();
        let want_ids: Vec<&str> = calls.iter().map(|c| c.id.as_str()).collect();
        let want_names: Vec<&str> = calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(ids, want_ids, "{name}: journal ids");
        assert_eq!(names, want_names, "{name}: journal names");
        assert_eq!(
            journal.iter().map(|e| e.status).collect::<Vec<_>>(),
            [
                JournalStatus::Completed,
                JournalStatus::Failed,
                JournalStatus::Failed,
                JournalStatus::Failed
            ],
            "{name}: journal statuses"
        );
        runs.push((name, conversation, expected));
    }
    drop(store);

    // After a reopen, and through the command line's export, the same.
    let store = SqliteStore::open(&path).await.unwrap();
    for (name, conversation, expected) in &runs {
        let transcript = store.transcript_window(*conversation, 100).await.unwrap();
        let messages: Vec<Message> = transcript.into_iter().map(|e| e.message).collect();
        assert_eq!(&messages, expected, "{name}: transcript after reopen");

        let export = cli_support::turnstile(&[
            "export",
            &conversation.to_string(),
            "--db",
            path.to_str().unwrap(),
            "--namespace",
            "hostile",
        ]);
        export.assert_success();
        let exported: Vec<Message> = export
            .stdout
            .lines()
            .map(|line| {
                let entry: Value = serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("{name}: export line is not JSON ({e})"));
                serde_json::from_value(entry["message"].clone()).unwrap()
            })
            .collect();
        assert_eq!(&exported, expected, "{name}: export");
    }
}

#[tokio::test]
async fn hostile_text_survives_a_crash_and_resume_a_failure_and_a_summary() {
    use turnstile::{MaxPasses, ResumePolicy};

    let store: Arc<dyn Store> = Arc::new(SqliteStore::in_memory().await.unwrap());
    for (name, text) in hostile_strings() {
        let conversation = ConversationId::new();
        let calls = vec![
            ToolCall::new(format!("echo {text}"), "echo", json!({ "text": text })),
            ToolCall::new(format!("fail {text}"), "fail", json!({ "text": text })),
            ToolCall::new(format!("stall {text}"), "stall", json!({ "text": text })),
        ];
        let model = Arc::new(ScriptedModel::new(vec![
            ScriptedReply {
                text: text.clone(),
                ..ScriptedReply::tool_calls(calls.clone())
            },
            ScriptedReply::text(&text),
        ]));
        let echo = Echo::new();
        let stall = Stall::new();
        let session = AgentSession::new(
            Agent::new(model)
                .with_tool(echo.clone())
                .with_tool(Arc::new(Fail))
                .with_tool(stall.clone()),
            store.clone(),
            conversation,
            Namespace::new("hostile").unwrap(),
            ContextPolicy::new(2).unwrap(),
        );

        // The process "dies" while the third tool runs: the first two
        // results are journaled under their hostile call ids.
        let request = RequestId::new();
        tokio::select! {
            done = session.run(request, &text, RunContext::default()) => {
                panic!("{name}: the run should stall, got {done:?}")
            }
            () = stall.started() => {}
        }
        let held = store.admission(conversation).await.unwrap();
        let active = held.active.expect("the admission stays held");
        let ambiguous = session
            .resume_run(
                active.run_id,
                RunContext::default(),
                held.revision,
                ResumePolicy::default(),
            )
            .await;
        assert!(
            matches!(ambiguous, Err(Error::AmbiguousCheckpoint { .. })),
            "{name}: {ambiguous:?}"
        );
        let outcome = session
            .resume_run(
                active.run_id,
                RunContext::default(),
                held.revision,
                ResumePolicy::RetryInterruptedTurn,
            )
            .await
            .unwrap_or_else(|e| panic!("{name}: resume failed: {e:?}"));
        assert_eq!(echo.calls(), 1, "{name}: echo reused");
        assert_eq!(stall.calls(), 2, "{name}: stall re-run");
        let expected = vec![
            Message::user(&text),
            Message::assistant_with_calls(text.clone(), calls.clone()),
            Message::tool(calls[0].id.clone(), text.clone(), false),
            Message::tool(calls[1].id.clone(), text.clone(), true),
            Message::tool(calls[2].id.clone(), text.clone(), false),
            Message::assistant(&text),
        ];
        assert_eq!(outcome.messages, expected, "{name}: resumed outcome");

        // A model failing with the text: the run's recorded error keeps it.
        let failing = Arc::new(ScriptedModel::new(vec![
            ScriptedReply::text("never").failing_first(1, &text)
        ]));
        let failing = AgentSession::new(
            Agent::new(failing),
            store.clone(),
            conversation,
            Namespace::new("hostile").unwrap(),
            ContextPolicy::new(2).unwrap(),
        );
        let failed = failing
            .run(RequestId::new(), "fail please", RunContext::default())
            .await
            .unwrap_err();
        let Error::Model {
            run_id,
            revision,
            source,
        } = failed
        else {
            panic!("{name}: expected a model error, got {failed:?}");
        };
        assert_eq!(source.message, text, "{name}: model error message");
        let recorded = store.run(run_id).await.unwrap().unwrap().error.unwrap();
        assert!(recorded.ends_with(&text), "{name}: runs.error");
        let request = store.admission(conversation).await.unwrap().active.unwrap();
        failing.abandon(request.request_id, revision).await.unwrap();

        // A summary agent answering with the text: the stored summary is it.
        let summarizer = Arc::new(ScriptedModel::named(
            "summarizer",
            vec![ScriptedReply::text(&text)],
        ));
        let compacting = AgentSession::new(
            Agent::new(Arc::new(ScriptedModel::new(vec![ScriptedReply::text(
                "ok",
            )]))),
            store.clone(),
            conversation,
            Namespace::new("hostile").unwrap(),
            ContextPolicy::new(2).unwrap(),
        )
        .with_summary_agent(Agent::new(summarizer.clone()), MaxPasses::new(8).unwrap());
        compacting
            .run(RequestId::new(), "go on", RunContext::default())
            .await
            .unwrap_or_else(|e| panic!("{name}: summarized request failed: {e:?}"));
        assert!(summarizer.calls() > 0, "{name}: a pass ran");
        let summary = store.latest_summary(conversation).await.unwrap().unwrap();
        assert_eq!(summary.content, text, "{name}: summary");
    }
}

// ---------------------------------------------------------------------------
// Namespace isolation

/// Every secret of tenant A starts with this; no error, listing or log
/// another tenant can see may contain it.
const SECRET: &str = "SECRET-of-tenant-a";

fn tenant_a() -> Namespace {
    Namespace::new("tenant-a").unwrap()
}

fn tenant_b() -> Namespace {
    Namespace::new("tenant-b").unwrap()
}

/// Tenant A's agent: a tool round echoing a secret, then a secret answer.
/// Tenant B's sessions on A's ids use the same agent configuration, so any
/// refusal is the namespace's doing, not the fingerprint's.
fn secret_agent() -> (Agent, Arc<ScriptedModel>) {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedReply::tool_calls(vec![ToolCall::new(
            "c1",
            "echo",
            json!({ "text": format!("{SECRET} tool output") }),
        )])
        .with_usage(usage(10, 5)),
        ScriptedReply::text(format!("{SECRET} answer")).with_usage(usage(20, 4)),
    ]));
    (Agent::new(model.clone()).with_tool(Echo::new()), model)
}

#[track_caller]
fn assert_no_leak(what: &str, text: &str) {
    assert!(!text.contains(SECRET), "{what} leaks content: {text}");
    assert!(
        !text.contains("tenant-a"),
        "{what} names the other tenant: {text}"
    );
}

#[track_caller]
fn assert_namespace_mismatch<T: std::fmt::Debug>(
    what: &str,
    result: Result<T, Error>,
    conversation: ConversationId,
) {
    match &result {
        Err(
            e @ Error::NamespaceMismatch {
                conversation_id,
                namespace,
            },
        ) => {
            assert_eq!(*conversation_id, conversation, "{what}");
            assert_eq!(namespace, &tenant_b(), "{what}: the caller's namespace");
            assert_no_leak(what, &format!("{e} {e:?}"));
        }
        other => panic!("{what}: expected NamespaceMismatch, got {other:?}"),
    }
}

#[track_caller]
fn assert_request_mismatch<T: std::fmt::Debug>(what: &str, result: Result<T, Error>) {
    match &result {
        Err(e @ Error::RequestMismatch { .. }) => assert_no_leak(what, &format!("{e} {e:?}")),
        other => panic!("{what}: expected RequestMismatch, got {other:?}"),
    }
}

/// Everything the store can tell about tenant A's conversation, as text.
async fn tenant_a_state(
    store: &SqliteStore,
    conversation: ConversationId,
    requests: &[RequestId],
    run: turnstile::RunId,
) -> String {
    let mut state = format!(
        "{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n",
        store.conversation(&tenant_a(), conversation).await,
        store.admission(conversation).await,
        store.transcript_window(conversation, 100).await,
        store.run(run).await,
        store.checkpoints(run).await,
    );
    for request in requests {
        state += &format!(
            "{:?}\n{:?}\n{:?}\n",
            store.request(*request).await,
            store.request_messages(*request, 3).await,
            store.journal(*request, 1).await,
        );
    }
    state
}

async fn collect_stream(
    session: &AgentSession,
    request: RequestId,
    input: &str,
) -> Vec<Result<turnstile::Event, Error>> {
    use futures_util::StreamExt;
    session
        .stream(request, input.to_owned(), RunContext::default())
        .collect()
        .await
}

/// The one item of a refused stream.
fn only<T: std::fmt::Debug>(mut items: Vec<Result<T, Error>>) -> Result<T, Error> {
    assert_eq!(items.len(), 1, "a refused stream yields only its error");
    items.pop().unwrap()
}

#[tokio::test]
async fn no_entry_point_crosses_a_namespace_or_leaks_its_content() {
    use futures_util::StreamExt;
    use turnstile::admin::ListFilter;
    use turnstile::StoreAdmin;
    use turnstile::{Budget, ResumePolicy};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tenants.db");
    let sqlite = Arc::new(SqliteStore::open(&path).await.unwrap());
    let store: Arc<dyn Store> = sqlite.clone();

    // Tenant A: a committed request and a stopped one holding the admission.
    let conversation = ConversationId::new();
    let (agent, _) = secret_agent();
    let a = AgentSession::new(
        agent,
        store.clone(),
        conversation,
        tenant_a(),
        ContextPolicy::default(),
    );
    let (done, held) = (RequestId::new(), RequestId::new());
    let done_input = format!("{SECRET} first question");
    let held_input = format!("{SECRET} second question");
    let outcome = a
        .run(done, &done_input, RunContext::default())
        .await
        .unwrap();
    assert!(outcome.final_text.starts_with(SECRET));
    let one_turn = RunContext::default().with_budget(Budget {
        max_turns: Some(1),
        ..Budget::default()
    });
    let stopped = a.run(held, &held_input, one_turn).await.unwrap_err();
    let (run, revision) = stopped.stopped_run().expect("a stopped run");
    let before = tenant_a_state(&sqlite, conversation, &[done, held], run).await;
    assert!(before.contains(SECRET), "the state shows the content");

    // Tenant B on tenant A's conversation: every entry point is refused.
    let (agent, b_model) = secret_agent();
    let b = AgentSession::new(
        agent,
        store.clone(),
        conversation,
        tenant_b(),
        ContextPolicy::default(),
    );
    let ctx = RunContext::default;
    let c = conversation;
    let fresh = RequestId::new();
    assert_namespace_mismatch("run new", b.run(fresh, "hello", ctx()).await, c);
    assert_namespace_mismatch("run replay", b.run(done, &done_input, ctx()).await, c);
    assert_namespace_mismatch("run held", b.run(held, &held_input, ctx()).await, c);
    let items = collect_stream(&b, fresh, "hello").await;
    assert_namespace_mismatch("stream new", only(items), c);
    let items = collect_stream(&b, done, &done_input).await;
    assert_namespace_mismatch("stream replay", only(items), c);
    for policy in [
        ResumePolicy::RejectAmbiguous,
        ResumePolicy::RetryInterruptedTurn,
    ] {
        let resumed = b.resume_run(run, ctx(), revision, policy).await;
        assert_namespace_mismatch("resume_run", resumed, c);
        let recovered = b
            .recover_after_owner_exit(held, &held_input, ctx(), revision, policy)
            .await;
        assert_namespace_mismatch("recover_after_owner_exit", recovered, c);
        let items = b
            .resume_stream(run, ctx(), revision, policy)
            .collect()
            .await;
        assert_namespace_mismatch("resume_stream", only(items), c);
        let stream = b.recover_stream(held, held_input.clone(), ctx(), revision, policy);
        assert_namespace_mismatch("recover_stream", only(stream.collect().await), c);
    }
    let committed_run = outcome.run_id;
    let resumed = b
        .resume_run(committed_run, ctx(), revision, ResumePolicy::default())
        .await;
    assert_namespace_mismatch("resume_run of a committed run", resumed, c);
    assert_namespace_mismatch("recovery_usage", b.recovery_usage(held).await, c);
    assert_namespace_mismatch("abandon", b.abandon(held, revision).await, c);
    assert_namespace_mismatch("admission", b.admission().await, c);
    // The store's own namespace-scoped reads.
    assert_namespace_mismatch(
        "Store::conversation",
        store.conversation(&tenant_b(), c).await,
        c,
    );
    assert_namespace_mismatch(
        "Store::ensure_conversation",
        store.ensure_conversation(&tenant_b(), c).await,
        c,
    );
    assert_eq!(b_model.calls(), 0, "no model work for tenant B");
    assert_eq!(store.request(fresh).await.unwrap(), None, "nothing written");

    // Tenant B in a conversation of its own, naming tenant A's request and
    // run ids: refused as another conversation's, without its content.
    let own = ConversationId::new();
    let bravo_model = Arc::new(ScriptedModel::new(vec![ScriptedReply::text("bravo")]));
    let b_own = AgentSession::new(
        Agent::new(bravo_model.clone()).with_tool(Echo::new()),
        store.clone(),
        own,
        tenant_b(),
        ContextPolicy::default(),
    );
    let bravo = RequestId::new();
    b_own.run(bravo, "hello", ctx()).await.unwrap();
    let own_revision = store.admission(own).await.unwrap().revision;
    assert_request_mismatch("run replay", b_own.run(done, &done_input, ctx()).await);
    assert_request_mismatch("run held", b_own.run(held, &held_input, ctx()).await);
    let items = collect_stream(&b_own, done, &done_input).await;
    assert_request_mismatch("stream replay", only(items));
    for r in [run, committed_run] {
        let resumed = b_own
            .resume_run(r, ctx(), own_revision, ResumePolicy::RetryInterruptedTurn)
            .await;
        assert_request_mismatch("resume_run", resumed);
    }
    for request in [done, held] {
        let input = if request == done {
            &done_input
        } else {
            &held_input
        };
        let recovered = b_own
            .recover_after_owner_exit(request, input, ctx(), revision, Default::default())
            .await;
        assert_request_mismatch("recover_after_owner_exit", recovered);
        assert_request_mismatch("recovery_usage", b_own.recovery_usage(request).await);
        assert_request_mismatch("abandon", b_own.abandon(request, revision).await);
    }
    assert_eq!(bravo_model.calls(), 1, "only tenant B's own request ran");

    // Listings scoped to tenant B show none of tenant A's rows.
    let b_only = ListFilter {
        namespace: Some(tenant_b()),
        stale_after: std::time::Duration::ZERO,
        ..ListFilter::default()
    };
    let a_only = ListFilter {
        namespace: Some(tenant_a()),
        ..b_only.clone()
    };
    let conversations = sqlite
        .list_conversations(&b_only)
        .await
        .unwrap()
        .conversations;
    assert_eq!(
        conversations.iter().map(|c| c.id).collect::<Vec<_>>(),
        [own]
    );
    let requests = sqlite.list_requests(&b_only).await.unwrap();
    assert_eq!(
        requests.iter().map(|r| r.request_id).collect::<Vec<_>>(),
        [bravo]
    );
    let runs = sqlite.list_runs(&b_only).await.unwrap();
    assert!(runs.iter().all(|r| r.request_id == bravo), "{runs:?}");
    assert_eq!(runs.len(), 1);
    let scoped = ListFilter {
        conversation_id: Some(conversation),
        ..b_only.clone()
    };
    assert!(sqlite
        .list_conversations(&scoped)
        .await
        .unwrap()
        .conversations
        .is_empty());
    assert!(sqlite.list_requests(&scoped).await.unwrap().is_empty());
    assert!(sqlite.list_runs(&scoped).await.unwrap().is_empty());
    let stuck = ListFilter {
        stuck_only: true,
        ..b_only.clone()
    };
    assert!(sqlite
        .list_conversations(&stuck)
        .await
        .unwrap()
        .conversations
        .is_empty());
    assert!(sqlite.list_requests(&stuck).await.unwrap().is_empty());
    assert!(sqlite.list_runs(&stuck).await.unwrap().is_empty());
    // The same listings for tenant A do show its rows: the filter is real.
    let a_stuck = ListFilter {
        stuck_only: true,
        ..a_only.clone()
    };
    assert_eq!(
        sqlite.list_requests(&a_stuck).await.unwrap()[0].request_id,
        held
    );
    assert_eq!(sqlite.list_requests(&a_only).await.unwrap().len(), 2);

    // The command line, scoped to tenant B, refuses tenant A's conversation.
    let db = path.to_str().unwrap();
    let model_file = dir.path().join("script.json");
    std::fs::write(&model_file, r#"[{"text": "never"}]"#).unwrap();
    let model = cli_support::scripted(&model_file);
    let fresh_s = fresh.to_string();
    let (c, held_s, run_s, rev_s) = (
        conversation.to_string(),
        held.to_string(),
        run.to_string(),
        revision.to_string(),
    );
    let session_args = ["--db", db, "--conversation", &c, "--namespace", "tenant-b"];
    let refusals: Vec<(&str, Vec<&str>)> = vec![
        (
            "show",
            vec!["show", &c, "--db", db, "--namespace", "tenant-b"],
        ),
        (
            "export",
            vec!["export", &c, "--db", db, "--namespace", "tenant-b"],
        ),
        (
            "run",
            [
                &["run", "--request", &fresh_s, "--model", &model, "hi"][..],
                &session_args,
            ]
            .concat(),
        ),
        (
            "resume",
            [
                &["resume", &run_s, "--revision", &rev_s, "--model", &model][..],
                &session_args,
            ]
            .concat(),
        ),
        (
            "recover",
            [
                &["recover", &held_s, "--revision", &rev_s, "--model", &model][..],
                &session_args,
                &[held_input.as_str()],
            ]
            .concat(),
        ),
        (
            "abandon",
            [
                &["abandon", &held_s, "--revision", &rev_s][..],
                &session_args,
            ]
            .concat(),
        ),
    ];
    for (name, args) in refusals {
        let refused = cli_support::turnstile(&args);
        refused.assert_error(2, "not in namespace tenant-b");
        assert_no_leak(name, &format!("{refused:?}"));
    }
    for kind in ["conversations", "requests", "runs"] {
        for stuck in [false, true] {
            let mut args = vec!["ls", kind, "--db", db, "--namespace", "tenant-b", "--json"];
            if stuck {
                args.extend(["--stuck", "--stale-after", "0s"]);
            }
            let listed = cli_support::turnstile(&args);
            listed.assert_success();
            assert!(!listed.stdout.contains(&c), "ls {kind}: {listed:?}");
            assert!(!listed.stdout.contains(&held_s), "ls {kind}: {listed:?}");
            assert_no_leak("ls", &listed.stdout);
        }
    }

    // Tenant A's conversation is exactly as it was, and still its own.
    assert_eq!(
        tenant_a_state(&sqlite, conversation, &[done, held], run).await,
        before
    );
    let (agent, _) = secret_agent();
    let a = AgentSession::new(agent, store, conversation, tenant_a(), Default::default());
    // The budget is stored with the request: the resume raises it.
    let raised = ctx().with_budget(Budget {
        max_turns: Some(10),
        ..Budget::default()
    });
    let finished = a
        .resume_run(run, raised, revision, ResumePolicy::default())
        .await
        .unwrap();
    assert_eq!(finished.final_text, format!("{SECRET} answer"));
    assert_eq!(finished.request_id, held);
}

// ---------------------------------------------------------------------------
// Logs carry no content and no API key

/// Distinctive strings put into every kind of content a request carries.
const INPUT_MARK: &str = "INPUT-MARK-5b1e07";
const REPLY_MARK: &str = "REPLY-MARK-93c2aa";
const ARGS_MARK: &str = "ARGS-MARK-61f0d9";
const TOOL_MARK: &str = "TOOL-MARK-d4f08e";
const TOOL_ERROR_MARK: &str = "TOOL-ERROR-MARK-2c77b1";
const REPORT_MARK: &str = "REPORT-MARK-7e19c3";
const PROMPT_MARK: &str = "PROMPT-MARK-a0b4f2";
const KEY_MARK: &str = "sk-KEY-MARK-0a7e6c4d9b";

const MARKS: [&str; 8] = [
    INPUT_MARK,
    REPLY_MARK,
    ARGS_MARK,
    TOOL_MARK,
    TOOL_ERROR_MARK,
    REPORT_MARK,
    PROMPT_MARK,
    KEY_MARK,
];

mod capture {
    use std::sync::OnceLock;

    use tracing_subscriber::filter::LevelFilter;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::Layer;

    pub use super::log_capture::LogBuffer as Buffer;

    /// Everything logged by any thread of this test binary: `info` at level
    /// INFO (a service's usual setting), `trace` at every level.
    ///
    /// The subscriber is global, so the other tests of the binary log into
    /// it too once it is installed. That is safe: the checks look for
    /// strings only these tests produce (the marks, their own ids) and
    /// never for the absence of anything else, and no other test installs a
    /// subscriber or reads logs.
    pub struct Logs {
        pub info: Buffer,
        pub trace: Buffer,
    }

    /// Installs the global subscriber once.
    pub fn logs() -> &'static Logs {
        static LOGS: OnceLock<Logs> = OnceLock::new();
        LOGS.get_or_init(|| {
            let logs = Logs {
                info: Buffer::default(),
                trace: Buffer::default(),
            };
            let info = tracing_subscriber::fmt::layer()
                .with_writer(logs.info.clone())
                .with_ansi(false)
                .with_filter(LevelFilter::INFO);
            let trace = tracing_subscriber::fmt::layer()
                .with_writer(logs.trace.clone())
                .with_ansi(false)
                .with_filter(LevelFilter::TRACE);
            let subscriber = tracing_subscriber::registry().with(info).with(trace);
            tracing::subscriber::set_global_default(subscriber)
                .expect("no other global subscriber in this test binary");
            logs
        })
    }
}

/// A chat-completions endpoint on loopback answering from a script and
/// recording the authorization headers it was sent.
mod endpoint {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use axum::body::Bytes;
    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::{IntoResponse, Response};
    use axum::routing::post;
    use axum::Router;
    use serde_json::{json, Value};

    /// Status, content type and body of one answer.
    type Reply = (StatusCode, &'static str, String);

    #[derive(Clone, Default)]
    struct Script {
        replies: Arc<Mutex<VecDeque<Reply>>>,
        authorization: Arc<Mutex<Vec<Option<String>>>>,
        bodies: Arc<Mutex<Vec<String>>>,
    }

    pub struct Server {
        pub base_url: String,
        script: Script,
        task: tokio::task::JoinHandle<()>,
    }

    impl Server {
        pub async fn start() -> Self {
            let script = Script::default();
            let app = Router::new()
                .route("/v1/chat/completions", post(answer))
                .with_state(script.clone());
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let task = tokio::spawn(async move {
                axum::serve(listener, app).await.unwrap();
            });
            Server {
                base_url: format!("http://{addr}/v1"),
                script,
                task,
            }
        }

        /// Queues a JSON answer.
        pub fn json(&self, status: StatusCode, body: Value) {
            self.script.replies.lock().unwrap().push_back((
                status,
                "application/json",
                body.to_string(),
            ));
        }

        /// Queues an event stream of `chunks`, then `[DONE]`.
        pub fn sse(&self, chunks: &[Value]) {
            let mut body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
            body.push_str("data: [DONE]\n\n");
            self.script.replies.lock().unwrap().push_back((
                StatusCode::OK,
                "text/event-stream",
                body,
            ));
        }

        /// Queues a completion with `message`.
        pub fn completion(&self, message: Value) {
            self.json(
                StatusCode::OK,
                json!({
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "model": "test-model",
                    "choices": [{ "index": 0, "message": message, "finish_reason": "stop" }],
                    "usage": { "prompt_tokens": 7, "completion_tokens": 3 },
                }),
            );
        }

        pub fn authorization(&self) -> Vec<Option<String>> {
            self.script.authorization.lock().unwrap().clone()
        }

        /// Every request body received, as text.
        pub fn bodies(&self) -> String {
            self.script.bodies.lock().unwrap().concat()
        }

        pub fn pending(&self) -> usize {
            self.script.replies.lock().unwrap().len()
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    async fn answer(State(script): State<Script>, headers: HeaderMap, body: Bytes) -> Response {
        let body = String::from_utf8_lossy(&body).into_owned();
        script.bodies.lock().unwrap().push(body);
        let authorization = headers
            .get("authorization")
            .map(|v| v.to_str().unwrap_or_default().to_owned());
        script.authorization.lock().unwrap().push(authorization);
        let reply = script.replies.lock().unwrap().pop_front();
        match reply {
            None => (StatusCode::IM_A_TEAPOT, "script exhausted").into_response(),
            Some((status, content_type, body)) => {
                (status, [("content-type", content_type)], body).into_response()
            }
        }
    }
}

/// Tenant data with a marker in every field, through the scripted model.
fn marked_agent(model: Arc<dyn turnstile::Model>) -> Agent {
    Agent::new(model)
        .with_system_prompt(format!("system prompt {PROMPT_MARK}"))
        .with_tool(Echo::new())
        .with_tool(Arc::new(Fail))
        .with_verifier(Arc::new(Report(format!("report {REPORT_MARK}"))))
}

fn marked_script() -> Vec<ScriptedReply> {
    vec![
        ScriptedReply {
            text: format!("thinking {REPLY_MARK}"),
            ..ScriptedReply::tool_calls(vec![
                ToolCall::new(
                    "c1",
                    "echo",
                    json!({ "text": format!("{TOOL_MARK} {ARGS_MARK}") }),
                ),
                ToolCall::new("c2", "fail", json!({ "text": TOOL_ERROR_MARK })),
                ToolCall {
                    id: "c3".into(),
                    name: "echo".into(),
                    arguments: format!("not json {ARGS_MARK}"),
                    provider_metadata: None,
                },
                ToolCall::new("c4", format!("no-such-tool-{ARGS_MARK}"), json!({})),
            ])
        }
        .with_usage(usage(10, 5)),
        ScriptedReply::text(format!("the answer {REPLY_MARK}")).with_usage(usage(20, 4)),
    ]
}

fn input(n: u32) -> String {
    format!("question {n}: {INPUT_MARK}")
}

/// Drives the scripted model through success, replay, a refusal, a stopped
/// run and its resume, a busy conversation, a model failure and a recovery,
/// and a stream.
async fn scripted_requests(store: Arc<dyn Store>) -> ConversationId {
    use turnstile::{Budget, ResumePolicy};

    let conversation = ConversationId::new();
    let model = Arc::new(ScriptedModel::new(marked_script()));
    let session = AgentSession::new(
        marked_agent(model.clone()),
        store.clone(),
        conversation,
        Namespace::new("logs").unwrap(),
        ContextPolicy::default(),
    );
    let ctx = RunContext::default;
    // A request to its commit, and its replay.
    let first = RequestId::new();
    let outcome = session.run(first, &input(1), ctx()).await.unwrap();
    assert!(outcome.final_text.contains(REPLY_MARK));
    assert!(outcome.verification_reports[0].detail.contains(REPORT_MARK));
    assert!(session.run(first, &input(1), ctx()).await.unwrap().replayed);
    // The same id with another input; an oversized input.
    let mismatch = session.run(first, &input(2), ctx()).await;
    assert!(matches!(mismatch, Err(Error::RequestMismatch { .. })));
    let huge = input(3).repeat(100_000);
    let refused = session.run(RequestId::new(), &huge, ctx()).await;
    assert!(matches!(refused, Err(Error::InvalidInput(_))));

    // A run stopped by its budget after a tool round, a request refused
    // while it holds the conversation, then the resume.
    let one_turn = ctx().with_budget(Budget {
        max_turns: Some(1),
        ..Budget::default()
    });
    let held = RequestId::new();
    let stopped = session.run(held, &input(4), one_turn).await.unwrap_err();
    let (run, revision) = stopped.stopped_run().expect("stopped");
    let busy = session.run(RequestId::new(), &input(5), ctx()).await;
    assert!(matches!(busy, Err(Error::Busy { .. })), "{busy:?}");
    // The budget is stored with the request: the resume raises it.
    let raised = ctx().with_budget(Budget {
        max_turns: Some(10),
        ..Budget::default()
    });
    session
        .resume_run(run, raised, revision, ResumePolicy::default())
        .await
        .unwrap();

    // A model that fails, then a recovery by request id.
    let failing = Arc::new(ScriptedModel::new(vec![ScriptedReply::text(format!(
        "late answer {REPLY_MARK}"
    ))
    .failing_first(1, "overloaded")]));
    let flaky = AgentSession::new(
        marked_agent(failing),
        store,
        conversation,
        Namespace::new("logs").unwrap(),
        ContextPolicy::default(),
    );
    let request = RequestId::new();
    let failed = flaky.run(request, &input(6), ctx()).await.unwrap_err();
    let (_, revision) = failed.stopped_run().expect("stopped");
    flaky
        .recover_after_owner_exit(request, &input(6), ctx(), revision, ResumePolicy::default())
        .await
        .unwrap();

    // A stream.
    let items = collect_stream(&session, RequestId::new(), &input(7)).await;
    assert!(matches!(
        items.last(),
        Some(Ok(turnstile::Event::ConversationCommitted { .. }))
    ));
    conversation
}

/// The same through the OpenAI-compatible model with an API key: a tool
/// round, a streamed answer, and an endpoint that refuses the key while
/// quoting it back.
async fn openai_requests(store: Arc<dyn Store>) -> ConversationId {
    use axum::http::StatusCode;
    use turnstile::{OpenAiConfig, OpenAiModel};

    let server = endpoint::Server::start().await;
    server.completion(json!({
        "role": "assistant",
        "content": format!("calling {REPLY_MARK}"),
        "tool_calls": [{
            "id": "call_1",
            "type": "function",
            "function": {
                "name": "echo",
                "arguments": json!({ "text": format!("{TOOL_MARK} {ARGS_MARK}") }).to_string(),
            },
        }],
    }));
    server.completion(json!({ "role": "assistant", "content": format!("done {REPLY_MARK}") }));
    let delta = |content: String| {
        json!({
            "id": "chatcmpl-2",
            "object": "chat.completion.chunk",
            "choices": [{ "index": 0, "delta": { "content": content }, "finish_reason": null }],
        })
    };
    server.sse(&[
        delta(format!("streamed {REPLY_MARK} ")),
        delta(format!("more {REPLY_MARK}")),
    ]);
    server.json(
        StatusCode::UNAUTHORIZED,
        json!({ "error": {
            "message": format!("Incorrect API key provided: {KEY_MARK}."),
            "type": "invalid_request_error",
        }}),
    );

    let config = OpenAiConfig::new(&server.base_url, "test-model").with_api_key(KEY_MARK);
    let model = Arc::new(OpenAiModel::new(config).unwrap());
    let conversation = ConversationId::new();
    let session = AgentSession::new(
        marked_agent(model),
        store,
        conversation,
        Namespace::new("logs").unwrap(),
        ContextPolicy::default(),
    );
    let outcome = session
        .run(RequestId::new(), &input(10), RunContext::default())
        .await
        .unwrap();
    assert!(outcome.final_text.contains(REPLY_MARK));
    let items = collect_stream(&session, RequestId::new(), &input(11)).await;
    match items.last() {
        Some(Ok(turnstile::Event::ConversationCommitted { outcome, .. })) => {
            assert!(outcome.final_text.contains(REPLY_MARK), "{outcome:?}");
        }
        other => panic!("stream did not commit: {other:?}"),
    }
    let refused = session
        .run(RequestId::new(), &input(12), RunContext::default())
        .await;
    match refused {
        Err(Error::Model { source, .. }) => {
            assert!(source.message.contains("401"), "{source:?}");
            assert!(!source.message.contains(KEY_MARK), "{source:?}");
        }
        other => panic!("expected a model error, got {other:?}"),
    }
    // The endpoint got the content, and the key on every call.
    let bodies = server.bodies();
    for mark in [INPUT_MARK, PROMPT_MARK, TOOL_MARK, REPLY_MARK] {
        assert!(bodies.contains(mark), "{mark} was sent");
    }
    assert_eq!(server.pending(), 0, "every scripted answer was used");
    let sent = server.authorization();
    assert_eq!(sent.len(), 4);
    for header in sent {
        assert_eq!(header, Some(format!("Bearer {KEY_MARK}")));
    }
    conversation
}

#[tokio::test]
async fn library_logs_carry_no_content_and_no_api_key() {
    let logs = capture::logs();
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(dir.path().join("logs.db")).await.unwrap());
    let scripted = scripted_requests(store.clone()).await;
    let openai = openai_requests(store.clone()).await;

    // The markers are in the database: the runs really carried them.
    let transcript = format!("{:?}", store.transcript_window(scripted, 200).await);
    for mark in &MARKS[..5] {
        assert!(transcript.contains(mark), "{mark} was stored");
    }

    // Both captures saw the library at work: the errors it returned (in
    // their request spans), and at TRACE its debug events, the driver's
    // statements and the HTTP client. So the checks below can fail.
    let info = logs.info.text();
    let trace = logs.trace.text();
    for expected in [
        "exceeded its turns budget",
        "is busy with request",
        "is bound to another input",
        "model failed",
        "401 Unauthorized",
        &scripted.to_string(),
        &openai.to_string(),
    ] {
        assert!(
            info.contains(expected),
            "INFO log lacks {expected:?}:\n{info}"
        );
    }
    for expected in [
        "turnstile_core::session::turns",
        "turnstile_openai",
        "sqlx::query",
        "hyper_util",
    ] {
        assert!(trace.contains(expected), "TRACE log lacks {expected:?}");
    }
    for mark in MARKS {
        for (level, log) in [("INFO", &info), ("TRACE", &trace)] {
            let leak = log.lines().find(|line| line.contains(mark));
            assert!(leak.is_none(), "{mark} in the {level} log: {leak:?}");
        }
    }
}

/// Regression: a chat completion whose fields have the wrong JSON type was
/// refused with serde's message, and serde quotes the offending string
/// whole. That string is model output: it landed in `ModelError::message`,
/// in the `error=` event the session's `#[instrument(err)]` logs at ERROR,
/// and in `runs.error`.
#[tokio::test]
async fn a_malformed_completion_is_not_quoted_into_errors_or_logs() {
    use axum::http::StatusCode;
    use turnstile::{OpenAiConfig, OpenAiModel};

    const MALFORMED_MARK: &str = "MALFORMED-REPLY-MARK-44d1";
    let logs = capture::logs();
    let server = endpoint::Server::start().await;
    // `message` should be an object; this server sends the text itself.
    server.json(
        StatusCode::OK,
        json!({ "choices": [{ "index": 0, "message": format!("private {MALFORMED_MARK}") }] }),
    );
    let config = OpenAiConfig::new(&server.base_url, "test-model");
    let session = AgentSession::new(
        Agent::new(Arc::new(OpenAiModel::new(config).unwrap())),
        Arc::new(SqliteStore::in_memory().await.unwrap()),
        ConversationId::new(),
        Namespace::new("malformed").unwrap(),
        ContextPolicy::default(),
    );
    let failed = session
        .run(RequestId::new(), "hello", RunContext::default())
        .await
        .unwrap_err();
    assert!(matches!(failed, Error::Model { .. }), "{failed:?}");
    let quoted = failed.to_string().contains(MALFORMED_MARK);
    let logged = logs.info.text().contains(MALFORMED_MARK);
    assert!(
        !quoted && !logged,
        "model output quoted in the error: {quoted}, in the ERROR log: {logged}: {failed}"
    );
}

/// Runs the built binary with `env` set and stdin closed, off the async
/// runtime (the endpoint it may call runs on it).
async fn cli(args: Vec<String>, env: Vec<(&'static str, String)>) -> cli_support::Run {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut command = cli_support::command(&args);
        command.stdin(std::process::Stdio::null());
        for (name, value) in env {
            command.env(name, value);
        }
        let output = command.output().expect("run turnstile");
        cli_support::Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_line_stderr_carries_no_content_and_no_api_key() {
    use axum::http::StatusCode;

    const KEY_VAR: &str = "TURNSTILE_SECURITY_TEST_KEY";
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cli.db").to_str().unwrap().to_owned();
    // A tool round (a real tool on marked arguments, an unknown tool named
    // by a marker), then a marked answer. A second script that fails its
    // first call stops the first run; the recovery uses the first script
    // (same model name and tools: the same agent fingerprint).
    let turns = json!([
        {
            "text": format!("thinking {REPLY_MARK}"),
            "tool_calls": [
                {"id": "c1", "name": "word_count", "arguments": {"text": format!("{ARGS_MARK} {TOOL_MARK}")}},
                {"id": "c2", "name": format!("no-such-tool-{ARGS_MARK}"), "arguments": {}},
            ],
        },
        {"text": format!("the answer {REPLY_MARK}")},
    ]);
    let script = cli_support::script(dir.path(), "marked.json", turns.clone());
    let mut failing = turns;
    failing[0]["failure"] = json!("overloaded");
    failing[0]["fail_times"] = json!(1);
    let failing = cli_support::script(dir.path(), "failing.json", failing);
    let server = endpoint::Server::start().await;
    server.completion(json!({
        "role": "assistant",
        "content": null,
        "tool_calls": [{
            "id": "call_1",
            "type": "function",
            "function": {
                "name": "word_count",
                "arguments": json!({ "text": format!("{ARGS_MARK} {TOOL_MARK}") }).to_string(),
            },
        }],
    }));
    server.completion(json!({ "role": "assistant", "content": format!("done {REPLY_MARK}") }));
    server.json(
        StatusCode::UNAUTHORIZED,
        json!({ "error": { "message": format!("Incorrect API key provided: {KEY_MARK}") } }),
    );

    let owned = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    let conversation = ConversationId::new().to_string();
    let scripted = cli_support::scripted(&script);
    let failing = cli_support::scripted(&failing);
    let (first, second) = (RequestId::new().to_string(), RequestId::new().to_string());
    let session = ["--db", &db, "--conversation", &conversation];
    let openai = [
        "--model",
        "openai:test-model",
        "--base-url",
        &server.base_url,
        "--api-key-env",
        KEY_VAR,
    ];
    let first_input = input(20);
    let (third, fourth) = (RequestId::new().to_string(), RequestId::new().to_string());
    let steps: Vec<(&str, Vec<String>, i32)> = vec![
        // Stops on the model failure (exit 1), holding the conversation.
        (
            "run fails",
            owned(
                &[
                    &["run", "--request", &first, "--model", &failing][..],
                    &session,
                    &[&first_input],
                ]
                .concat(),
            ),
            1,
        ),
        (
            "run busy",
            owned(
                &[
                    &["run", "--model", &scripted, "--request", &second][..],
                    &session,
                    &[&input(21)],
                ]
                .concat(),
            ),
            3,
        ),
        (
            "recover",
            owned(
                &[
                    &["recover", &first, "--revision", "1", "--model", &scripted][..],
                    &session,
                    &[&first_input],
                ]
                .concat(),
            ),
            0,
        ),
        (
            "replay",
            owned(
                &[
                    &["run", "--request", &first, "--model", &scripted, "--json"][..],
                    &session,
                    &[&first_input],
                ]
                .concat(),
            ),
            0,
        ),
        (
            "mismatch",
            owned(
                &[
                    &["run", "--request", &first, "--model", &scripted][..],
                    &session,
                    &[&input(22)],
                ]
                .concat(),
            ),
            2,
        ),
        (
            "openai run",
            owned(
                &[
                    &["run", "--request", &third][..],
                    &openai,
                    &session,
                    &[&input(23)],
                ]
                .concat(),
            ),
            0,
        ),
        (
            "openai refused key",
            owned(
                &[
                    &["run", "--request", &fourth][..],
                    &openai,
                    &session,
                    &[&input(24)],
                ]
                .concat(),
            ),
            1,
        ),
        ("show", owned(&["show", &conversation, "--db", &db]), 0),
        ("export", owned(&["export", &conversation, "--db", &db]), 0),
        ("ls", owned(&["ls", "requests", "--db", &db]), 0),
    ];

    // The same steps at the default level and at the most verbose one, on
    // a fresh copy of the script's state each time.
    let mut stdout = String::new();
    for level in [None, Some("trace")] {
        let _ = std::fs::remove_file(&db);
        for suffix in ["-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{db}{suffix}"));
        }
        let mut stderr = String::new();
        for (name, args, code) in &steps {
            let mut env = vec![(KEY_VAR, KEY_MARK.to_owned())];
            if let Some(level) = level {
                env.push(("RUST_LOG", level.to_owned()));
            }
            let run = cli(args.clone(), env).await;
            assert_eq!(run.code, *code, "{name} at {level:?}: {run:#?}");
            for mark in MARKS {
                let leak = run.stderr.lines().find(|line| line.contains(mark));
                assert!(
                    leak.is_none(),
                    "{name} at {level:?}: {mark} on stderr: {leak:?}"
                );
            }
            stdout += &run.stdout;
            stderr += &run.stderr;
        }
        match level {
            // Failures print one `error:` line each, and nothing else.
            None => assert_eq!(
                stderr.lines().filter(|l| l.starts_with("error: ")).count(),
                stderr.lines().count(),
                "{stderr}"
            ),
            // Everything logs, so the check above could fail.
            Some(_) => {
                for expected in [
                    "turnstile_core::",
                    "sqlx::query",
                    "hyper_util",
                    "model failed",
                ] {
                    assert!(
                        stderr.contains(expected),
                        "no {expected:?} in the trace log"
                    );
                }
            }
        }
        // Put the endpoint's answers back for the second pass.
        if level.is_none() {
            server.completion(json!({
                "role": "assistant",
                "content": null,
                "tool_calls": [{
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "word_count",
                        "arguments": json!({ "text": format!("{ARGS_MARK} {TOOL_MARK}") }).to_string(),
                    },
                }],
            }));
            server.completion(
                json!({ "role": "assistant", "content": format!("done {REPLY_MARK}") }),
            );
            server.json(
                StatusCode::UNAUTHORIZED,
                json!({ "error": { "message": format!("Incorrect API key provided: {KEY_MARK}") } }),
            );
        }
    }
    // The content did flow: the commands print it on stdout, where it
    // belongs; the key reached the endpoint.
    for mark in [INPUT_MARK, REPLY_MARK, ARGS_MARK] {
        assert!(stdout.contains(mark), "{mark} on stdout");
    }
    assert!(!stdout.contains(KEY_MARK));
    assert_eq!(server.pending(), 0);
    let sent = server.authorization();
    assert_eq!(sent.len(), 6);
    assert!(sent
        .iter()
        .all(|h| h.as_deref() == Some(&format!("Bearer {KEY_MARK}"))));
}

// ---------------------------------------------------------------------------
// Database files are private

#[cfg(unix)]
fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// The database and, where they exist, its `-wal` and `-shm` files.
#[cfg(unix)]
fn database_files(db: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = vec![db.to_owned()];
    for suffix in ["-wal", "-shm"] {
        let mut name = db.as_os_str().to_owned();
        name.push(suffix);
        let path = std::path::PathBuf::from(name);
        if path.exists() {
            files.push(path);
        }
    }
    files
}

#[cfg(unix)]
#[tokio::test]
async fn database_files_are_created_readable_by_their_owner_only() {
    use turnstile::Durability;
    use turnstile::SqliteOptions;

    let dir = tempfile::tempdir().unwrap();
    for durability in [Durability::Full, Durability::Normal] {
        let path = dir.path().join(format!("{durability:?}.db"));
        let options = SqliteOptions {
            durability,
            ..SqliteOptions::default()
        };
        let store = Arc::new(
            SqliteStore::open_with(&path, options.clone())
                .await
                .unwrap(),
        );
        let model = Arc::new(ScriptedModel::new(vec![ScriptedReply::text("ok")]));
        let session = AgentSession::new(
            Agent::new(model),
            store.clone(),
            ConversationId::new(),
            Namespace::new("modes").unwrap(),
            ContextPolicy::default(),
        );
        session
            .run(RequestId::new(), "hello", RunContext::default())
            .await
            .unwrap();
        // While open, a WAL database has all three files, with data.
        let files = database_files(&path);
        assert_eq!(files.len(), 3, "{files:?}");
        for file in &files {
            assert_eq!(mode(file), 0o600, "{} while open", file.display());
        }
        drop(session);
        drop(store);
        SqliteStore::open_with(&path, options).await.unwrap();
        for file in database_files(&path) {
            assert_eq!(mode(&file), 0o600, "{} after a reopen", file.display());
        }
    }

    // The command line creates its database the same way, whatever the
    // umask of the shell that starts it.
    let script = cli_support::script(dir.path(), "ok.json", json!([{ "text": "ok" }]));
    for umask in ["000", "022", "077"] {
        let db = dir.path().join(format!("cli-{umask}.db"));
        let output = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("umask {umask} && exec \"$@\""))
            .arg("sh")
            .arg(env!("CARGO_BIN_EXE_turnstile"))
            .args([
                "run",
                "--json",
                "--db",
                db.to_str().unwrap(),
                "--conversation",
            ])
            .arg(ConversationId::new().to_string())
            .args(["--model", &cli_support::scripted(&script), "hello"])
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        assert!(output.status.success(), "umask {umask}: {output:?}");
        let files = database_files(&db);
        assert!(!files.is_empty());
        for file in files {
            assert_eq!(mode(&file), 0o600, "umask {umask}: {}", file.display());
        }
    }
}
