//! A request from claim to commit, and what the read API shows after.

use turnstile_core::store::{
    Fence, InputHash, JournalStatus, LoggedStep, NewRequest, RequestStatus, RunStatus, Store,
};
use turnstile_core::{CheckpointPhase, ConversationId, Error, Message, Revision, RunId, ToolCall};

use crate::support::{
    admit, admitted, checkpoint, commit_answer, complete_request, new_conversation, new_request,
    ns, recover, tool_call, tool_turn, usage_after, SharedStore, TestResult,
};

pub async fn request_with_tool_turns_commits_to_transcript_and_releases(
    store: SharedStore,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let fence = admit(&*store, conversation, "what is 2+2?").await?;
    let mut count = 1;
    for turn in 1..=2 {
        let call = tool_call(&format!("call-{turn}"), r#"{"x":2}"#);
        count = tool_turn(&*store, &fence, turn, count, call, &format!("r{turn}")).await?;
    }
    assert_eq!(count, 5);

    // Before the commit: every turn is a checkpoint, every call journaled.
    let checkpoints = store.checkpoints(fence.run_id).await?;
    let shape: Vec<_> = checkpoints
        .iter()
        .map(|c| (c.turn, c.phase, c.message_count))
        .collect();
    let ready = CheckpointPhase::Ready;
    assert_eq!(shape, vec![(1, ready, 3), (2, ready, 5)]);
    assert_eq!(checkpoints[1].usage, usage_after(2));
    assert_eq!(checkpoints[1].verification_reports.len(), 2);
    let journal = store.journal(fence.request_id, 1).await?;
    assert_eq!(journal.len(), 1);
    let entry = &journal[0];
    assert_eq!((entry.turn, entry.call_id.as_str()), (1, "call-1"));
    assert_eq!(
        (entry.run_id, entry.name.as_str(), entry.status),
        (fence.run_id, "lookup", JournalStatus::Completed)
    );
    // The checkpointed turn's call and result are messages now; the journal
    // keeps only what ran, so nothing is stored twice.
    assert_eq!((&entry.arguments, &entry.result), (&None, &None));
    let pending = store.request_messages(fence.request_id, 5).await?;
    let roles: Vec<_> = pending.iter().map(Message::role).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant", "tool"]);
    assert_eq!(store.request_messages(fence.request_id, 2).await?.len(), 2);
    assert_eq!(
        store.recovery_usage(fence.request_id).await?,
        usage_after(2)
    );

    let outcome = commit_answer(&*store, &fence, 3, count, "4").await?;
    assert_eq!(outcome.run_id, fence.run_id);
    assert_eq!((outcome.turns, outcome.tool_calls), (3, 3));
    assert_eq!(outcome.usage, usage_after(3));
    assert_eq!(outcome.verification_reports.len(), 3);
    assert_eq!(outcome.conversation_version, 1);
    assert_eq!((outcome.first_seq, outcome.end_seq), (0, 6));

    // The whole request moved to the transcript, in order.
    let transcript = store.transcript_window(conversation, 100).await?;
    let seqs: Vec<_> = transcript.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (0..6).collect::<Vec<_>>());
    assert!(transcript.iter().all(|e| e.request_id == fence.request_id));
    let mut expected = pending.clone();
    expected.push(Message::assistant("4"));
    let messages: Vec<_> = transcript.iter().map(|e| e.message.clone()).collect();
    assert_eq!(messages, expected);
    assert_eq!(
        store.transcript_range(conversation, 1, 3).await?,
        transcript[1..3]
    );
    assert_eq!(
        store.transcript_window(conversation, 2).await?,
        transcript[4..]
    );
    assert!(store
        .request_messages(fence.request_id, 100)
        .await?
        .is_empty());

    // Released in the same step: idle, next revision, version bumped.
    let admission = store.admission(conversation).await?;
    assert_eq!((admission.revision, admission.active), (Revision(2), None));
    assert_eq!(store.conversation(&ns(), conversation).await?.version, 1);
    let request = store.request(fence.request_id).await?.expect("request");
    assert_eq!(request.status, RequestStatus::Completed);
    assert_eq!(request.outcome.as_ref(), Some(&outcome));
    assert!(request.completed_at.is_some());
    let run = store.run(fence.run_id).await?.expect("run");
    assert_eq!(run.status, RunStatus::Completed);
    assert!(run.ended_at.is_some());
    let last = store.latest_checkpoint(fence.run_id).await?.expect("last");
    assert_eq!((last.turn, last.phase), (3, CheckpointPhase::Completed));
    assert!(matches!(
        store.recovery_usage(fence.request_id).await,
        Err(Error::NotActive { .. })
    ));
    Ok(())
}

pub async fn successive_commits_append_to_the_transcript_in_order(
    store: SharedStore,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let mut requests = Vec::new();
    let mut end = 0;
    for turns in 0..3u32 {
        let (fence, outcome) = complete_request(
            &*store,
            conversation,
            &format!("question {turns}"),
            turns,
            &format!("answer {turns}"),
        )
        .await?;
        assert_eq!(outcome.first_seq, end);
        assert_eq!(outcome.end_seq, end + 2 + 2 * u64::from(turns));
        assert_eq!(outcome.conversation_version, u64::from(turns) + 1);
        end = outcome.end_seq;
        requests.push((fence.request_id, outcome));
    }
    let transcript = store.transcript_window(conversation, u32::MAX).await?;
    assert_eq!(transcript.len() as u64, end);
    for (i, entry) in transcript.iter().enumerate() {
        assert_eq!(entry.seq, i as u64);
        let owner = requests
            .iter()
            .find(|(_, o)| (o.first_seq..o.end_seq).contains(&entry.seq))
            .expect("every entry belongs to a request");
        assert_eq!(entry.request_id, owner.0);
    }
    let admission = store.admission(conversation).await?;
    assert_eq!((admission.revision, admission.active), (Revision(6), None));
    assert_eq!(store.conversation(&ns(), conversation).await?.version, 3);
    Ok(())
}

/// A held request's messages are its own until its commit: no read of the
/// conversation's transcript shows them, a fork copies none, and an
/// abandon keeps them as the abandoned request's messages while the next
/// request's entries follow the committed ones.
pub async fn a_held_requests_messages_are_in_no_transcript_read_until_its_commit(
    store: SharedStore,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    complete_request(&*store, conversation, "first", 0, "first answer").await?;
    let committed = store.transcript_window(conversation, 100).await?;
    assert_eq!(committed.len(), 2);

    let held = admit(&*store, conversation, "second").await?;
    let count = tool_turn(&*store, &held, 1, 1, tool_call("c1", "{}"), "r1").await?;
    assert_eq!(
        store.request_messages(held.request_id, count).await?.len(),
        3
    );
    assert_eq!(store.transcript_window(conversation, 100).await?, committed);
    assert_eq!(
        store.transcript_range(conversation, 0, 100).await?,
        committed
    );
    assert!(store.transcript_range(conversation, 2, 5).await?.is_empty());
    // A fork takes the committed entries, and no further.
    let fork = store
        .fork_conversation(&ns(), conversation, 2, ConversationId::new())
        .await?;
    assert_eq!(fork.entries, 2);
    assert_eq!(
        store.transcript_window(fork.conversation_id, 100).await?,
        committed
    );
    assert!(matches!(
        store
            .fork_conversation(&ns(), conversation, 3, ConversationId::new())
            .await,
        Err(Error::InvalidInput(_))
    ));

    store
        .abandon(conversation, held.request_id, held.revision)
        .await?;
    assert_eq!(store.transcript_window(conversation, 100).await?, committed);
    let kept = store.request_messages(held.request_id, u64::MAX).await?;
    let roles: Vec<_> = kept.iter().map(Message::role).collect();
    assert_eq!(roles, ["user", "assistant", "tool"]);

    let (_, next) = complete_request(&*store, conversation, "third", 0, "third answer").await?;
    assert_eq!((next.first_seq, next.end_seq), (2, 4));
    let (_, forked) = complete_request(
        &*store,
        fork.conversation_id,
        "on the fork",
        0,
        "fork answer",
    )
    .await?;
    assert_eq!((forked.first_seq, forked.end_seq), (2, 4));
    let transcript = store.transcript_window(conversation, 100).await?;
    let texts: Vec<_> = transcript.iter().map(|e| e.message.text()).collect();
    assert_eq!(texts, ["first", "first answer", "third", "third answer"]);
    Ok(())
}

/// What the read API shows of one request's runs and checkpoints, without
/// ids and times: equal for two requests that went through the same steps.
#[derive(Debug, PartialEq)]
struct RunsSeen {
    runs: Vec<(RunStatus, Option<String>, bool, bool)>,
    checkpoints: Vec<Vec<(u32, CheckpointPhase, u64, u64)>>,
    latest: Vec<Option<(u32, CheckpointPhase)>>,
    outcome: Option<(u32, u64, u64)>,
}

/// The run's first turn begins: its write-ahead, one message so far.
async fn begin_turn_one(store: &dyn Store, fence: &Fence) -> Result<(), Error> {
    let first = checkpoint(fence.run_id, 1, CheckpointPhase::TurnInFlight, 1);
    store.begin_turn(fence, &first).await
}

/// A new request to claim a new conversation at its revision, not yet
/// claimed: its first run carries the request's id, as the engine's does,
/// or (`own_id`) an id of its own.
async fn request_in_a_new_conversation(
    store: &dyn Store,
    input: &str,
    own_id: bool,
) -> Result<NewRequest, Error> {
    let conversation = new_conversation(store).await?;
    let revision = store.admission(conversation).await?.revision;
    let mut claim = new_request(conversation, revision, input);
    if own_id {
        claim.run_id = RunId::new();
    }
    Ok(claim)
}

async fn runs_seen(
    store: &dyn Store,
    request: turnstile_core::RequestId,
    runs: &[RunId],
) -> Result<RunsSeen, Error> {
    let mut seen = RunsSeen {
        runs: Vec::new(),
        checkpoints: Vec::new(),
        latest: Vec::new(),
        outcome: store
            .request(request)
            .await?
            .and_then(|r| r.outcome)
            .map(|o| (o.turns, o.tool_calls, o.usage.input_tokens)),
    };
    for &run in runs {
        let record = store.run(run).await?.expect("run");
        assert_eq!(record.request_id, request);
        seen.runs.push((
            record.status,
            record.error,
            record.resumed_from.is_some(),
            record.ended_at.is_some(),
        ));
        let checkpoints = store.checkpoints(run).await?;
        seen.checkpoints.push(
            checkpoints
                .iter()
                .map(|c| (c.turn, c.phase, c.message_count, c.usage.input_tokens))
                .collect(),
        );
        seen.latest.push(
            store
                .latest_checkpoint(run)
                .await?
                .map(|c| (c.turn, c.phase)),
        );
    }
    Ok(seen)
}

/// A claim that starts its first turn now writes that turn's write-ahead
/// with the request, and the verification reports the checkpoint carries
/// for that turn: they read back the same whether the run carries the
/// request's id or one of its own, with or without a report (a store may
/// write the run or the reports with a statement of their own), and a
/// refused claim writes no request, run or checkpoint.
pub async fn a_claims_first_turn_and_its_reports_read_back_with_either_run_id(
    store: SharedStore,
) -> TestResult {
    for (own_id, reported) in [(false, false), (false, true), (true, false), (true, true)] {
        let case = format!("own id: {own_id}, a report: {reported}");
        let mut claim =
            request_in_a_new_conversation(&*store, "a turn that starts at once", own_id).await?;
        let mut first = checkpoint(claim.run_id, 1, CheckpointPhase::TurnInFlight, 1);
        if reported {
            first.verification_reports[0].detail = format!("checked before the model; {case}");
        } else {
            first.verification_reports.clear();
        }
        claim.first_turn = Some(first.clone());
        let fence = admitted(&*store, &claim).await?;

        let run = store.run(fence.run_id).await?.expect("the claim's run");
        assert_eq!(
            (run.request_id, run.status),
            (claim.request_id, RunStatus::Running),
            "{case}"
        );
        let checkpoints = store.checkpoints(fence.run_id).await?;
        let shape: Vec<_> = checkpoints
            .iter()
            .map(|c| (c.turn, c.phase, c.message_count, c.usage))
            .collect();
        assert_eq!(
            shape,
            vec![(1, CheckpointPhase::TurnInFlight, 1, usage_after(1))],
            "{case}"
        );
        assert_eq!(
            checkpoints[0].verification_reports, first.verification_reports,
            "{case}"
        );

        // A second request's claim at the same revision is busy.
        let mut rival = new_request(claim.conversation_id, claim.expected_revision, "too late");
        if own_id {
            rival.run_id = RunId::new();
        }
        rival.first_turn = Some(checkpoint(
            rival.run_id,
            1,
            CheckpointPhase::TurnInFlight,
            1,
        ));
        match store.claim(&rival).await {
            Err(Error::Busy { .. }) => {}
            other => panic!("expected Busy; {case}: got {other:?}"),
        }
        assert!(store.request(rival.request_id).await?.is_none(), "{case}");
        assert!(store.run(rival.run_id).await?.is_none(), "{case}");
        assert!(store.checkpoints(rival.run_id).await?.is_empty(), "{case}");
    }
    Ok(())
}

/// A commit with or without verification reports of its turn, at the
/// turn its run's row holds or at a later one (whose earlier checkpoint is
/// kept): the same outcome, checkpoints, transcript and one `committed`
/// event in every case (a store may commit the simplest with fewer tables
/// named than the others).
pub async fn a_commit_with_or_without_reports_or_an_earlier_turn_reads_back_the_same(
    store: SharedStore,
) -> TestResult {
    for (reported, later) in [(false, false), (true, false), (false, true), (true, true)] {
        let case = format!("reports: {reported}, a later turn: {later}");
        let conversation = new_conversation(&*store).await?;
        let fence = admit(&*store, conversation, "an answer at once").await?;
        let run = fence.run_id;
        begin_turn_one(&*store, &fence).await?;
        let turn = if later { 2 } else { 1 };
        let mut last = checkpoint(run, turn, CheckpointPhase::Completed, 2);
        if !reported {
            last.verification_reports.retain(|r| r.turn != turn);
        }
        let outcome = store
            .commit(&fence, &last, &Message::assistant("done"))
            .await?;
        assert_eq!(
            (outcome.turns, outcome.verification_reports.len()),
            (turn, last.verification_reports.len()),
            "{case}"
        );
        let stored = store
            .request(fence.request_id)
            .await?
            .and_then(|r| r.outcome)
            .expect("the stored outcome");
        assert_eq!(stored, outcome, "{case}");
        let shape: Vec<_> = store
            .checkpoints(run)
            .await?
            .iter()
            .map(|c| (c.turn, c.phase))
            .collect();
        let mut expected = vec![(1, CheckpointPhase::TurnInFlight)];
        if later {
            expected.push((2, CheckpointPhase::Completed));
        } else {
            expected[0].1 = CheckpointPhase::Completed;
        }
        assert_eq!(shape, expected, "{case}");
        let entries = store.transcript_range(conversation, 0, 10).await?;
        let texts: Vec<_> = entries.iter().map(|e| e.message.text()).collect();
        assert_eq!(texts, ["an answer at once", "done"], "{case}");
        let committed: Vec<_> = store
            .events_after(conversation, 0, u32::MAX)
            .await?
            .into_iter()
            .filter(|e| matches!(e.step, LoggedStep::Committed { .. }))
            .collect();
        assert_eq!(committed.len(), 1, "{case}");
    }
    Ok(())
}

/// A request's first run may carry the request's id (`RunId::first_of`, as
/// the engine's does; a store may keep it in the request's row) or an id of
/// its own: the same steps read back the same, through turns, a failure, a
/// recovery and the commit.
pub async fn a_first_run_with_the_requests_id_reads_as_one_with_its_own(
    store: SharedStore,
) -> TestResult {
    let mut seen = Vec::new();
    for own_id in [false, true] {
        let claim =
            request_in_a_new_conversation(&*store, "two turns, a crash, an answer", own_id).await?;
        let first = admitted(&*store, &claim).await?;
        assert_eq!(first.run_id == RunId::first_of(claim.request_id), !own_id);
        let mut count = 1;
        for turn in 1..=2 {
            let call = tool_call(&format!("call-{turn}"), "{}");
            count = tool_turn(&*store, &first, turn, count, call, "r").await?;
        }
        let during = runs_seen(&*store, claim.request_id, &[first.run_id]).await?;
        let shape: Vec<_> = during.checkpoints[0]
            .iter()
            .map(|c| (c.0, c.1, c.2))
            .collect();
        let ready = CheckpointPhase::Ready;
        assert_eq!(
            shape,
            vec![(1, ready, 3), (2, ready, 5)],
            "own id: {own_id}"
        );
        let settled = checkpoint(first.run_id, 2, CheckpointPhase::Ready, count);
        store
            .fail_run(&first, "the model went away", Some(&settled))
            .await?;
        let failed = runs_seen(&*store, claim.request_id, &[first.run_id]).await?;
        let second = recover(&*store, &first).await?;
        commit_answer(&*store, &second, 3, count, "done").await?;
        let done = runs_seen(&*store, claim.request_id, &[first.run_id, second.run_id]).await?;
        assert_eq!(
            done.runs,
            vec![
                (
                    RunStatus::Superseded,
                    Some("the model went away".into()),
                    false,
                    true
                ),
                (RunStatus::Completed, None, true, true),
            ]
        );
        assert_eq!(done.outcome, Some((3, 3, usage_after(3).input_tokens)));
        seen.push((during, failed, done));
    }
    assert_eq!(seen[0], seen[1]);

    // A commit below the run's latest turn (no engine writes one) leaves the
    // same checkpoints either way, with or without a report of its turn, and
    // the same refusal to read the outcome.
    let mut below = Vec::new();
    for (own_id, reported) in [(false, true), (true, true), (false, false), (true, false)] {
        let claim =
            request_in_a_new_conversation(&*store, "a commit below its turn", own_id).await?;
        let fence = admitted(&*store, &claim).await?;
        let run = fence.run_id;
        begin_turn_one(&*store, &fence).await?;
        let next = checkpoint(run, 2, CheckpointPhase::TurnInFlight, 1);
        store
            .finish_turn(
                &fence,
                &checkpoint(run, 1, CheckpointPhase::Ready, 1),
                &[],
                Some(&next),
            )
            .await?;
        let mut last = checkpoint(run, 1, CheckpointPhase::Ready, 2);
        if !reported {
            last.verification_reports.clear();
        }
        store
            .commit(&fence, &last, &Message::assistant("early"))
            .await?;
        let read = match store.request(claim.request_id).await {
            Err(Error::Corrupt { table, .. }) => Some(table),
            _ => None,
        };
        let checkpoints: Vec<_> = store
            .checkpoints(run)
            .await?
            .iter()
            .map(|c| (c.turn, c.phase))
            .collect();
        below.push((checkpoints, read));
    }
    assert!(below.iter().all(|b| *b == below[0]), "{below:?}");
    Ok(())
}

/// Strings a careless store would mangle, truncate or execute.
fn hostile_strings() -> Vec<String> {
    vec![
        String::new(),
        r#"it's "quoted" `back` \ backslash \" \\"#.into(),
        "'); DROP TABLE transcript; --".into(),
        "Robert'); DELETE FROM admissions WHERE (''='".into(),
        r#"{"role":"system","content":"json lookalike"}"#.into(),
        "$.id % _ ->> '$.name' ?1 :name @x".into(),
        "héllo wörld — 你好 🦀 👨‍👩‍👧 \u{202e}rtl\u{202c} \u{feff}bom".into(),
        "\t\r\n\u{1}\u{1b}[31mred\u{7f}\u{85}\u{2028}".into(),
        "nul\0inside\0".into(),
        "é🦀x".repeat(1 << 18), // 1.75 MiB of multi-byte text
    ]
}

/// The head of a string, for failure messages that stay readable.
fn short(s: &str) -> String {
    s.chars().take(60).collect()
}

pub async fn hostile_strings_round_trip_verbatim_through_commit(store: SharedStore) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let mut expected = Vec::new();
    for s in hostile_strings() {
        let fence = admit(&*store, conversation, &s).await?;
        let call = ToolCall {
            id: format!("id-{s}"),
            name: format!("name-{s}"),
            arguments: s.clone(),
            provider_metadata: None,
        };
        let count = tool_turn(&*store, &fence, 1, 1, call.clone(), &s).await?;
        let journal = store.journal(fence.request_id, 1).await?;
        assert_eq!(journal.len(), 1, "journal of {:?}", short(&s));
        assert_eq!(journal[0].call_id, call.id);
        assert_eq!(journal[0].name, call.name);
        let pending = store.request_messages(fence.request_id, count).await?;
        assert_eq!(
            pending[1].tool_calls(),
            std::slice::from_ref(&call),
            "call of {:?}",
            short(&s)
        );
        assert_eq!(pending[2].text(), s, "result of {:?}", short(&s));

        let outcome = commit_answer(&*store, &fence, 2, count, &s).await?;
        let last = store
            .transcript_range(fence.conversation_id, outcome.end_seq - 1, outcome.end_seq)
            .await?;
        assert_eq!(last[0].message.text(), s, "final answer of {:?}", short(&s));
        let request = store.request(fence.request_id).await?.expect("request");
        assert_eq!(request.input_sha256, InputHash::of(&s));
        assert_eq!(request.outcome, Some(outcome));

        expected.push(Message::user(s.clone()));
        expected.push(Message::assistant_with_calls(
            format!("calling {}", call.name),
            vec![call.clone()],
        ));
        expected.push(Message::tool(call.id, s.clone(), false));
        expected.push(Message::assistant(s));
    }
    let transcript = store.transcript_window(conversation, u32::MAX).await?;
    let messages: Vec<_> = transcript.into_iter().map(|e| e.message).collect();
    assert_eq!(messages.len(), expected.len());
    for (i, (got, want)) in messages.iter().zip(&expected).enumerate() {
        assert!(
            got == want,
            "message {i}: {:?} != {:?}",
            short(&got.text()),
            short(&want.text())
        );
    }
    let range = store.transcript_range(conversation, 0, u64::MAX).await?;
    assert!(range.into_iter().map(|e| e.message).eq(expected));
    Ok(())
}
