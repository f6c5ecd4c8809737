// A binary of its own: it installs a global tracing subscriber to read every log line.
//! Group commit on a WAL file: steps of many sessions that wait for the
//! writer together are committed in one transaction, a fenced step among them
//! fails alone, and every caller is answered only once its step is durable.
//!
//! To make the crowd certain, another connection holds the write lock while
//! the steps are sent: they all queue behind the writer's first transaction
//! and form the next batch, in the order they were sent. The writer's trace
//! events say how many steps each transaction committed.
//!
//! The steps of a run's owner are one statement each and take no savepoint:
//! a refused one (fenced) is undone by SQLite alone; one that fails
//! otherwise (here an injected fault) rolls its whole transaction back.
//! Steps of several statements (a summary's commit) still run in a
//! savepoint of their own. Claims, turn writes, tool results and commits
//! that queue together go as one statement per kind (migration 0011): a
//! step that statement skips runs alone and gets its own answer. In
//! memory, where a commit flushes nothing, those statements commit on
//! their own, outside any transaction.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sqlx::{Connection, SqliteConnection};
use turnstile::store::{
    ClaimOutcome, Fence, JournalStatus, NewRequest, StoredOutcome, SummaryCommit, SummaryPass,
    ToolResult,
};
use turnstile::{
    CheckpointPhase, Content, ConversationId, Error, LoopCheckpoint, Message, Part,
    ProviderMetadata, Reasoning, SqliteStore, Store, Usage,
};
use turnstile_conformance::logs::LogBuffer;
use turnstile_conformance::support::{
    admit, checkpoint, complete_request, new_conversation, new_request, ns, recover, tool_call,
    TestResult,
};

/// The log of every test of this file (one subscriber per process).
fn logs() -> LogBuffer {
    static LOGS: OnceLock<LogBuffer> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = LogBuffer::default();
        tracing::subscriber::set_global_default(
            tracing_subscriber::fmt()
                .with_max_level(tracing::Level::TRACE)
                .with_writer(logs.clone())
                .with_ansi(false)
                .finish(),
        )
        .expect("the only subscriber");
        logs
    })
    .clone()
}

/// A store on a WAL file of its own, in a temp dir that lives as long as
/// the returned guard.
async fn group_store(
) -> Result<(tempfile::TempDir, PathBuf, Arc<dyn Store>), Box<dyn std::error::Error + Send + Sync>>
{
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("group.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).await?);
    Ok((dir, path, store))
}

/// Claims a new conversation of `store` for `input`.
async fn admit_new(store: &Arc<dyn Store>, input: &str) -> Result<Fence, Error> {
    admit(
        store.as_ref(),
        new_conversation(store.as_ref()).await?,
        input,
    )
    .await
}

type Step<T = ()> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send>>;

/// A turn's write-ahead of `fence`'s run, as a step to send.
fn write_ahead(store: &Arc<dyn Store>, fence: Fence) -> Step {
    let store = store.clone();
    Box::pin(async move {
        let cp = checkpoint(fence.run_id, 1, CheckpointPhase::TurnInFlight, 1);
        store.begin_turn(&fence, &cp).await
    })
}

/// Sends `crowd` while another connection holds the write lock of `path`:
/// a first step (`first`) waits for the lock, the crowd queues behind it in
/// order; nobody is answered until the lock is let go. Returns the first
/// step's result and the crowd's, in order.
async fn crowd_behind_a_lock<T: Send + 'static>(
    path: &Path,
    first: Step,
    crowd: Vec<Step<T>>,
) -> Result<(Result<(), Error>, Vec<Result<T, Error>>), Box<dyn std::error::Error + Send + Sync>> {
    let mut holder = SqliteConnection::connect(&format!("sqlite:{}", path.display())).await?;
    sqlx::query("BEGIN IMMEDIATE").execute(&mut holder).await?;
    // Sleeps long enough for a loaded machine to poll each spawned task:
    // the first step must reach the writer before the crowd does.
    let first = tokio::spawn(first);
    tokio::time::sleep(Duration::from_millis(400)).await;
    // One task polls the steps in order: each is queued at its first poll.
    let crowd = tokio::spawn(futures_util::future::join_all(crowd));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!first.is_finished(), "answered while the lock was held");
    assert!(!crowd.is_finished(), "answered while the lock was held");
    sqlx::query("COMMIT").execute(&mut holder).await?;
    Ok((first.await?, crowd.await?))
}

/// The (steps, failed) counts of the group transactions logged so far.
fn batches(logs: &LogBuffer) -> Vec<(usize, usize)> {
    let text = logs.text();
    let field = |line: &str, name: &str| -> Option<usize> {
        let at = line.find(name)? + name.len();
        line[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    text.lines()
        .filter(|line| line.contains("group transaction committed"))
        .filter_map(|line| Some((field(line, "steps=")?, field(line, "failed=")?)))
        .collect()
}

/// The (kind, steps, applied) counts of the statements that wrote several
/// steps at once, logged so far.
fn shared_statements(logs: &LogBuffer) -> Vec<(String, usize, usize)> {
    let text = logs.text();
    text.lines()
        .filter(|line| line.contains("steps written in one statement"))
        .filter_map(|line| {
            Some((
                log_field(line, "kind=")?.to_owned(),
                log_field(line, "steps=")?.parse().ok()?,
                log_field(line, "applied=")?.parse().ok()?,
            ))
        })
        .collect()
}

/// The value of a logged event's field `name` (`kind=`, `steps=`...).
fn log_field<'l>(line: &'l str, name: &str) -> Option<&'l str> {
    let at = line.find(name)? + name.len();
    line[at..]
        .split(|c: char| !c.is_ascii_alphanumeric())
        .next()
}

/// The (kind, steps) counts of the shared statements that committed on
/// their own (in memory), logged so far.
fn statements_committed_alone(logs: &LogBuffer) -> Vec<(String, usize)> {
    logs.text()
        .lines()
        .filter(|line| line.contains("shared statement committed on its own"))
        .filter_map(|line| {
            Some((
                log_field(line, "kind=")?.to_owned(),
                log_field(line, "steps=")?.parse().ok()?,
            ))
        })
        .collect()
}

/// A new conversation of `store` with `i % 3` requests committed before:
/// conversations of a crowd each at their own revision, and each commit at
/// its own position of its own transcript.
async fn conversation_after_requests(
    store: &Arc<dyn Store>,
    i: usize,
) -> Result<ConversationId, Error> {
    let conversation = new_conversation(store.as_ref()).await?;
    for j in 0..i % 3 {
        let (q, a) = (format!("q{i}.{j}"), format!("a{i}.{j}"));
        complete_request(store.as_ref(), conversation, &q, 0, &a).await?;
    }
    Ok(conversation)
}

/// How many checkpoint rows a run has, read on a connection of its own.
async fn checkpoint_rows(path: &Path, fence: &Fence) -> Result<i64, sqlx::Error> {
    let mut reader = SqliteConnection::connect(&format!("sqlite:{}", path.display())).await?;
    sqlx::query_scalar("SELECT COUNT(*) FROM all_checkpoints WHERE run_id = ?1")
        .bind(fence.run_id.as_uuid())
        .fetch_one(&mut reader)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowd_of_steps_commits_together_and_a_fenced_step_fails_alone() -> TestResult {
    let logs = logs();
    const LIVE: usize = 24;
    let (_dir, path, store) = group_store().await?;

    let mut live = Vec::new();
    for _ in 0..LIVE {
        let conversation = new_conversation(store.as_ref()).await?;
        live.push(admit(store.as_ref(), conversation, "live").await?);
    }
    // A zombie: its request was taken over by another run.
    let conversation = new_conversation(store.as_ref()).await?;
    let zombie = admit(store.as_ref(), conversation, "zombie").await?;
    let successor = recover(store.as_ref(), &zombie).await?;

    let mut crowd: Vec<Step> = live[1..].iter().map(|f| write_ahead(&store, *f)).collect();
    crowd.push(write_ahead(&store, zombie));
    let (first, mut crowd) =
        crowd_behind_a_lock(&path, write_ahead(&store, live[0]), crowd).await?;
    first?;
    match crowd.pop().expect("the zombie's step") {
        Err(Error::Fenced { run_id, revision }) => {
            assert_eq!((run_id, revision), (zombie.run_id, zombie.revision));
        }
        other => panic!("expected the zombie to be fenced, got {other:?}"),
    }
    for result in crowd {
        result?;
    }

    // Every live step is durable and visible to a new connection; the
    // zombie wrote nothing and the successor is untouched.
    let mut reader = SqliteConnection::connect(&format!("sqlite:{}", path.display())).await?;
    for fence in &live {
        let (turn, phase): (i64, String) = sqlx::query_as(
            "SELECT turn, phase FROM all_checkpoints WHERE run_id = ?1 ORDER BY turn DESC LIMIT 1",
        )
        .bind(fence.run_id.as_uuid())
        .fetch_one(&mut reader)
        .await?;
        assert_eq!((turn, phase.as_str()), (1, "turn_in_flight"));
    }
    let zombie_rows: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM all_checkpoints WHERE run_id = ?1")
            .bind(zombie.run_id.as_uuid())
            .fetch_one(&mut reader)
            .await?;
    assert_eq!(zombie_rows, 0);
    let admission = store.admission(conversation).await?;
    assert_eq!(admission.revision, successor.revision);
    assert_eq!(
        admission.active.map(|a| a.run_id),
        Some(successor.run_id),
        "the zombie's step moved the admission"
    );

    // The crowd (all live steps but the first) and the zombie's step shared
    // one transaction, in which SQLite undid the zombie's statement alone
    // (no savepoint).
    let batches = batches(&logs);
    assert!(
        batches.contains(&(LIVE, 1)),
        "no group transaction of {LIVE} steps with 1 failed in {batches:?}"
    );
    // The crowd's write-aheads went as one statement, which skipped the
    // zombie's; it then ran alone and was fenced.
    let shared = shared_statements(&logs);
    assert!(
        shared.contains(&("TurnWrite".into(), LIVE, LIVE - 1)),
        "no statement of {LIVE} turn writes with {} applied in {shared:?}",
        LIVE - 1
    );
    Ok(())
}

/// A step that fails with a store error (a fault injected on its run's
/// checkpoints) among others: no savepoint can undo it alone, so its whole
/// transaction is rolled back. The steps before it in that transaction are
/// told the error and wrote nothing; the steps after it commit in the next
/// transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_error_in_a_crowd_rolls_back_its_transaction_and_the_rest_goes_on() -> TestResult {
    let logs = logs();
    const BEFORE: usize = 5;
    const AFTER: usize = 7;
    let (_dir, path, store) = group_store().await?;
    let mut fences = Vec::new();
    for _ in 0..BEFORE + 1 + AFTER + 1 {
        let conversation = new_conversation(store.as_ref()).await?;
        fences.push(admit(store.as_ref(), conversation, "live").await?);
    }
    let first = fences.pop().expect("the first step's");
    let faulty = fences[BEFORE];
    let run: String = faulty
        .run_id
        .as_uuid()
        .as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut raw = SqliteConnection::connect(&format!("sqlite:{}", path.display())).await?;
    sqlx::query(&format!(
        "CREATE TRIGGER fault BEFORE UPDATE OF checkpoint_phase ON requests WHEN NEW.request_id = x'{run}' \
         BEGIN SELECT RAISE(ABORT, 'injected'); END"
    ))
    .execute(&mut raw)
    .await?;

    let crowd = fences.iter().map(|f| write_ahead(&store, *f)).collect();
    let (first_result, results) =
        crowd_behind_a_lock(&path, write_ahead(&store, first), crowd).await?;
    first_result?;
    for (i, (fence, result)) in fences.iter().zip(results).enumerate() {
        let rows = checkpoint_rows(&path, fence).await?;
        if i <= BEFORE {
            match result {
                Err(Error::Store(e)) => assert!(e.message().contains("injected"), "{i}: {e}"),
                other => panic!("step {i}: expected the injected error, got {other:?}"),
            }
            assert_eq!(rows, 0, "step {i} was rolled back and wrote nothing");
            // The admission still names the run: nothing moved it.
            let admission = store.admission(fence.conversation_id).await?;
            assert_eq!(admission.revision, fence.revision, "step {i}");
        } else {
            result?;
            assert_eq!(rows, 1, "step {i} is durable");
        }
    }
    // The steps after the faulty one made a transaction of their own.
    let batches = batches(&logs);
    assert!(
        batches.contains(&(AFTER, 0)),
        "no group transaction of {AFTER} steps in {batches:?}"
    );
    Ok(())
}

/// A summary's commit is several statements: in a crowd it runs in a
/// savepoint, and when it is refused after its first write (the fence
/// touches the admission's activity time, then the pass does not match the
/// one in flight), rolling back to the savepoint undoes that write and
/// nothing else: the crowd commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_summary_commit_in_a_crowd_is_rolled_back_to_its_savepoint() -> TestResult {
    let logs = logs();
    const LIVE: usize = 9;
    let (_dir, path, store) = group_store().await?;
    let mut live = Vec::new();
    for _ in 0..LIVE + 1 {
        let conversation = new_conversation(store.as_ref()).await?;
        live.push(admit(store.as_ref(), conversation, "live").await?);
    }
    let first = live.pop().expect("the first step's");
    // A held request over two committed ones (entries 0..=3, version 2),
    // with a pass over entries 0..=3 in flight.
    let conversation = new_conversation(store.as_ref()).await?;
    for i in 0..2 {
        let (q, a) = (format!("question {i}"), format!("answer {i}"));
        complete_request(store.as_ref(), conversation, &q, 0, &a).await?;
    }
    let summarizing = admit(store.as_ref(), conversation, "summarize first").await?;
    let in_flight = SummaryPass {
        from_seq: 0,
        through_seq: 3,
        transcript_version: 2,
        prompt_sha256: [1; 32],
    };
    store.record_summary_pass(&summarizing, &in_flight).await?;
    let activity = || async {
        let mut reader = SqliteConnection::connect(&format!("sqlite:{}", path.display())).await?;
        sqlx::query_scalar::<_, i64>("SELECT updated_at FROM admissions WHERE conversation_id = ?1")
            .bind(conversation.as_uuid())
            .fetch_one(&mut reader)
            .await
    };
    let before = activity().await?;
    tokio::time::sleep(Duration::from_millis(5)).await;

    let mut crowd: Vec<Step> = live[..LIVE / 2]
        .iter()
        .map(|f| write_ahead(&store, *f))
        .collect();
    let other_pass = SummaryCommit {
        pass: SummaryPass {
            prompt_sha256: [2; 32],
            ..in_flight.clone()
        },
        content: "a summary of another pass".into(),
        usage: Usage::default(),
    };
    crowd.push({
        let store = store.clone();
        Box::pin(async move {
            store
                .commit_summary(&summarizing, &other_pass)
                .await
                .map(drop)
        })
    });
    crowd.extend(live[LIVE / 2..].iter().map(|f| write_ahead(&store, *f)));
    let (first_result, mut results) =
        crowd_behind_a_lock(&path, write_ahead(&store, first), crowd).await?;
    first_result?;
    let refused = results.remove(LIVE / 2);
    assert!(
        matches!(refused, Err(Error::Conflict { .. })),
        "expected a conflict, got {refused:?}"
    );
    for (fence, result) in live.iter().zip(results) {
        result?;
        assert_eq!(checkpoint_rows(&path, fence).await?, 1);
    }
    assert_eq!(activity().await?, before, "the refused step's write stayed");
    let admission = store.admission(conversation).await?;
    let active = admission.active.expect("held");
    assert_eq!(
        active.summary.pending,
        Some(in_flight),
        "the pass in flight"
    );
    assert_eq!(active.summary.passes, 0);
    let batches = batches(&logs);
    assert!(
        batches.contains(&(LIVE + 1, 1)),
        "no group transaction of {} steps with 1 failed in {batches:?}",
        LIVE + 1
    );
    Ok(())
}

/// Claims that queue together are sent as one statement. The ones it skips
/// (a rival claim of a conversation claimed earlier in the same statement,
/// a known request id, a request id of a deleted conversation) then run
/// alone and get the answer they would have got alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowd_of_claims_shares_one_statement_and_each_refusal_is_named() -> TestResult {
    let logs = logs();
    const FREE: usize = 12;
    let (_dir, path, store) = group_store().await?;
    let first = admit_new(&store, "first").await?;
    let mut claims = Vec::new();
    for i in 0..FREE {
        let conversation = new_conversation(store.as_ref()).await?;
        // Revisions that differ from claim to claim, so an answer given to
        // the wrong caller shows.
        for j in 0..i % 4 {
            complete_request(store.as_ref(), conversation, &format!("q{i}.{j}"), 0, "a").await?;
        }
        let revision = store.admission(conversation).await?.revision;
        // Text and values the shared statement carries as JSON, to arrive
        // as the single statement binds them.
        let input = format!("claim {i}: \u{0} \u{202e} \\ \" é 😀");
        let mut claim = NewRequest {
            agent_fingerprint: format!("fp-{i}-é"),
            deadline_at: Some(1_900_000_000_000 + i as i64),
            // Every other claim with a budget (JSON inside the row's JSON).
            budget: turnstile_core::Budget {
                max_turns: (i % 2 == 0).then_some(i as u32 + 1),
                max_tokens: (i % 2 == 0).then_some(u64::MAX - i as u64),
                max_tool_calls: None,
            },
            ..new_request(conversation, revision, &input)
        };
        // Every other claim starts its first turn at once (its write-ahead
        // checkpoint, with usage and a report, rides in the claim's row).
        if i % 2 == 1 {
            let mut first = checkpoint(claim.run_id, 1, CheckpointPhase::TurnInFlight, 1);
            first.usage.input_tokens += i as u64;
            claim.first_turn = Some(first);
        }
        // And an input with more than a role and a text (its `meta`).
        if i % 3 == 2 {
            claim.input = Message::tool(format!("call-{i}"), input, true);
        }
        claims.push(claim);
    }
    let rival = new_request(
        claims[0].conversation_id,
        claims[0].expected_revision,
        "rival",
    );
    let known = admit_new(&store, "known").await?;
    let idle = new_conversation(store.as_ref()).await?;
    let idle_revision = store.admission(idle).await?.revision;
    let known_again = NewRequest {
        request_id: known.request_id,
        ..new_request(idle, idle_revision, "known")
    };
    let doomed = new_conversation(store.as_ref()).await?;
    let (gone, _) = complete_request(store.as_ref(), doomed, "doomed", 0, "bye").await?;
    store.delete_conversation(&ns(), doomed, 1, None).await?;
    let of_deleted = NewRequest {
        request_id: gone.request_id,
        ..new_request(idle, idle_revision, "doomed")
    };

    // The refused ones first and in the middle: the rows around a skipped
    // one must still be answered from their own rows.
    let half = FREE / 2;
    let mut all = vec![known_again, of_deleted];
    all.extend(claims[..half].iter().cloned());
    all.push(rival);
    all.extend(claims[half..].iter().cloned());
    let crowd: Vec<Step<ClaimOutcome>> = all
        .iter()
        .map(|claim| {
            let (store, claim) = (store.clone(), claim.clone());
            Box::pin(async move { store.claim(&claim).await }) as Step<ClaimOutcome>
        })
        .collect();
    let (first_result, mut results) =
        crowd_behind_a_lock(&path, write_ahead(&store, first), crowd).await?;
    first_result?;

    match results.remove(half + 2) {
        Err(Error::Busy { .. }) => {}
        other => panic!("expected the rival claim to find the conversation busy, got {other:?}"),
    }
    match results.remove(1) {
        Err(Error::Deleted { conversation_id }) => assert_eq!(conversation_id, doomed),
        other => panic!("expected the deleted conversation's request refused, got {other:?}"),
    }
    match results.remove(0) {
        Ok(ClaimOutcome::Existing(record)) => {
            assert_eq!(record.request_id, known.request_id);
            assert_eq!(record.conversation_id, known.conversation_id);
        }
        other => panic!("expected the known request, got {other:?}"),
    }
    for (claim, result) in claims.iter().zip(results) {
        let ClaimOutcome::Admitted(fence) = result? else {
            panic!("claim of {} not admitted", claim.conversation_id);
        };
        assert_eq!(fence.request_id, claim.request_id);
        assert_eq!(fence.run_id, claim.run_id);
        let admission = store.admission(claim.conversation_id).await?;
        assert_eq!(admission.revision, fence.revision);
        assert_eq!(admission.revision.0, claim.expected_revision.0 + 1);
        assert_eq!(
            admission.active.as_ref().map(|a| a.request_id),
            Some(claim.request_id)
        );
        let pending = store.request_messages(claim.request_id, u64::MAX).await?;
        assert_eq!(pending, vec![claim.input.clone()]);
        let active = admission.active.as_ref().expect("held");
        assert_eq!(active.agent_fingerprint, claim.agent_fingerprint);
        assert_eq!(active.input_sha256, claim.input_sha256);
        let record = store.request(claim.request_id).await?.expect("stored");
        assert_eq!(record.deadline_at, claim.deadline_at);
        assert_eq!(record.budget, claim.budget);
        assert_eq!(record.input_sha256, claim.input_sha256);
        let first_turn = store
            .latest_checkpoint(claim.run_id)
            .await?
            .map(|c| LoopCheckpoint { created_at: 0, ..c });
        assert_eq!(first_turn, claim.first_turn);
        let usage = claim.first_turn.as_ref().map(|c| c.usage);
        assert_eq!(
            store.recovery_usage(claim.request_id).await?,
            usage.unwrap_or_default()
        );
    }
    assert_eq!(
        store.admission(idle).await?.revision,
        idle_revision,
        "nothing claimed it"
    );
    let shared = shared_statements(&logs);
    assert!(
        shared.contains(&("Claim".into(), FREE + 3, FREE)),
        "no statement of {} claims with {FREE} applied in {shared:?}",
        FREE + 3
    );
    Ok(())
}

/// Every other answer with signed reasoning before its text and provider
/// metadata (its `meta` holds them), the others as they are.
fn thoughtful(i: usize, answer: Message) -> Message {
    let Message::Assistant {
        content,
        tool_calls,
        ..
    } = answer
    else {
        return answer;
    };
    if i % 2 == 0 {
        return Message::Assistant {
            content,
            tool_calls,
            provider_metadata: None,
        };
    }
    let reasoning = Part::Reasoning(Reasoning {
        provider: "anthropic".into(),
        text: Some(format!("step {i} \u{0} é")),
        signature: Some(format!("sig-{i}-").repeat(200)),
        redacted: None,
    });
    let mut parts = vec![reasoning];
    parts.extend(content.into_parts());
    let metadata = format!(r#"{{"z": {i}, "a": 1e400, "s": "\u00e9"}}"#);
    Message::Assistant {
        content: Content::new(parts),
        tool_calls,
        provider_metadata: Some(ProviderMetadata::new(metadata).unwrap()),
    }
}

/// The final answer of the `i`th commit of a crowd: text that JSON must
/// carry, and for every other commit tool calls too (the message's `meta`),
/// every third signed reasoning and provider metadata.
fn crowd_answer(i: usize) -> Message {
    let content = format!("answer {i}: \u{0} \u{202e} é 😀");
    if i % 3 == 2 {
        return thoughtful(1, Message::assistant(content));
    }
    match i % 2 {
        0 => Message::assistant(content),
        _ => Message::assistant_with_calls(
            content,
            vec![tool_call(
                &format!("late-{i}"),
                r#"{"b": 2, "a": "\u0000"}"#,
            )],
        ),
    }
}

/// Commits that queue together are sent as one statement; each caller gets
/// its own request's outcome, and a replaced owner's commit among them is
/// fenced alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowd_of_commits_shares_one_statement_and_a_zombie_is_fenced_alone() -> TestResult {
    let logs = logs();
    const LIVE: usize = 10;
    let (_dir, path, store) = group_store().await?;
    let first = admit_new(&store, "first").await?;
    let mut live = Vec::new();
    for i in 0..LIVE {
        let conversation = conversation_after_requests(&store, i).await?;
        live.push(admit(store.as_ref(), conversation, &format!("question {i}")).await?);
    }
    let conversation = new_conversation(store.as_ref()).await?;
    let zombie = admit(store.as_ref(), conversation, "zombie").await?;
    let successor = recover(store.as_ref(), &zombie).await?;

    // The zombie first: the rows after a skipped one are answered from
    // their own rows.
    let mut owners = vec![zombie];
    owners.extend(live.iter().copied());
    let crowd: Vec<Step<StoredOutcome>> = owners
        .iter()
        .enumerate()
        .map(|(i, fence)| {
            let (store, fence) = (store.clone(), *fence);
            let answer = match i {
                0 => Message::assistant("too late"),
                i => crowd_answer(i - 1),
            };
            Box::pin(async move {
                let last = checkpoint(fence.run_id, 1, CheckpointPhase::Ready, 2);
                store.commit(&fence, &last, &answer).await
            }) as Step<StoredOutcome>
        })
        .collect();
    let (first_result, mut results) =
        crowd_behind_a_lock(&path, write_ahead(&store, first), crowd).await?;
    first_result?;

    match results.remove(0) {
        Err(Error::Fenced { run_id, revision }) => {
            assert_eq!((run_id, revision), (zombie.run_id, zombie.revision));
        }
        other => panic!("expected the zombie to be fenced, got {other:?}"),
    }
    let admission = store.admission(conversation).await?;
    assert_eq!(admission.active.map(|a| a.run_id), Some(successor.run_id));
    for (i, (fence, result)) in live.iter().zip(results).enumerate() {
        let outcome = result?;
        let stored = store
            .request(fence.request_id)
            .await?
            .and_then(|r| r.outcome);
        assert_eq!(stored.as_ref(), Some(&outcome), "request {i}");
        let earlier = (i % 3) as u64;
        assert_eq!(
            (outcome.first_seq, outcome.end_seq),
            (2 * earlier, 2 * earlier + 2)
        );
        assert_eq!(outcome.conversation_version, earlier + 1);
        let transcript = store
            .transcript_window(fence.conversation_id, u32::MAX)
            .await?;
        let messages: Vec<&Message> = transcript.iter().map(|e| &e.message).collect();
        let question = Message::user(format!("question {i}"));
        assert_eq!(
            &messages[2 * earlier as usize..],
            &[&question, &crowd_answer(i)][..],
            "{messages:?}"
        );
        assert!(store
            .admission(fence.conversation_id)
            .await?
            .active
            .is_none());
    }
    let shared = shared_statements(&logs);
    assert!(
        shared.contains(&("Commit".into(), LIVE + 1, LIVE)),
        "no statement of {} commits with {LIVE} applied in {shared:?}",
        LIVE + 1
    );
    Ok(())
}

/// Tool results that queue together are sent as one statement; a replaced
/// owner's result and a result for a call nobody asked for are skipped by
/// it, run alone, and are refused as they would be alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowd_of_tool_results_shares_one_statement_and_refusals_are_named() -> TestResult {
    let logs = logs();
    const LIVE: usize = 8;
    let (_dir, path, store) = group_store().await?;
    let first = admit_new(&store, "first").await?;
    // Each run asks for one call, "call-1", in turn 1.
    let asked = |fence: Fence| {
        let store = store.clone();
        async move {
            let mut start = checkpoint(fence.run_id, 0, CheckpointPhase::TurnInFlight, 1);
            start.turn = 1;
            store.begin_turn(&fence, &start).await?;
            let assistant =
                Message::assistant_with_calls("calling", vec![tool_call("call-1", "{}")]);
            let answered = checkpoint(fence.run_id, 1, CheckpointPhase::ToolsInFlight, 1);
            store
                .record_model_response(&fence, &answered, &assistant)
                .await
        }
    };
    let mut live = Vec::new();
    for _ in 0..LIVE {
        let fence = admit(store.as_ref(), new_conversation(store.as_ref()).await?, "q").await?;
        asked(fence).await?;
        live.push(fence);
    }
    let zombie = admit(store.as_ref(), new_conversation(store.as_ref()).await?, "z").await?;
    asked(zombie).await?;
    recover(store.as_ref(), &zombie).await?;

    let result = |fence: Fence, call_id: &'static str, content: String| -> Step {
        let store = store.clone();
        Box::pin(async move {
            let result = ToolResult {
                content: content.into(),
                is_error: false,
            };
            store.record_tool_result(&fence, 1, call_id, &result).await
        })
    };
    // The refused ones first and in the middle.
    let half = LIVE / 2;
    let live_results = |range: std::ops::Range<usize>| {
        range
            .map(|i| result(live[i], "call-1", format!("result {i}")))
            .collect::<Vec<Step>>()
    };
    let mut crowd = vec![result(zombie, "call-1", "late".into())];
    crowd.extend(live_results(0..half));
    crowd.push(result(live[0], "call-unknown", "nobody asked".into()));
    crowd.extend(live_results(half..LIVE));
    let (first_result, mut results) =
        crowd_behind_a_lock(&path, write_ahead(&store, first), crowd).await?;
    first_result?;

    match results.remove(half + 1) {
        Err(Error::InvalidInput(message)) => assert!(message.contains("call-unknown")),
        other => panic!("expected the unknown call refused, got {other:?}"),
    }
    match results.remove(0) {
        Err(Error::Fenced { run_id, .. }) => assert_eq!(run_id, zombie.run_id),
        other => panic!("expected the zombie to be fenced, got {other:?}"),
    }
    for (i, (fence, result)) in live.iter().zip(results).enumerate() {
        result?;
        let journal = store.journal(fence.request_id, 1).await?;
        assert_eq!(journal.len(), 1, "{journal:?}");
        assert_eq!(journal[0].status, JournalStatus::Completed);
        let stored = journal[0]
            .result
            .as_ref()
            .map(|r| r.content.as_plain_text());
        assert_eq!(stored.flatten(), Some(format!("result {i}").as_str()));
    }
    let journal = store.journal(zombie.request_id, 1).await?;
    assert_eq!(
        journal[0].status,
        JournalStatus::Requested,
        "the zombie wrote"
    );
    let shared = shared_statements(&logs);
    assert!(
        shared.contains(&("ToolResult".into(), LIVE + 2, LIVE)),
        "no statement of {} tool results with {LIVE} applied in {shared:?}",
        LIVE + 2
    );
    Ok(())
}

/// Model answers that queue together are sent as one turn-write statement.
/// Each arrives whole: its assistant message with its tool calls (the
/// message's `meta`), its journaled calls with their raw arguments, and
/// its checkpoint, with text the shared statement carries as JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowd_of_model_answers_shares_one_statement_and_each_arrives_whole() -> TestResult {
    let logs = logs();
    const LIVE: usize = 9;
    let (_dir, path, store) = group_store().await?;
    let first = admit_new(&store, "first").await?;
    let mut steps = Vec::new();
    for i in 0..LIVE {
        let fence = admit_new(&store, &format!("question {i}")).await?;
        let arguments =
            format!(r#"{{"q": "{i}: \u0000 \\ \" é 😀", "n": {i}.5, "list": [1, {{}}]}}"#);
        let calls: Vec<_> = (0..=i % 3)
            .map(|c| tool_call(&format!("call-{i}-{c}"), &arguments))
            .collect();
        let assistant = thoughtful(
            i,
            Message::assistant_with_calls(format!("answer {i}: \u{0} \u{202e} é 😀"), calls),
        );
        let mut answered = checkpoint(fence.run_id, 1, CheckpointPhase::ToolsInFlight, 1);
        answered.usage.output_tokens += i as u64;
        steps.push((fence, answered, assistant));
    }
    let crowd: Vec<Step> = steps
        .iter()
        .map(|(fence, answered, assistant)| {
            let (store, fence, answered, assistant) =
                (store.clone(), *fence, answered.clone(), assistant.clone());
            Box::pin(async move {
                store
                    .record_model_response(&fence, &answered, &assistant)
                    .await
            }) as Step
        })
        .collect();
    let (first_result, results) =
        crowd_behind_a_lock(&path, write_ahead(&store, first), crowd).await?;
    first_result?;

    for ((fence, answered, assistant), result) in steps.iter().zip(results) {
        result?;
        let pending = store.request_messages(fence.request_id, u64::MAX).await?;
        assert_eq!(pending.get(1), Some(assistant), "{pending:?}");
        let journal = store.journal(fence.request_id, 1).await?;
        let calls: Vec<(&str, Option<&str>)> = journal
            .iter()
            .map(|e| (e.call_id.as_str(), e.arguments.as_deref()))
            .collect();
        let expected: Vec<(&str, Option<&str>)> = assistant
            .tool_calls()
            .iter()
            .map(|c| (c.id.as_str(), Some(c.arguments.as_str())))
            .collect();
        assert_eq!(calls, expected);
        let stored = store
            .latest_checkpoint(fence.run_id)
            .await?
            .map(|c| LoopCheckpoint { created_at: 0, ..c });
        assert_eq!(stored.as_ref(), Some(answered));
    }
    let shared = shared_statements(&logs);
    assert!(
        shared.contains(&("TurnWrite".into(), LIVE, LIVE)),
        "no statement of {LIVE} turn writes in {shared:?}"
    );
    Ok(())
}

/// In memory, where a commit flushes nothing, a crowd's shared statements
/// run outside any transaction and commit on their own. A crowd of claims,
/// then one of commits, each with a refusal the statement skips, is
/// answered as on a file: every applied step from its own row, the refused
/// one run alone and its refusal named, and what each committed reads back.
///
/// On a current-thread runtime the crowd is certain: `join_all` sends every
/// step before the runtime runs anything else, and the first, which finds
/// the writer idle, holds it (on a task of its own) while the rest queue.
#[tokio::test]
async fn in_memory_a_crowds_shared_statements_commit_on_their_own() -> TestResult {
    let logs = logs();
    const FREE: usize = 7;
    let store: Arc<dyn Store> = Arc::new(SqliteStore::in_memory().await?);
    let mut claims = Vec::new();
    for i in 0..FREE {
        let conversation = conversation_after_requests(&store, i).await?;
        let revision = store.admission(conversation).await?.revision;
        claims.push(new_request(
            conversation,
            revision,
            &format!("question {i}"),
        ));
    }
    // The first claim runs alone and takes its conversation; the rival for
    // it, in the middle of the crowd, is skipped by the shared statement.
    let rival = new_request(
        claims[0].conversation_id,
        claims[0].expected_revision,
        "rival",
    );
    let mut sent = claims.clone();
    sent.insert(FREE / 2, rival);
    let results = futures_util::future::join_all(sent.iter().map(|claim| store.claim(claim))).await;
    let mut live = Vec::new();
    for (claim, result) in sent.iter().zip(results) {
        if claim.request_id == sent[FREE / 2].request_id {
            assert!(
                matches!(result, Err(Error::Busy { .. })),
                "expected the rival to find its conversation busy, got {result:?}"
            );
            continue;
        }
        let ClaimOutcome::Admitted(fence) = result? else {
            panic!("claim of {} not admitted", claim.conversation_id);
        };
        assert_eq!(fence.request_id, claim.request_id);
        assert_eq!(fence.revision.0, claim.expected_revision.0 + 1);
        assert_eq!(
            store.admission(claim.conversation_id).await?.revision,
            fence.revision
        );
        live.push(fence);
    }

    // Commits: the first runs alone; a replaced owner's, first of the rest,
    // is skipped by the shared statement and fenced alone.
    let conversation = new_conversation(store.as_ref()).await?;
    let zombie = admit(store.as_ref(), conversation, "zombie").await?;
    let successor = recover(store.as_ref(), &zombie).await?;
    let mut owners = live.clone();
    owners.insert(1, zombie);
    let results = futures_util::future::join_all(owners.iter().map(|fence| {
        let store = store.clone();
        let fence = *fence;
        async move {
            let answer = Message::assistant(format!("answer to {}", fence.request_id));
            let last = checkpoint(fence.run_id, 1, CheckpointPhase::Ready, 2);
            store.commit(&fence, &last, &answer).await
        }
    }))
    .await;
    for (fence, result) in owners.iter().zip(results) {
        if fence.run_id == zombie.run_id {
            match result {
                Err(Error::Fenced { run_id, revision }) => {
                    assert_eq!((run_id, revision), (zombie.run_id, zombie.revision));
                }
                other => panic!("expected the zombie to be fenced, got {other:?}"),
            }
            continue;
        }
        let outcome = result?;
        let i = live.iter().position(|f| f == fence).expect("a live owner");
        let earlier = (i % 3) as u64;
        assert_eq!(
            (
                outcome.first_seq,
                outcome.end_seq,
                outcome.conversation_version
            ),
            (2 * earlier, 2 * earlier + 2, earlier + 1)
        );
        let transcript = store
            .transcript_window(fence.conversation_id, u32::MAX)
            .await?;
        let messages: Vec<&Message> = transcript.iter().map(|e| &e.message).collect();
        let question = Message::user(format!("question {i}"));
        let answer = Message::assistant(format!("answer to {}", fence.request_id));
        assert_eq!(&messages[2 * earlier as usize..], &[&question, &answer][..]);
        assert!(store
            .admission(fence.conversation_id)
            .await?
            .active
            .is_none());
    }
    let admission = store.admission(conversation).await?;
    assert_eq!(admission.active.map(|a| a.run_id), Some(successor.run_id));

    let shared = shared_statements(&logs);
    let alone = statements_committed_alone(&logs);
    for kind in ["Claim", "Commit"] {
        assert!(
            shared.contains(&(kind.into(), FREE, FREE - 1)),
            "no statement of {FREE} {kind} steps with {} applied in {shared:?}",
            FREE - 1
        );
        assert!(
            alone.contains(&(kind.into(), FREE - 1)),
            "no {kind} statement of {} steps committed on its own in {alone:?}",
            FREE - 1
        );
    }
    Ok(())
}
