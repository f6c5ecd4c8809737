//! A database written by the previous schema (version 4, migrations
//! 0001–0004, before the one-statement steps of 0005) opens with this
//! build, is migrated in place, and keeps every row: its committed requests
//! replay, its held request resumes and commits, its abandoned request stays
//! burned, and new requests commit after the old ones.
//!
//! The file is `tests/fixtures/schema4.db`, written by turnstile at commit
//! `47299f3` (see `tests/fixtures/README.md` for what it holds and how it
//! was made); each test works on a copy.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use turnstile::{
    Agent, AgentSession, ContextPolicy, ConversationId, Error, Message, Namespace, RequestId,
    ResumePolicy, RunContext, ScriptedModel, ScriptedReply, SqliteStore, Store, ToolCall,
    VerificationReport,
};

use turnstile_conformance::support::TestResult;
use turnstile_testkit::tools::Echo;

/// The fixture's schema version.
const FIXTURE_SCHEMA: i64 = 4;

/// Every row of every table (but the migrations'), as text, table by table.
type Snapshot = Vec<(String, Vec<String>)>;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schema4.db")
}

/// A copy of the fixture in `dir`.
pub(super) fn copy_of_fixture(dir: &Path) -> std::io::Result<PathBuf> {
    let path = dir.join("schema4.db");
    std::fs::copy(fixture(), &path)?;
    Ok(path)
}

/// The fixture's ids: `00000000-0000-4000-8000-0000000000NN`.
fn id(n: u128) -> uuid::Uuid {
    uuid::Uuid::from_u128(0x0000_0000_0000_4000_8000_0000_0000_0000 | n)
}

fn conversation(n: u128) -> ConversationId {
    ConversationId::from_uuid(id(n)).expect("a conversation id")
}

fn request(n: u128) -> RequestId {
    RequestId::from_uuid(id(n)).expect("a request id")
}

/// Every table and its columns, as the schema has them now.
async fn shape(path: &Path) -> Result<Vec<(String, Vec<String>)>, sqlx::Error> {
    let pool = super::raw_pool(path).await?;
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'table'
           AND name NOT LIKE 'sqlite_%' AND name != '_sqlx_migrations' ORDER BY name",
    )
    .fetch_all(&pool)
    .await?;
    let mut shape = Vec::new();
    for table in tables {
        // Names come from the schema, not from input.
        let columns: Vec<String> =
            sqlx::query_scalar(&format!("SELECT name FROM pragma_table_xinfo('{table}')"))
                .fetch_all(&pool)
                .await?;
        shape.push((table, columns));
    }
    pool.close().await;
    Ok(shape)
}

/// Every row of the tables and columns of `shape`, as SQL literals.
async fn snapshot(path: &Path, shape: &[(String, Vec<String>)]) -> Result<Snapshot, sqlx::Error> {
    let pool = super::raw_pool(path).await?;
    let mut snapshot = Vec::new();
    let now = self::shape(path).await?;
    for (table, columns) in shape {
        let present = now.iter().find(|(t, _)| t == table).map(|(_, c)| c);
        let row = columns
            .iter()
            .filter(|c| !dropped(table, c))
            .map(|c| match present.is_some_and(|p| p.contains(c)) {
                true => format!("quote(\"{c}\")"),
                false => format!("quote({})", moved(table, c)),
            })
            .collect::<Vec<_>>()
            .join(" || ',' || ");
        let rows: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT {row} FROM {} ORDER BY 1",
            rows_of(table, &now)
        ))
        .fetch_all(&pool)
        .await?;
        snapshot.push((table.clone(), rows));
    }
    pool.close().await;
    Ok(snapshot)
}

/// Where the rows of an older schema's table are read from now. Since
/// migration 0019 a held request's messages are not in `run_messages` but
/// in the transcript, after its conversation's committed entries.
fn rows_of(table: &str, now: &[(String, Vec<String>)]) -> String {
    let split = now.iter().any(|(t, columns)| {
        t == "conversations" && columns.iter().any(|c| c == "transcript_length")
    });
    match (table, split) {
        ("transcript", true) => "(SELECT * FROM transcript
              WHERE seq < (SELECT c.transcript_length FROM conversations c
                           WHERE c.key = transcript.conversation_key)) AS transcript"
            .into(),
        ("run_messages", true) => "(SELECT request_id, seq, role, content, meta FROM run_messages
              UNION ALL
              SELECT t.request_id, t.seq - c.transcript_length, t.role, t.content, t.meta
              FROM transcript t JOIN conversations c ON c.key = t.conversation_key
              WHERE t.seq >= c.transcript_length) AS run_messages"
            .into(),
        _ => format!("\"{table}\""),
    }
}

/// Columns a migration dropped: which run and turn wrote a pending message
/// was never read, and went in 0019.
fn dropped(table: &str, column: &str) -> bool {
    matches!((table, column), ("run_messages", "run_id" | "turn"))
}

/// Where a column of an older schema that a migration replaced is read
/// from now: the transcript names its conversation by key (migration 0017).
fn moved(table: &str, column: &str) -> String {
    match (table, column) {
        ("transcript", "conversation_id") => {
            "(SELECT c.id FROM conversations c WHERE c.key = transcript.conversation_key)".into()
        }
        _ => panic!("{table}.{column} is gone and no migration says where it went"),
    }
}

/// The versions of `migrations/` (numbers may have gaps), ascending.
fn this_builds_migrations() -> Vec<i64> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations");
    let mut versions: Vec<i64> = std::fs::read_dir(dir)
        .expect("the migrations")
        .map(|entry| {
            let name = entry.expect("a migration").file_name();
            let name = name.to_string_lossy();
            name.split('_').next().unwrap().parse().expect("a version")
        })
        .collect();
    versions.sort();
    versions
}

pub(super) async fn applied_migrations(path: &Path) -> Result<Vec<i64>, sqlx::Error> {
    let pool = super::raw_pool(path).await?;
    let versions =
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success ORDER BY version")
            .fetch_all(&pool)
            .await?;
    pool.close().await;
    Ok(versions)
}

// The fixture's agent, as it was defined when the fixture was written: a
// resumed run must present the same fingerprint (model name, system
// prompt, tools: the test kit's `Echo` has the fixture's spec).

struct Checked;

#[turnstile::async_trait]
impl turnstile::Verifier for Checked {
    async fn verify(
        &self,
        turn: u32,
        calls: &[(ToolCall, turnstile::ToolResult)],
    ) -> Option<VerificationReport> {
        Some(VerificationReport {
            turn,
            passed: true,
            detail: format!("{} call(s) checked", calls.len()),
        })
    }
}

fn session(store: &Arc<SqliteStore>, n: u128, replies: Vec<ScriptedReply>) -> AgentSession {
    let agent = Agent::new(Arc::new(ScriptedModel::named("compat-model", replies)))
        .with_system_prompt("You are the schema 4 fixture.")
        .with_tool(Echo::new())
        .with_verifier(Arc::new(Checked));
    let policy = ContextPolicy::new(2)
        .expect("a window")
        .with_summary_batch(4)
        .expect("a batch");
    AgentSession::new(
        agent,
        store.clone(),
        conversation(n),
        Namespace::new("compat").expect("a namespace"),
        policy,
    )
}

fn report(detail: &str) -> VerificationReport {
    VerificationReport {
        turn: 1,
        passed: true,
        detail: detail.into(),
    }
}

fn tool_round(call: &str, text: &str) -> [Message; 2] {
    [
        Message::assistant_with_calls(
            "",
            vec![ToolCall::new(
                call,
                "echo",
                serde_json::json!({ "text": text }),
            )],
        ),
        Message::tool(call, text, false),
    ]
}

#[tokio::test]
async fn the_fixture_is_a_schema_4_database() -> TestResult {
    assert_eq!(applied_migrations(&fixture()).await?, [1, 2, 3, 4]);
    assert!(SqliteStore::supported_schema_version() > FIXTURE_SCHEMA);
    Ok(())
}

/// Opening migrates the file in place and changes no row; every request
/// then reads, replays and goes on as the old code left it.
#[tokio::test]
async fn a_schema_4_database_is_migrated_in_place_and_every_row_survives_and_replays() -> TestResult
{
    let dir = tempfile::tempdir()?;
    let path = copy_of_fixture(dir.path())?;
    let old_shape = shape(&path).await?;
    let before = snapshot(&path, &old_shape).await?;
    let count = |table: &str| {
        before
            .iter()
            .find(|(name, _)| name == table)
            .map_or(0, |(_, rows)| rows.len())
    };
    // What the fixture holds, so a regenerated one cannot quietly hold less.
    assert_eq!(count("requests"), 6);
    assert_eq!(count("transcript"), 10);
    assert_eq!(count("summaries"), 1);
    assert_eq!(count("run_messages"), 6);
    assert_eq!(count("verification_reports"), 3);

    let store = Arc::new(SqliteStore::open(&path).await?);
    assert_eq!(
        applied_migrations(&path).await?,
        this_builds_migrations(),
        "migrated in place"
    );
    // Every old column of every old row as it was; what later migrations
    // added is empty or NULL.
    assert_eq!(
        snapshot(&path, &old_shape).await?,
        before,
        "the migration changed rows"
    );
    for (table, columns) in shape(&path).await? {
        // The version of the installed steps: the store's bookkeeping, no
        // row of the data.
        if table == "step_set" {
            continue;
        }
        let old = old_shape.iter().find(|(t, _)| *t == table);
        let added: Vec<&String> = columns
            .iter()
            .filter(|c| old.is_none_or(|(_, o)| !o.contains(c)))
            .collect();
        for column in added {
            // Keys the migration gave: the transcript's are checked through
            // `moved` above; every conversation has one (distinct, by the
            // unique index). The transcript's length too: the rows before
            // and after it compared above as the transcript and the
            // pending messages.
            if matches!(
                (table.as_str(), column.as_str()),
                ("conversations", "key" | "transcript_length") | ("transcript", "conversation_key")
            ) {
                let keys = snapshot(&path, &[(table.clone(), vec![column.clone()])]).await?;
                assert!(keys[0].1.iter().all(|k| k != "NULL"), "{keys:?}");
                continue;
            }
            // An old column stored another way (migration 0021): compared
            // above through the generated column of its old name.
            if matches!(
                (table.as_str(), column.as_str()),
                ("requests", "state" | "committed_by")
            ) {
                continue;
            }
            let set = snapshot(&path, &[(table.clone(), vec![column.clone()])]).await?;
            // Or the constant default of a NOT NULL column (migration
            // 0007: an empty metadata object at version 0).
            let default = match (table.as_str(), column.as_str()) {
                ("conversations", "metadata") => "'{}'",
                ("conversations", "meta_version") => "0",
                // no events before the log (migration 0022)
                ("admissions", "event_seq") => "0",
                _ => "NULL",
            };
            assert!(
                set[0].1.iter().all(|v| v == default),
                "{table}.{column} was filled by the migration: {set:?}"
            );
        }
    }

    // Committed requests replay their stored answers, no model called.
    let replay = |n: u128, input: &'static str| {
        let s = session(&store, n >> 4, Vec::new());
        async move { s.run(request(n), input, RunContext::default()).await }
    };
    let a1 = replay(0xa1, "first question").await?;
    assert!(a1.replayed);
    assert_eq!(
        a1.messages,
        [
            Message::user("first question"),
            Message::assistant("first answer")
        ]
    );
    let a2 = replay(0xa2, "use the tool").await?;
    assert!(a2.replayed);
    let [call, result] = tool_round("call-a2", "echoed");
    assert_eq!(
        a2.messages,
        [
            Message::user("use the tool"),
            call,
            result,
            Message::assistant("second answer")
        ]
    );
    assert_eq!(
        (a2.tool_calls, a2.verification_reports.clone()),
        (1, vec![report("1 call(s) checked")])
    );
    assert_eq!(
        replay(0xa3, "third question").await?.final_text,
        "third answer"
    );
    let a4 = replay(0xa4, "fourth question").await?;
    assert_eq!(
        (a4.final_text.as_str(), a4.conversation_version, a4.replayed),
        ("fourth answer", 4, true)
    );
    // A retry with another input is still refused.
    assert!(matches!(
        replay(0xa1, "another question").await,
        Err(Error::RequestMismatch { .. })
    ));

    // The summary row reads as it was written.
    let summary = store
        .latest_summary(conversation(0xa))
        .await?
        .expect("the fixture's summary");
    assert_eq!(
        (
            summary.from_seq,
            summary.through_seq,
            summary.content.as_str()
        ),
        (0, 4, "summary of entries 0 to 3")
    );
    assert_eq!(summary.request_id, request(0xa4));

    // The abandoned request stays burned.
    let c = session(&store, 0xc, Vec::new());
    assert!(matches!(
        c.run(request(0xc1), "abandoned question", RunContext::default())
            .await,
        Err(Error::RequestAbandoned { .. })
    ));

    // The held request: its old run's checkpoint, pending messages, journal
    // and verification report carry a resumed run to its commit.
    let admission = store.admission(conversation(0xb)).await?;
    let active = admission.active.expect("the fixture's held request");
    assert_eq!(active.request_id, request(0xb1));
    // The scripted model answers by position in the request: its script is
    // the request's whole script, the first turn's call included.
    let script = vec![
        ScriptedReply::tool_calls(vec![ToolCall::new(
            "call-b1",
            "echo",
            serde_json::json!({ "text": "held" }),
        )]),
        ScriptedReply::text("held answer"),
    ];
    let b = session(&store, 0xb, script);
    let resumed = b
        .resume_run(
            active.run_id,
            RunContext::default(),
            admission.revision,
            ResumePolicy::RejectAmbiguous,
        )
        .await?;
    let [call, result] = tool_round("call-b1", "held");
    assert_eq!(
        resumed.messages,
        [
            Message::user("held question"),
            call,
            result,
            Message::assistant("held answer")
        ]
    );
    assert_eq!(
        (resumed.tool_calls, resumed.verification_reports.clone()),
        (1, vec![report("1 call(s) checked")])
    );
    assert!(store.admission(conversation(0xb)).await?.active.is_none());

    // A new request commits after the old ones, and replays.
    let a = session(&store, 0xa, vec![ScriptedReply::text("fifth answer")]);
    let fifth = RequestId::new();
    let outcome = a
        .run(fifth, "fifth question", RunContext::default())
        .await?;
    assert_eq!((outcome.conversation_version, outcome.replayed), (5, false));
    let window = store.transcript_window(conversation(0xa), 3).await?;
    let seqs: Vec<u64> = window.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [9, 10, 11], "appended after the old transcript");
    assert!(
        a.run(fifth, "fifth question", RunContext::default())
            .await?
            .replayed
    );
    store.close().await?;

    // Reopened, the migrated file is at this build's schema and healthy.
    let doctor = SqliteStore::doctor(&path, std::time::Duration::from_secs(3600)).await?;
    assert_eq!(doctor.integrity_ok, Some(true), "{:?}", doctor.integrity);
    assert_eq!(
        doctor.schema_version,
        Some(SqliteStore::supported_schema_version())
    );
    SqliteStore::open(&path).await?.close().await?;
    Ok(())
}
