//! Bad input through the public API: each case is a typed error (the
//! `Error` variant is matched), loses nothing that was written before, and
//! never panics. One table-driven test per kind of input, each row named.
//!
//! The cases, by test:
//! - ids parsed from text (`malformed_ids_are_invalid_input`): empty, not a
//!   uuid, too short, nil, braces and junk, SQL; the nil uuid wrapped.
//! - ids, namespaces and revisions decoded with serde
//!   (`serde_refuses_malformed_ids_namespaces_and_revisions`): not a uuid,
//!   empty string, a number, SQL, null; empty, 129-byte, `/`, space and
//!   non-ASCII namespaces; negative, fractional, past-u64 and quoted
//!   revisions. The nil uuid decoded with serde is refused
//!   (`nil_ids_decoded_with_serde_are_refused`).
//! - namespaces (`malformed_namespaces_are_invalid_input`): empty, 129
//!   bytes, slash, space, non-ASCII, NUL, newline, quote.
//! - inputs to `run` and to `recover_after_owner_exit`: empty, spaces,
//!   newlines and tabs, 10 MB, one byte over the limit, a request id equal
//!   to the conversation id; the largest accepted input commits verbatim.
//! - unknown ids: resume of an unknown run, recover / abandon /
//!   recovery_usage of an unknown request.
//! - revisions: wrong revisions of an idle request (`NotActive`); stale,
//!   ahead, zero, "-1" (u64::MAX) and past-i64::MAX revisions of a held
//!   request for resume (both policies), recover and abandon (`Conflict`).
//!   Negative revisions cannot be written in the API (`Revision(u64)`);
//!   serde refuses "-1" here and the command line refuses it in
//!   tests/cli_bad_input.rs.
//! - nothing to take over (`resume_and_recover_of_requests_that_hold_nothing`):
//!   recover of an idle (completed) request and resume of its run (both
//!   replay), recover with another input, recover / resume / run / abandon /
//!   recovery_usage of an abandoned request, resume of a superseded run.
//! - damaged rows met through the session (`DAMAGES`): corrupt JSON in
//!   `transcript.meta`, of a committed entry and of a held request's
//!   message (not JSON, not an object, wrong field type, cut short,
//!   missing), unknown enum tags in every enum column (message roles,
//!   checkpoint phases, request, run and journal statuses, wrong case
//!   included), a foreign agent fingerprint, a
//!   malformed admission run id, negative revision and conversation
//!   version, an invalid stored namespace, a malformed input hash; plus
//!   journal arguments that are not JSON (opaque text by contract) and a new
//!   request over a damaged transcript. tests/sqlite_durability/corrupt.rs
//!   holds every store read to the same rule, row by row.
//! - database files: not a database (text, random bytes, truncated header),
//!   unusable paths (missing parent, a directory), a database from a newer
//!   schema (byte-identical refusals of closed files in
//!   tests/sqlite_durability/schema.rs), a read-only database file, a
//!   truncated WAL.

use std::sync::Arc;

use serde_json::json;
use turnstile::session::MAX_INPUT_BYTES;
use turnstile::{
    Agent, AgentSession, ContextPolicy, ConversationId, Error, Namespace, RequestId, ResumePolicy,
    Revision, RunContext, RunId, ScriptedModel, ScriptedReply, SqliteStore, Store, ToolCall,
};
use turnstile_testkit::tools::{Echo, Stall};

use crate::cli_support;

fn invalid(result: Result<impl std::fmt::Debug, Error>) -> String {
    match result {
        Err(Error::InvalidInput(message)) => message,
        other => panic!("expected InvalidInput, got {other:?}"),
    }
}

#[test]
fn malformed_ids_are_invalid_input() {
    let nil = "00000000-0000-0000-0000-000000000000";
    let rows: [(&str, &str); 6] = [
        ("empty", ""),
        ("not a uuid", "not-a-uuid"),
        ("too short", "0123456789abcdef"),
        ("nil", nil),
        ("braces and junk", "{123e4567-e89b-12d3-a456-42661417400}"),
        ("sql", "'; DROP TABLE requests; --"),
    ];
    for (name, text) in rows {
        let message = invalid(text.parse::<ConversationId>());
        assert!(message.contains("conversation id"), "{name}: {message}");
        invalid(text.parse::<RequestId>());
        invalid(text.parse::<RunId>());
    }
    invalid(RequestId::from_uuid(uuid::Uuid::nil()));
}

#[test]
fn malformed_namespaces_are_invalid_input() {
    let long = "a".repeat(Namespace::MAX_LEN + 1);
    let rows: [(&str, &str); 8] = [
        ("empty", ""),
        ("129 bytes", &long),
        ("slash", "tenant/a"),
        ("space", "tenant a"),
        ("non-ASCII", "naïve"),
        ("NUL", "a\0b"),
        ("newline", "a\nb"),
        ("quote", "a'b"),
    ];
    for (name, text) in rows {
        let message = invalid(Namespace::new(text));
        assert!(message.contains("namespace"), "{name}: {message}");
    }
    let longest = "a".repeat(Namespace::MAX_LEN);
    assert!(Namespace::new(longest).is_ok());
    assert!(Namespace::new("Tenant_1.prod-eu").is_ok());
}

struct Fixture {
    store: Arc<SqliteStore>,
    session: AgentSession,
    model: Arc<ScriptedModel>,
    conversation: ConversationId,
}

impl Fixture {
    async fn new() -> Self {
        let store = Arc::new(SqliteStore::in_memory().await.unwrap());
        let model = Arc::new(ScriptedModel::new(vec![ScriptedReply::text("ok")]));
        let conversation = ConversationId::new();
        let session = AgentSession::new(
            Agent::new(model.clone()),
            store.clone(),
            conversation,
            Namespace::new("bad-input").unwrap(),
            ContextPolicy::default(),
        );
        Self {
            store,
            session,
            model,
            conversation,
        }
    }

    /// Nothing was written: no conversation, no request, no model call.
    async fn assert_untouched(&self, request: RequestId) {
        assert!(matches!(
            self.store.admission(self.conversation).await,
            Err(Error::NotFound { .. })
        ));
        assert_eq!(self.store.request(request).await.unwrap(), None);
        assert_eq!(self.model.calls(), 0);
    }
}

#[tokio::test]
async fn bad_run_input_is_refused_before_anything_is_written() {
    let huge = "x".repeat(10 * 1024 * 1024);
    let rows: [(&str, &str); 5] = [
        ("empty", ""),
        ("spaces", "   "),
        ("newlines and tabs", "\n\t\r\n"),
        ("10 MB", &huge),
        ("one byte over the limit", &huge[..MAX_INPUT_BYTES + 1]),
    ];
    for (name, input) in rows {
        let f = Fixture::new().await;
        let request = RequestId::new();
        let message = invalid(f.session.run(request, input, RunContext::default()).await);
        assert!(message.contains("input"), "{name}: {message}");
        f.assert_untouched(request).await;
    }

    // A request id equal to the conversation id.
    let f = Fixture::new().await;
    let same = RequestId::from_uuid(f.conversation.as_uuid()).unwrap();
    let message = invalid(f.session.run(same, "hello", RunContext::default()).await);
    assert!(message.contains("conversation id"), "{message}");
    f.assert_untouched(same).await;
}

#[tokio::test]
async fn the_largest_accepted_input_commits_verbatim() {
    let f = Fixture::new().await;
    let input = "é".repeat(MAX_INPUT_BYTES / 2);
    let outcome = f
        .session
        .run(RequestId::new(), &input, RunContext::default())
        .await
        .unwrap();
    assert_eq!(outcome.messages[0].text(), input);
}

#[tokio::test]
async fn unknown_ids_and_wrong_revisions_are_typed_errors() {
    let f = Fixture::new().await;
    let ctx = RunContext::default;
    let admission = f.session.admission().await;
    assert!(
        matches!(admission, Err(Error::NotFound { .. })),
        "an unknown conversation: {admission:?}"
    );
    let done = RequestId::new();
    f.session.run(done, "hello", ctx()).await.unwrap();
    let revision = f.store.admission(f.conversation).await.unwrap().revision;
    let idle = f.session.admission().await.unwrap();
    assert_eq!((idle.revision, idle.active), (revision, None));
    let unknown = RequestId::new();

    let resume = f
        .session
        .resume_run(RunId::new(), ctx(), revision, Default::default())
        .await;
    assert!(
        matches!(resume, Err(Error::NotFound { what: "run", .. })),
        "{resume:?}"
    );
    let recover = f
        .session
        .recover_after_owner_exit(unknown, "hello", ctx(), revision, Default::default())
        .await;
    assert!(
        matches!(
            recover,
            Err(Error::NotFound {
                what: "request",
                ..
            })
        ),
        "{recover:?}"
    );
    let abandon = f.session.abandon(unknown, revision).await;
    assert!(
        matches!(abandon, Err(Error::NotFound { .. })),
        "{abandon:?}"
    );
    let usage = f.session.recovery_usage(unknown).await;
    assert!(matches!(usage, Err(Error::NotFound { .. })), "{usage:?}");

    // An idle (completed) request: nothing to abandon or measure.
    let abandon = f.session.abandon(done, revision).await;
    assert!(
        matches!(abandon, Err(Error::NotActive { .. })),
        "{abandon:?}"
    );
    let usage = f.session.recovery_usage(done).await;
    assert!(matches!(usage, Err(Error::NotActive { .. })), "{usage:?}");
    for wrong in [Revision(0), Revision(revision.0 + 1), Revision(u64::MAX)] {
        let abandon = f.session.abandon(done, wrong).await;
        assert!(
            matches!(abandon, Err(Error::NotActive { .. })),
            "{abandon:?}"
        );
    }
    assert_eq!(
        f.store.admission(f.conversation).await.unwrap().revision,
        revision
    );
}

#[tokio::test]
async fn a_file_that_is_not_a_database_is_refused_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let rows: [(&str, Vec<u8>); 3] = [
        ("text", b"hello, this is not a database\n".to_vec()),
        (
            "random bytes",
            (0..8192u32).map(|i| (i * 7919 % 251) as u8).collect(),
        ),
        ("truncated header", b"SQLite format 3\0".to_vec()),
    ];
    for (name, bytes) in rows {
        let path = dir.path().join(format!("{}.db", name.replace(' ', "_")));
        std::fs::write(&path, &bytes).unwrap();
        match SqliteStore::open(&path).await {
            Err(Error::Store(_)) => {}
            other => panic!("{name}: expected a store error, got {other:?}"),
        }
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "{name} was modified");
    }
}

#[tokio::test]
async fn unusable_paths_are_store_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing_parent = dir.path().join("no/such/dir/x.db");
    assert!(matches!(
        SqliteStore::open(&missing_parent).await,
        Err(Error::Store(_))
    ));
    assert!(matches!(
        SqliteStore::open(dir.path()).await,
        Err(Error::Store(_))
    ));
}

#[tokio::test]
async fn a_truncated_wal_keeps_the_last_complete_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wal.db");
    let copy = dir.path().join("copy.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let model = Arc::new(ScriptedModel::new(vec![ScriptedReply::text("ok")]));
    let conversation = ConversationId::new();
    let session = AgentSession::new(
        Agent::new(model),
        Arc::new(store),
        conversation,
        Namespace::new("wal").unwrap(),
        ContextPolicy::default(),
    );
    for i in 0..3 {
        session
            .run(
                RequestId::new(),
                &format!("request {i}"),
                RunContext::default(),
            )
            .await
            .unwrap();
    }
    // Copy the database and its WAL while the store is open (as a crash
    // would leave them), then cut the WAL in the middle of a frame.
    std::fs::copy(&path, &copy).unwrap();
    let wal = std::fs::read(dir.path().join("wal.db-wal")).unwrap();
    assert!(wal.len() > 4096, "the WAL holds frames");
    std::fs::write(dir.path().join("copy.db-wal"), &wal[..wal.len() - 1000]).unwrap();

    let reopened = SqliteStore::open(&copy).await.unwrap();
    let admission = reopened.admission(conversation).await;
    // Whatever prefix of commits survived is consistent: the conversation
    // is absent, or readable with whole requests in its transcript and, if
    // the cut fell inside a request, that request active and resumable.
    match admission {
        Ok(admission) => {
            let transcript = reopened.transcript_window(conversation, 100).await.unwrap();
            assert_eq!(transcript.len() % 2, 0, "whole requests only");
            if let Some(active) = admission.active {
                let request = reopened.request(active.request_id).await.unwrap().unwrap();
                assert_eq!(request.status, turnstile::store::RequestStatus::Active);
                assert!(
                    reopened
                        .request_messages(active.request_id, 1)
                        .await
                        .unwrap()
                        .len()
                        == 1
                );
            }
        }
        Err(Error::NotFound { .. }) => {}
        Err(other) => panic!("unexpected {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// Ids, namespaces and revisions decoded with serde (JSON APIs, config files)

#[test]
fn serde_refuses_malformed_ids_namespaces_and_revisions() {
    let long = format!("\"{}\"", "a".repeat(Namespace::MAX_LEN + 1));
    let ids: [(&str, &str); 5] = [
        ("not a uuid", r#""not-a-uuid""#),
        ("empty string", r#""""#),
        ("a number", "42"),
        ("sql", r#""'; DROP TABLE runs; --""#),
        ("null", "null"),
    ];
    for (name, json) in ids {
        assert!(
            serde_json::from_str::<RequestId>(json).is_err(),
            "request id: {name}"
        );
        assert!(
            serde_json::from_str::<ConversationId>(json).is_err(),
            "conversation id: {name}"
        );
        assert!(
            serde_json::from_str::<RunId>(json).is_err(),
            "run id: {name}"
        );
    }
    let namespaces: [(&str, &str); 5] = [
        ("empty", r#""""#),
        ("129 bytes", &long),
        ("slash", r#""tenant/a""#),
        ("space", r#""tenant a""#),
        ("non-ASCII", r#""naïve""#),
    ];
    for (name, json) in namespaces {
        let error = serde_json::from_str::<Namespace>(json).unwrap_err();
        assert!(error.to_string().contains("namespace"), "{name}: {error}");
    }
    let revisions: [(&str, &str); 4] = [
        ("negative", "-1"),
        ("fractional", "1.5"),
        ("past u64", "18446744073709551616"),
        ("a string", r#""3""#),
    ];
    for (name, json) in revisions {
        assert!(
            serde_json::from_str::<Revision>(json).is_err(),
            "revision: {name}"
        );
    }
}

/// Regression: `RequestId`, `ConversationId` and `RunId` once derived
/// `Deserialize` with `#[serde(transparent)]`, which skipped the nil check of
/// `from_uuid` and `FromStr`; a nil id decoded from JSON was then accepted
/// by the session (`run` committed a request with the nil request id, or
/// created a conversation with the nil id).
#[tokio::test]
async fn nil_ids_decoded_with_serde_are_refused() {
    let nil = r#""00000000-0000-0000-0000-000000000000""#;
    // Parsed from text, the nil uuid is refused.
    invalid(nil.trim_matches('"').parse::<RequestId>());
    invalid(nil.trim_matches('"').parse::<ConversationId>());
    invalid(nil.trim_matches('"').parse::<RunId>());
    // Decoded with serde, too.
    assert!(
        serde_json::from_str::<RequestId>(nil).is_err(),
        "request id"
    );
    assert!(
        serde_json::from_str::<ConversationId>(nil).is_err(),
        "conversation id"
    );
    assert!(serde_json::from_str::<RunId>(nil).is_err(), "run id");

    // Decoded with serde: refused by serde, or else by the session, which
    // then writes nothing.
    if let Ok(request) = serde_json::from_str::<RequestId>(nil) {
        let f = Fixture::new().await;
        let result = f.session.run(request, "hello", RunContext::default()).await;
        let stored = f.store.request(request).await.unwrap().is_some();
        assert!(
            matches!(result, Err(Error::InvalidInput(_))) && !stored,
            "a nil request id was accepted: {result:?}, stored: {stored}"
        );
    }
    if let Ok(conversation) = serde_json::from_str::<ConversationId>(nil) {
        let store = Arc::new(SqliteStore::in_memory().await.unwrap());
        let model = Arc::new(ScriptedModel::new(vec![ScriptedReply::text("ok")]));
        let session = AgentSession::new(
            Agent::new(model),
            store.clone(),
            conversation,
            Namespace::new("bad-input").unwrap(),
            ContextPolicy::default(),
        );
        let result = session
            .run(RequestId::new(), "hello", RunContext::default())
            .await;
        let stored = store.admission(conversation).await.is_ok();
        assert!(
            matches!(result, Err(Error::InvalidInput(_))) && !stored,
            "a nil conversation id was accepted: {:?}, stored: {stored}",
            result.map(|o| o.request_id)
        );
    }
}

// ---------------------------------------------------------------------------
// Recovering and resuming: bad input, wrong revisions, nothing to take over

/// A fixture whose conversation is held: a request cancelled before its
/// first model call (admission held, run failed, nothing in flight).
async fn held() -> (Fixture, RequestId, RunId, Revision) {
    let f = Fixture::new().await;
    let request = RequestId::new();
    let ctx = RunContext::default();
    ctx.cancel.cancel();
    let stopped = f.session.run(request, "hello", ctx).await.unwrap_err();
    assert!(matches!(stopped, Error::Cancelled { .. }), "{stopped:?}");
    let (run, revision) = stopped.stopped_run().unwrap();
    (f, request, run, revision)
}

/// What a refused take-over must leave as it was.
async fn held_state(f: &Fixture, request: RequestId, run: RunId) -> String {
    format!(
        "{:?}\n{:?}\n{:?}\n{:?}",
        f.store.admission(f.conversation).await,
        f.store.request(request).await,
        f.store.run(run).await,
        f.store.checkpoints(run).await,
    )
}

#[tokio::test]
async fn bad_recover_input_is_refused_before_anything_is_written() {
    let (f, request, run, revision) = held().await;
    let before = held_state(&f, request, run).await;
    let huge = "x".repeat(10 * 1024 * 1024);
    let rows: [(&str, &str); 5] = [
        ("empty", ""),
        ("spaces", "   "),
        ("newlines and tabs", "\n\t\r\n"),
        ("10 MB", &huge),
        ("one byte over the limit", &huge[..MAX_INPUT_BYTES + 1]),
    ];
    for (name, input) in rows {
        let recovered = f
            .session
            .recover_after_owner_exit(
                request,
                input,
                RunContext::default(),
                revision,
                Default::default(),
            )
            .await;
        let message = invalid(recovered);
        assert!(message.contains("input"), "{name}: {message}");
        assert_eq!(held_state(&f, request, run).await, before, "{name}");
    }
    // The conversation's own id as the request id.
    let same = RequestId::from_uuid(f.conversation.as_uuid()).unwrap();
    let recovered = f
        .session
        .recover_after_owner_exit(
            same,
            "hello",
            RunContext::default(),
            revision,
            Default::default(),
        )
        .await;
    assert!(invalid(recovered).contains("conversation id"));
    assert_eq!(held_state(&f, request, run).await, before);
    assert_eq!(f.model.calls(), 0);
}

#[tokio::test]
async fn wrong_revisions_for_a_held_request_are_conflicts_and_change_nothing() {
    let (f, request, run, revision) = held().await;
    let state = f.session.admission().await.unwrap();
    let active = state.active.expect("the request holds the admission");
    assert_eq!(
        (state.revision, active.request_id, active.run_id),
        (revision, request, run)
    );
    assert_eq!(
        active.usage,
        f.session.recovery_usage(request).await.unwrap()
    );
    assert_eq!(active.checkpoint, None, "cancelled before its first turn");
    let before = held_state(&f, request, run).await;
    let rows: [(&str, Revision); 5] = [
        ("stale", Revision(revision.0 - 1)),
        ("ahead", Revision(revision.0 + 1)),
        ("zero", Revision(0)),
        ("-1 as u64", Revision(u64::MAX)),
        ("past i64::MAX", Revision(1 << 63)),
    ];
    let ctx = RunContext::default;
    for (name, wrong) in rows {
        for policy in [
            ResumePolicy::RejectAmbiguous,
            ResumePolicy::RetryInterruptedTurn,
        ] {
            let resumed = f.session.resume_run(run, ctx(), wrong, policy).await;
            assert_conflict(name, resumed, revision);
            let recovered = f
                .session
                .recover_after_owner_exit(request, "hello", ctx(), wrong, policy)
                .await;
            assert_conflict(name, recovered, revision);
        }
        assert_conflict(name, f.session.abandon(request, wrong).await, revision);
        assert_eq!(held_state(&f, request, run).await, before, "{name}");
    }
    assert_eq!(f.model.calls(), 0, "no model work");
    // Nothing was lost: the right revision resumes the request to its end.
    let outcome = f
        .session
        .resume_run(run, ctx(), revision, Default::default())
        .await
        .unwrap();
    assert_eq!(
        (outcome.request_id, outcome.final_text.as_str()),
        (request, "ok")
    );
}

#[track_caller]
fn assert_conflict<T: std::fmt::Debug>(name: &str, result: Result<T, Error>, actual: Revision) {
    match result {
        Err(Error::Conflict { actual: found, .. }) => assert_eq!(found, actual, "{name}"),
        other => panic!("{name}: expected Conflict, got {other:?}"),
    }
}

#[tokio::test]
async fn resume_and_recover_of_requests_that_hold_nothing() {
    let ctx = RunContext::default;

    // A completed (idle) request: recovering it, or resuming its run,
    // replays the stored answer; nothing is claimed or run again.
    let f = Fixture::new().await;
    let done = RequestId::new();
    let outcome = f.session.run(done, "hello", ctx()).await.unwrap();
    let revision = f.store.admission(f.conversation).await.unwrap().revision;
    let before = held_state(&f, done, outcome.run_id).await;
    let recovered = f
        .session
        .recover_after_owner_exit(done, "hello", ctx(), revision, Default::default())
        .await
        .unwrap();
    assert!(recovered.replayed, "recover of an idle request replays");
    assert_eq!(recovered.messages, outcome.messages);
    let resumed = f
        .session
        .resume_run(outcome.run_id, ctx(), Revision(0), Default::default())
        .await
        .unwrap();
    assert!(resumed.replayed, "resume of a committed run replays");
    // ...but not for another input.
    let mismatch = f
        .session
        .recover_after_owner_exit(done, "goodbye", ctx(), revision, Default::default())
        .await;
    assert!(
        matches!(mismatch, Err(Error::RequestMismatch { .. })),
        "{mismatch:?}"
    );
    assert_eq!(held_state(&f, done, outcome.run_id).await, before);
    assert_eq!(f.model.calls(), 1);

    // An abandoned request: burned for every entry point.
    let (f, request, run, revision) = held().await;
    let released = f.session.abandon(request, revision).await.unwrap();
    let before = held_state(&f, request, run).await;
    let recovered = f
        .session
        .recover_after_owner_exit(request, "hello", ctx(), released, Default::default())
        .await;
    assert!(
        matches!(recovered, Err(Error::RequestAbandoned { .. })),
        "{recovered:?}"
    );
    let resumed = f
        .session
        .resume_run(run, ctx(), released, Default::default())
        .await;
    assert!(
        matches!(resumed, Err(Error::RequestAbandoned { .. })),
        "{resumed:?}"
    );
    let rerun = f.session.run(request, "hello", ctx()).await;
    assert!(
        matches!(rerun, Err(Error::RequestAbandoned { .. })),
        "{rerun:?}"
    );
    let again = f.session.abandon(request, released).await;
    assert!(matches!(again, Err(Error::NotActive { .. })), "{again:?}");
    let usage = f.session.recovery_usage(request).await;
    assert!(matches!(usage, Err(Error::NotActive { .. })), "{usage:?}");
    assert_eq!(held_state(&f, request, run).await, before);
    assert_eq!(f.model.calls(), 0);

    // A superseded run: only the run that owns the admission continues.
    let (f, request, first, revision) = held().await;
    let cancelled = RunContext::default();
    cancelled.cancel.cancel();
    let stopped = f
        .session
        .recover_after_owner_exit(request, "hello", cancelled, revision, Default::default())
        .await
        .unwrap_err();
    let (owner, current) = stopped.stopped_run().unwrap();
    assert_ne!(owner, first);
    let before = held_state(&f, request, owner).await;
    let resumed = f
        .session
        .resume_run(first, ctx(), current, Default::default())
        .await;
    assert!(matches!(resumed, Err(Error::Busy { .. })), "{resumed:?}");
    assert_eq!(held_state(&f, request, owner).await, before);
    // The owner still finishes it.
    let outcome = f
        .session
        .resume_run(owner, ctx(), current, Default::default())
        .await
        .unwrap();
    assert_eq!(outcome.request_id, request);
    let committed = f.store.run(outcome.run_id).await.unwrap().unwrap();
    assert_eq!(committed.resumed_from, Some(owner));
}

// ---------------------------------------------------------------------------
// Damaged rows met through the session API

/// A file database with, in one conversation, a committed request (a tool
/// round, then its answer: transcript rows 0–3) and a request whose process
/// died in its tool round (its first call journaled as completed, the
/// second as requested; checkpoint `tools_in_flight`; run `running`), plus
/// a plain connection to damage rows with.
struct Damaged {
    store: Arc<SqliteStore>,
    raw: sqlx::SqliteConnection,
    conversation: ConversationId,
    done: RequestId,
    done_outcome: turnstile::Outcome,
    held: RequestId,
    held_run: RunId,
    held_revision: Revision,
    first: AgentSession,
    second: AgentSession,
    echo: Arc<Echo>,
    stall: Arc<Stall>,
    models: [Arc<ScriptedModel>; 2],
    _dir: tempfile::TempDir,
}

const FIRST: &str = "first question";
const SECOND: &str = "second question";

impl Damaged {
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("damaged.db");
        let store = Arc::new(SqliteStore::open(&path).await.unwrap());
        let conversation = ConversationId::new();
        let echo = Echo::new();
        let stall = Stall::new();
        // Same model name and tools: one agent fingerprint for both.
        let session = |replies| {
            let model = Arc::new(ScriptedModel::named("damaged", replies));
            let agent = Agent::new(model.clone())
                .with_tool(echo.clone())
                .with_tool(stall.clone());
            let session = AgentSession::new(
                agent,
                store.clone(),
                conversation,
                Namespace::new("bad-input").unwrap(),
                ContextPolicy::default(),
            );
            (session, model)
        };
        let (first, first_model) = session(vec![
            ScriptedReply::tool_calls(vec![ToolCall::new("c1", "echo", json!({"text": "one"}))]),
            ScriptedReply::text("first answer"),
        ]);
        let (second, second_model) = session(vec![
            ScriptedReply::tool_calls(vec![
                ToolCall::new("c1", "echo", json!({"text": "two"})),
                ToolCall::new("c2", "stall", json!({"text": "three"})),
            ]),
            ScriptedReply::text("second answer"),
        ]);
        let done = RequestId::new();
        let done_outcome = first.run(done, FIRST, RunContext::default()).await.unwrap();
        let held = RequestId::new();
        tokio::select! {
            finished = second.run(held, SECOND, RunContext::default()) => {
                panic!("the second request should stall: {finished:?}")
            }
            () = stall.started() => {}
        }
        let admission = store.admission(conversation).await.unwrap();
        let held_run = admission.active.unwrap().run_id;
        Self {
            store,
            raw: raw_connection(&path).await,
            conversation,
            done,
            done_outcome,
            held,
            held_run,
            held_revision: admission.revision,
            first,
            second,
            echo,
            stall,
            models: [first_model, second_model],
            _dir: dir,
        }
    }

    fn calls(&self) -> (u64, u64, usize, usize) {
        (
            self.models[0].calls(),
            self.models[1].calls(),
            self.echo.calls(),
            self.stall.calls(),
        )
    }

    /// Runs one entry point of the session API. A take-over names the
    /// admission's current owner and revision (an earlier take-over may
    /// have moved it), or the original ones when the admission is what is
    /// damaged.
    async fn enter(&self, entry: Entry) -> Result<turnstile::Outcome, Error> {
        let retry = ResumePolicy::RetryInterruptedTurn;
        let ctx = RunContext::default();
        let (run, revision) = match self.store.admission(self.conversation).await {
            Ok(admission) => match admission.active {
                Some(active) => (active.run_id, admission.revision),
                None => panic!("the held request lost its admission"),
            },
            Err(_) => (self.held_run, self.held_revision),
        };
        match entry {
            Entry::Replay => self.first.run(self.done, FIRST, ctx).await,
            Entry::Resume => self.second.resume_run(run, ctx, revision, retry).await,
            Entry::Recover => {
                self.second
                    .recover_after_owner_exit(self.held, SECOND, ctx, revision, retry)
                    .await
            }
        }
    }

    /// After a repair: the committed request replays as it was, and the
    /// held request finishes from where its process died, its journaled
    /// tool result reused. Nothing was lost.
    async fn assert_intact(&self, case: &str) {
        let replay = self
            .first
            .run(self.done, FIRST, RunContext::default())
            .await;
        let replay = replay.unwrap_or_else(|e| panic!("{case}: replay after repair: {e:?}"));
        assert!(replay.replayed, "{case}");
        assert_eq!(replay.messages, self.done_outcome.messages, "{case}");
        let admission = self.store.admission(self.conversation).await.unwrap();
        let owner = admission.active.expect("still held").run_id;
        let outcome = self
            .second
            .resume_run(
                owner,
                RunContext::default(),
                admission.revision,
                ResumePolicy::RetryInterruptedTurn,
            )
            .await
            .unwrap_or_else(|e| panic!("{case}: resume after repair: {e:?}"));
        assert_eq!(outcome.request_id, self.held, "{case}");
        assert_eq!(outcome.final_text, "second answer", "{case}");
        let results: Vec<_> = outcome.messages[2..4].iter().map(|m| m.text()).collect();
        assert_eq!(results, ["two", "three"], "{case}");
        // Echo ran once per request: the held request's call was reused.
        assert_eq!(self.echo.calls(), 2, "{case}");
        let transcript = self
            .store
            .transcript_window(self.conversation, 100)
            .await
            .unwrap();
        assert_eq!(transcript.len(), 4 + 5, "{case}");
    }
}

/// A connection that may also write values the schema's CHECKs refuse.
async fn raw_connection(path: &std::path::Path) -> sqlx::SqliteConnection {
    use sqlx::ConnectOptions;
    sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .pragma("ignore_check_constraints", "ON")
        .connect()
        .await
        .unwrap()
}

#[derive(Clone, Copy, Debug)]
enum Entry {
    /// `run` of the committed request (its replay).
    Replay,
    /// `resume_run` of the held request's run (retrying the turn).
    Resume,
    /// `recover_after_owner_exit` of the held request.
    Recover,
}

#[derive(Clone, Copy, Debug)]
enum Expect {
    Corrupt(&'static str),
    ConfigurationMismatch,
    NamespaceMismatch,
}

impl Expect {
    fn matches(self, error: &Error) -> bool {
        match (self, error) {
            (Expect::Corrupt(table), Error::Corrupt { table: found, .. }) => table == *found,
            (Expect::ConfigurationMismatch, Error::ConfigurationMismatch { .. }) => true,
            (Expect::NamespaceMismatch, Error::NamespaceMismatch { .. }) => true,
            _ => false,
        }
    }
}

/// One damaged value: `table.column` of the rows `key` selects set to the
/// SQL literal `bad`; the entry points that meet it and what they answer.
struct Damage {
    name: &'static str,
    table: &'static str,
    column: &'static str,
    key: &'static str,
    bad: &'static str,
    entries: &'static [Entry],
    expect: Expect,
}

/// The JSON columns (`meta` of both message tables), every enum column
/// (message roles, checkpoint phases, request, run and journal statuses),
/// and the ids, hashes and counters the session reads before any work.
const DAMAGES: &[Damage] = &[
    Damage {
        name: "transcript meta is not JSON",
        table: "transcript",
        column: "meta",
        key: "seq = 1",
        bad: "'{not json'",
        entries: &[Entry::Replay, Entry::Resume],
        expect: Expect::Corrupt("transcript"),
    },
    Damage {
        name: "transcript meta is JSON but not an object",
        table: "transcript",
        column: "meta",
        key: "seq = 1",
        bad: "'[]'",
        entries: &[Entry::Replay],
        expect: Expect::Corrupt("transcript"),
    },
    Damage {
        name: "transcript meta has a field of the wrong type",
        table: "transcript",
        column: "meta",
        key: "seq = 1",
        bad: r#"'{"tool_calls":"many"}'"#,
        entries: &[Entry::Replay, Entry::Recover],
        expect: Expect::Corrupt("transcript"),
    },
    Damage {
        name: "transcript tool result meta is missing",
        table: "transcript",
        column: "meta",
        key: "seq = 2",
        bad: "NULL",
        entries: &[Entry::Replay],
        expect: Expect::Corrupt("transcript"),
    },
    Damage {
        name: "transcript role is unknown",
        table: "transcript",
        column: "role",
        key: "seq = 0",
        bad: "'wizard'",
        entries: &[Entry::Replay, Entry::Resume],
        expect: Expect::Corrupt("transcript"),
    },
    Damage {
        name: "transcript role in the wrong case",
        table: "transcript",
        column: "role",
        key: "seq = 3",
        bad: "'Assistant'",
        entries: &[Entry::Replay],
        expect: Expect::Corrupt("transcript"),
    },
    Damage {
        name: "pending message meta is not JSON",
        table: "transcript",
        column: "meta",
        key: HELD_MESSAGE_1,
        bad: "'{not json'",
        entries: &[Entry::Resume, Entry::Recover],
        expect: Expect::Corrupt("transcript"),
    },
    Damage {
        name: "pending message meta is cut short",
        table: "transcript",
        column: "meta",
        key: HELD_MESSAGE_1,
        bad: r#"'{"tool_calls":[{"id":"c1"'"#,
        entries: &[Entry::Resume],
        expect: Expect::Corrupt("transcript"),
    },
    Damage {
        name: "pending message role is unknown",
        table: "transcript",
        column: "role",
        key: HELD_MESSAGE_0,
        bad: "'wizard'",
        entries: &[Entry::Recover],
        expect: Expect::Corrupt("transcript"),
    },
    Damage {
        name: "checkpoint phase is unknown",
        // The run's latest checkpoint: its folded run's, in the request's row.
        table: "requests",
        column: "checkpoint_phase",
        key: "phase = 'tools_in_flight'",
        bad: "'sideways'",
        entries: &[Entry::Resume, Entry::Recover],
        expect: Expect::Corrupt("loop_checkpoints"),
    },
    Damage {
        name: "checkpoint phase code is out of range",
        // The run's latest checkpoint: its folded run's, in the request's
        // row, where its phase is a code.
        table: "requests",
        column: "checkpoint_phase",
        key: "phase = 'tools_in_flight'",
        bad: "6",
        entries: &[Entry::Resume],
        expect: Expect::Corrupt("loop_checkpoints"),
    },
    Damage {
        name: "committed checkpoint phase is unknown",
        // The run's latest checkpoint: its folded run's, in the request's row.
        table: "requests",
        column: "checkpoint_phase",
        key: "phase = 'completed'",
        bad: "'done-ish'",
        entries: &[Entry::Replay],
        expect: Expect::Corrupt("requests"),
    },
    Damage {
        name: "completed request status is unknown",
        table: "requests",
        column: "state",
        key: "status = 'completed'",
        bad: "'zombie'",
        entries: &[Entry::Replay],
        expect: Expect::Corrupt("requests"),
    },
    Damage {
        name: "active request status is unknown",
        table: "requests",
        column: "state",
        key: "status = 'active'",
        bad: "'Active'",
        entries: &[Entry::Resume, Entry::Recover],
        expect: Expect::Corrupt("requests"),
    },
    Damage {
        name: "request input hash is not a sha-256",
        table: "requests",
        column: "input_sha256",
        key: "status = 'completed'",
        bad: "x'00'",
        entries: &[Entry::Replay],
        expect: Expect::Corrupt("requests"),
    },
    Damage {
        name: "run status is unknown",
        // The folded first run, in the request's row.
        table: "requests",
        column: "run_state",
        key: "run_status = 'running'",
        bad: "'sleepwalking'",
        entries: &[Entry::Resume],
        expect: Expect::Corrupt("runs"),
    },
    Damage {
        name: "journal status is unknown",
        table: "tool_calls",
        column: "status",
        key: "status = 'requested'",
        bad: "'exploded'",
        entries: &[Entry::Resume, Entry::Recover],
        expect: Expect::Corrupt("tool_calls"),
    },
    Damage {
        name: "journal status in the wrong case",
        table: "tool_calls",
        column: "status",
        key: HELD_REQUEST_C1,
        bad: "'Completed'",
        entries: &[Entry::Resume],
        expect: Expect::Corrupt("tool_calls"),
    },
    Damage {
        name: "admission agent fingerprint is another agent's",
        table: "admissions",
        column: "agent_fingerprint",
        key: "active_request_id IS NOT NULL",
        bad: "'0000'",
        entries: &[Entry::Resume, Entry::Recover],
        expect: Expect::ConfigurationMismatch,
    },
    Damage {
        name: "admission run id is not a uuid",
        table: "admissions",
        column: "run_id",
        key: "active_request_id IS NOT NULL",
        bad: "x'0102'",
        entries: &[Entry::Resume, Entry::Recover],
        expect: Expect::Corrupt("admissions"),
    },
    Damage {
        name: "admission revision is negative",
        table: "admissions",
        column: "revision",
        key: "active_request_id IS NOT NULL",
        bad: "-1",
        entries: &[Entry::Resume],
        expect: Expect::Corrupt("admissions"),
    },
    Damage {
        name: "conversation version is negative",
        table: "conversations",
        column: "version",
        key: "version = 1",
        bad: "-1",
        entries: &[Entry::Replay, Entry::Resume],
        expect: Expect::Corrupt("conversations"),
    },
    Damage {
        name: "conversation namespace is not a namespace",
        table: "conversations",
        column: "namespace",
        key: "namespace = 'bad-input'",
        bad: "'bad input/../'",
        entries: &[Entry::Replay, Entry::Recover],
        expect: Expect::NamespaceMismatch,
    },
];

/// The held request's messages follow its conversation's committed entries.
const HELD_MESSAGE_0: &str = "request_id = (SELECT active_request_id FROM admissions)
     AND seq = (SELECT transcript_length FROM conversations)";
const HELD_MESSAGE_1: &str = "request_id = (SELECT active_request_id FROM admissions)
     AND seq = (SELECT transcript_length FROM conversations) + 1";

const HELD_REQUEST_C1: &str =
    "request_id = (SELECT active_request_id FROM admissions) AND call_id = 'c1'";

#[tokio::test]
async fn damaged_rows_met_through_the_session_are_typed_errors_and_lose_nothing() {
    for damage in DAMAGES {
        let mut f = Damaged::new().await;
        let case = damage.name;
        let (table, column) = (damage.table, damage.column);
        // What the rows held, as an SQL literal: the repair puts it back.
        let select = format!(
            "SELECT DISTINCT quote({column}) FROM {table} WHERE {}",
            damage.key
        );
        let originals: Vec<String> = sqlx::query_scalar(&select)
            .fetch_all(&mut f.raw)
            .await
            .unwrap();
        assert_eq!(originals.len(), 1, "{case}: {originals:?}");
        let update = format!(
            "UPDATE {table} SET {column} = {} WHERE {}",
            damage.bad, damage.key
        );
        let changed = sqlx::query(&update).execute(&mut f.raw).await.unwrap();
        assert!(changed.rows_affected() > 0, "{case}: nothing damaged");

        let before = f.calls();
        for &entry in damage.entries {
            match f.enter(entry).await {
                Err(error) if damage.expect.matches(&error) => {}
                other => panic!(
                    "{case}: {entry:?}: expected {:?}, got {other:?}",
                    damage.expect
                ),
            }
        }
        assert_eq!(f.calls(), before, "{case}: no model or tool work");

        // Repair every row holding the bad value (a take-over may have
        // copied it into its new run's checkpoint), then check everything.
        let repair = format!(
            "UPDATE {table} SET {column} = {} WHERE {column} IS {}",
            originals[0], damage.bad
        );
        sqlx::query(&repair).execute(&mut f.raw).await.unwrap();
        f.assert_intact(case).await;
    }
}

#[tokio::test]
async fn journal_arguments_that_are_not_json_are_opaque_text() {
    // `tool_calls.arguments` is the model's text as it produced it (which
    // need not be JSON); a resume reuses the journaled result and never
    // parses it.
    let mut f = Damaged::new().await;
    let update = format!("UPDATE tool_calls SET arguments = '{{not json' WHERE {HELD_REQUEST_C1}");
    let changed = sqlx::query(&update).execute(&mut f.raw).await.unwrap();
    assert_eq!(changed.rows_affected(), 1);
    let journal = f.store.journal(f.held, 1).await.unwrap();
    assert_eq!(journal[0].arguments.as_deref(), Some("{not json"));
    f.assert_intact("journal arguments").await;
}

#[tokio::test]
async fn a_new_request_over_a_damaged_transcript_is_refused_before_its_claim() {
    // The transcript is read to build the model's context before the
    // request claims the admission (at the revision the claim expects, so
    // no commit can come between): a damaged row refuses the request and
    // writes nothing; once the row is repaired the same request runs.
    let mut f = Damaged::new().await;
    f.assert_intact("setup").await;
    let original: String = sqlx::query_scalar("SELECT meta FROM transcript WHERE seq = 1")
        .fetch_one(&mut f.raw)
        .await
        .unwrap();
    let update = "UPDATE transcript SET meta = '{not json' WHERE seq = 1";
    sqlx::query(update).execute(&mut f.raw).await.unwrap();
    let calls = f.calls();
    let request = RequestId::new();
    let before = f.store.admission(f.conversation).await.unwrap();
    let refused = f
        .first
        .run(request, "third question", RunContext::default())
        .await;
    assert!(
        matches!(
            refused,
            Err(Error::Corrupt {
                table: "transcript",
                ..
            })
        ),
        "{refused:?}"
    );
    assert_eq!(f.calls(), calls, "no model work");
    assert_eq!(f.store.admission(f.conversation).await.unwrap(), before);
    assert!(f.store.request(request).await.unwrap().is_none());

    sqlx::query("UPDATE transcript SET meta = ?1 WHERE seq = 1")
        .bind(original)
        .execute(&mut f.raw)
        .await
        .unwrap();
    let outcome = f
        .first
        .run(request, "third question", RunContext::default())
        .await
        .unwrap();
    assert_eq!(outcome.final_text, "first answer");
    let transcript = f
        .store
        .transcript_window(f.conversation, 100)
        .await
        .unwrap();
    assert_eq!(transcript.len(), 9 + 4);
    let replay = f
        .first
        .run(f.done, FIRST, RunContext::default())
        .await
        .unwrap();
    assert_eq!(replay.messages, f.done_outcome.messages);
}

// ---------------------------------------------------------------------------
// Database files: newer schema, read-only

fn file_hash(path: &std::path::Path) -> Option<Vec<u8>> {
    std::fs::read(path).ok()
}

#[tokio::test]
async fn a_database_from_a_newer_schema_is_refused_and_loses_nothing() {
    // Byte-identical refusal of closed WAL and rollback-journal files is
    // proven in tests/sqlite_durability/schema.rs; here the file is in use
    // by an older store, and the data is read back afterwards.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("future.db");
    let wal = dir.path().join("future.db-wal");
    let store = Arc::new(SqliteStore::open(&path).await.unwrap());
    let model = Arc::new(ScriptedModel::new(vec![ScriptedReply::text("ok")]));
    let conversation = ConversationId::new();
    let session = AgentSession::new(
        Agent::new(model.clone()),
        store.clone(),
        conversation,
        Namespace::new("future").unwrap(),
        ContextPolicy::default(),
    );
    let request = RequestId::new();
    let outcome = session
        .run(request, "hello", RunContext::default())
        .await
        .unwrap();

    let mut raw = raw_connection(&path).await;
    let future = SqliteStore::supported_schema_version() + 1;
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES (?1, 'from the future', TRUE, x'00', 1)",
    )
    .bind(future)
    .execute(&mut raw)
    .await
    .unwrap();
    let before = (file_hash(&path), file_hash(&wal));
    match SqliteStore::open(&path).await {
        Err(Error::SchemaTooNew { found, supported }) => {
            assert_eq!((found, supported), (future, future - 1));
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    assert_eq!((file_hash(&path), file_hash(&wal)), before, "modified");

    // Back at today's schema, everything is there.
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = ?1")
        .bind(future)
        .execute(&mut raw)
        .await
        .unwrap();
    let reopened = Arc::new(SqliteStore::open(&path).await.unwrap());
    let session = AgentSession::new(
        Agent::new(model.clone()),
        reopened,
        conversation,
        Namespace::new("future").unwrap(),
        ContextPolicy::default(),
    );
    let replay = session
        .run(request, "hello", RunContext::default())
        .await
        .unwrap();
    assert!(replay.replayed);
    assert_eq!(replay.messages, outcome.messages);
    assert_eq!(model.calls(), 1);
}

/// Whether this process may write a file its mode says it may not (root,
/// or CAP_DAC_OVERRIDE): then file modes cannot make a database read-only
/// for it.
#[cfg(unix)]
fn mode_bits_bind_us(dir: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let probe = dir.join("mode-probe");
    std::fs::write(&probe, b"x").unwrap();
    std::fs::set_permissions(&probe, std::fs::Permissions::from_mode(0o400)).unwrap();
    let writable = std::fs::OpenOptions::new()
        .append(true)
        .open(&probe)
        .is_ok();
    std::fs::remove_file(&probe).unwrap();
    !writable
}

#[cfg(unix)]
#[tokio::test]
async fn a_read_only_database_is_read_but_never_written() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;

    let outer = tempfile::tempdir().unwrap();
    let dir = outer.path().join("data");
    std::fs::create_dir(&dir).unwrap();
    let path = dir.join("ro.db");
    let conversation = ConversationId::new();
    let request = RequestId::new();
    {
        let store = Arc::new(SqliteStore::open(&path).await.unwrap());
        let model = Arc::new(ScriptedModel::new(vec![ScriptedReply::text("kept")]));
        let session = AgentSession::new(
            Agent::new(model),
            store.clone(),
            conversation,
            Namespace::new("default").unwrap(),
            ContextPolicy::default(),
        );
        session
            .run(request, "hello", RunContext::default())
            .await
            .unwrap();
        store.close().await.unwrap();
    }
    // Closing folds the WAL into the file and closes every connection, so
    // SQLite removes it: then the file alone holds the data. (Should two
    // connections close at the same instant, each seeing the other still
    // open, a connection opened and closed after them is the last one.)
    let wal = dir.join("ro.db-wal");
    for attempt in 0..3000 {
        if !wal.exists() {
            break;
        }
        if attempt % 100 == 99 {
            sqlx::Connection::close(raw_connection(&path).await)
                .await
                .unwrap();
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(!wal.exists(), "the store closed its connections");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
    let before = file_hash(&path);

    if mode_bits_bind_us(outer.path()) {
        // An ordinary user: the library itself meets the read-only file.
        // Opening an up-to-date database writes nothing, so it opens and
        // reads; the first write is the error.
        let store = Arc::new(SqliteStore::open(&path).await.unwrap());
        let namespace = Namespace::new("default").unwrap();
        let found = store.conversation(&namespace, conversation).await.unwrap();
        assert_eq!(found.version, 1);
        let session = AgentSession::new(
            Agent::new(Arc::new(ScriptedModel::new(vec![ScriptedReply::text(
                "never",
            )]))),
            store,
            conversation,
            namespace,
            ContextPolicy::default(),
        );
        match session
            .run(RequestId::new(), "again", RunContext::default())
            .await
        {
            Err(Error::Store(e)) => assert!(!e.is_busy(), "{e}"),
            other => panic!("expected a store error, got {other:?}"),
        }
    } else {
        // Root writes through file modes: turnstile opens and writes a 0400
        // file like any other. The honest test is as an unprivileged user,
        // through the command line, on a file that user owns with mode
        // 0400 in a directory it may write (so SQLite may add its -wal and
        // -shm files, but not change the database).
        const NOBODY: u32 = 65534;
        let script = dir.join("script.json");
        std::fs::write(&script, r#"[{"text": "never"}]"#).unwrap();
        for file in [&dir, &path, &script] {
            std::os::unix::fs::chown(file, Some(NOBODY), Some(NOBODY)).unwrap();
        }
        std::fs::set_permissions(outer.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let binary = cli_support::binary_for_others(outer.path());
        let as_nobody = |args: &[&str]| {
            let output = std::process::Command::new(&binary)
                .args(args)
                .env_remove("RUST_LOG")
                .env("NO_COLOR", "1")
                .current_dir(&dir)
                .uid(NOBODY)
                .gid(NOBODY)
                .stdin(std::process::Stdio::null())
                .output()
                .expect("run turnstile as nobody");
            cli_support::Run {
                code: output.status.code().unwrap_or(-1),
                stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            }
        };
        let db = path.to_str().unwrap();
        let (c, r) = (conversation.to_string(), RequestId::new().to_string());
        let model = cli_support::scripted(&script);
        let run = as_nobody(&[
            "run",
            "--db",
            db,
            "--conversation",
            &c,
            "--request",
            &r,
            "--model",
            &model,
            "again",
        ]);
        run.assert_error(1, "readonly database");
        // Reading works: opening an up-to-date database writes nothing.
        let listed = as_nobody(&["ls", "conversations", "--db", db]);
        listed.assert_success();
        assert!(listed.stdout.contains(&c), "{}", listed.stdout);
        // The file is unchanged; whatever SQLite added beside it has the
        // user's mode.
        for extra in ["ro.db-wal", "ro.db-shm"] {
            if let Ok(meta) = std::fs::metadata(dir.join(extra)) {
                assert_eq!(meta.permissions().mode() & 0o777, 0o400, "{extra}");
            }
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        for extra in ["ro.db-wal", "ro.db-shm"] {
            let _ = std::fs::remove_file(dir.join(extra));
        }
    }
    assert_eq!(file_hash(&path), before, "the read-only file was modified");

    // Nothing was lost: writable again, the committed request replays.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let store = Arc::new(SqliteStore::open(&path).await.unwrap());
    let model = Arc::new(ScriptedModel::new(vec![ScriptedReply::text("never")]));
    let session = AgentSession::new(
        Agent::new(model.clone()),
        store,
        conversation,
        Namespace::new("default").unwrap(),
        ContextPolicy::default(),
    );
    let replay = session
        .run(request, "hello", RunContext::default())
        .await
        .unwrap();
    assert!(replay.replayed);
    assert_eq!(replay.final_text, "kept");
    assert_eq!(model.calls(), 0);
}
