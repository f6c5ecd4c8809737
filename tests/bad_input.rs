//! Bad input through the public API: each case is a typed error, writes
//! nothing and never panics. One table-driven test per kind of input, each
//! row named.

use std::sync::Arc;

use turnstile::session::MAX_INPUT_BYTES;
use turnstile::{
    Agent, AgentSession, ContextPolicy, ConversationId, Error, Namespace, RequestId, Revision,
    RunContext, RunId, ScriptedModel, ScriptedReply, SqliteStore, Store,
};

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
    assert_eq!(outcome.messages[0].content(), input);
}

#[tokio::test]
async fn unknown_ids_and_wrong_revisions_are_typed_errors() {
    let f = Fixture::new().await;
    let ctx = RunContext::default;
    let done = RequestId::new();
    f.session.run(done, "hello", ctx()).await.unwrap();
    let revision = f.store.admission(f.conversation).await.unwrap().revision;
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
