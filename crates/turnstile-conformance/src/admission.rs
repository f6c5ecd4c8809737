//! Conversations and ownership changes: claim, recovery claim, abandon.

use turnstile_core::store::{
    ClaimOutcome, InputHash, RecoveryClaim, RequestStatus, ResolvedRound, RunStatus,
};
use turnstile_core::{
    CheckpointPhase, ConversationId, Error, Message, Namespace, RequestId, Revision, RunId,
    ToolResult,
};

use crate::support::{
    admit, checkpoint, commit_answer, complete_request, new_conversation, new_request, ns, recover,
    recovery_of, tool_call, tool_turn, SharedStore, Snapshot, TestResult,
};

pub async fn ensure_conversation_is_idempotent_and_starts_idle(store: SharedStore) -> TestResult {
    let id = ConversationId::new();
    let created = store.ensure_conversation(&ns(), id).await?;
    assert_eq!((created.id, &created.namespace), (id, &ns()));
    assert_eq!(created.version, 0);
    let again = store.ensure_conversation(&ns(), id).await?;
    assert_eq!(again, created);
    assert_eq!(store.conversation(&ns(), id).await?, created);

    let admission = store.admission(id).await?;
    assert_eq!(admission.revision, Revision(0));
    assert_eq!(admission.active, None);
    assert!(store.transcript_window(id, 10).await?.is_empty());
    Ok(())
}

pub async fn conversation_in_another_namespace_is_a_namespace_mismatch(
    store: SharedStore,
) -> TestResult {
    let id = new_conversation(&*store).await?;
    let other = Namespace::new("someone-else")?;
    match store.conversation(&other, id).await {
        Err(Error::NamespaceMismatch {
            conversation_id,
            namespace,
        }) => assert_eq!((conversation_id, namespace), (id, other.clone())),
        other => panic!("expected NamespaceMismatch, got {other:?}"),
    }
    // Creating it again under another namespace does not take it over.
    assert!(matches!(
        store.ensure_conversation(&other, id).await,
        Err(Error::NamespaceMismatch { .. })
    ));
    assert_eq!(store.conversation(&ns(), id).await?.namespace, ns());
    Ok(())
}

/// `claim_context` agrees with the reads it stands for, in every state a
/// new request can meet, and decodes only what a claim would use.
pub async fn claim_context_reads_what_the_single_reads_read_and_only_what_a_claim_uses(
    store: SharedStore,
) -> TestResult {
    let unknown = RequestId::new();
    // No conversation yet.
    let missing = ConversationId::new();
    let context = store
        .claim_context(&ns(), missing, unknown, Some(10))
        .await?;
    assert_eq!(
        (context.conversation, context.request, context.admission),
        (None, None, None)
    );
    assert!(context.window.is_empty());

    // Idle, with a transcript of three committed requests (eight entries).
    // The last one has a tool turn, and text that must come back intact
    // whatever way the store carries the window (bidi, quotes,
    // backslashes, a line break, an emoji).
    let id = new_conversation(&*store).await?;
    let mut committed = Vec::new();
    let awkward = "bidi \u{202e}\u{2066} \"quoted\" back\\slash\nnext 😀";
    for i in 0..3 {
        let (input, turns, answer) = match i {
            2 => (format!("{awkward} q"), 1, format!("{awkward} a")),
            _ => (format!("q{i}"), 0, format!("a{i}")),
        };
        let (fence, _) = complete_request(&*store, id, &input, turns, &answer).await?;
        committed.push(fence.request_id);
    }
    let context = store.claim_context(&ns(), id, unknown, Some(4)).await?;
    assert_eq!(
        context.conversation,
        Some(store.conversation(&ns(), id).await?)
    );
    assert_eq!(context.request, None);
    assert_eq!(context.admission, Some(store.admission(id).await?));
    assert_eq!(context.window, store.transcript_window(id, 4).await?);
    assert_eq!(context.window.len(), 4);
    let texts: Vec<_> = context
        .window
        .iter()
        .map(|entry| entry.message.text())
        .collect();
    assert_eq!(
        texts.first().map(|t| t.as_ref()),
        Some(format!("{awkward} q").as_str())
    );
    assert_eq!(
        texts.last().map(|t| t.as_ref()),
        Some(format!("{awkward} a").as_str())
    );
    assert_eq!(
        context
            .window
            .iter()
            .map(|entry| entry.seq)
            .collect::<Vec<_>>(),
        vec![4, 5, 6, 7]
    );
    // Without a window, no entries.
    let context = store.claim_context(&ns(), id, unknown, None).await?;
    assert!(context.window.is_empty());
    assert_eq!(context.admission, Some(store.admission(id).await?));

    // A known request, of this conversation or of another one (from a
    // missing conversation too): its record, and nothing a claim uses.
    for conversation in [id, new_conversation(&*store).await?, missing] {
        let context = store
            .claim_context(&ns(), conversation, committed[1], Some(4))
            .await?;
        assert_eq!(context.request, store.request(committed[1]).await?);
        assert!(context.request.is_some());
        assert_eq!(context.admission, None);
        assert!(context.window.is_empty());
    }

    // Held: the admission with its holder, no entries.
    let held = admit(&*store, id, "held").await?;
    let context = store.claim_context(&ns(), id, unknown, Some(4)).await?;
    let admission = context.admission.expect("the admission");
    assert_eq!(admission, store.admission(id).await?);
    assert_eq!(
        admission.active.map(|a| a.request_id),
        Some(held.request_id)
    );
    assert!(context.window.is_empty());
    // The held request itself is a known request.
    let context = store
        .claim_context(&ns(), id, held.request_id, Some(4))
        .await?;
    assert_eq!(context.request, store.request(held.request_id).await?);

    // Another namespace: refused, whatever the request.
    let other = Namespace::new("someone-else")?;
    for request in [unknown, committed[0]] {
        match store.claim_context(&other, id, request, Some(4)).await {
            Err(Error::NamespaceMismatch {
                conversation_id,
                namespace,
            }) => assert_eq!((conversation_id, namespace), (id, other.clone())),
            other => panic!("expected NamespaceMismatch, got {other:?}"),
        }
    }
    Ok(())
}

pub async fn unknown_conversation_is_not_found(store: SharedStore) -> TestResult {
    let unknown = ConversationId::new();
    match store.conversation(&ns(), unknown).await {
        Err(Error::NotFound { id, .. }) => assert_eq!(id, unknown.to_string()),
        other => panic!("expected NotFound, got {other:?}"),
    }
    assert!(matches!(
        store.admission(unknown).await,
        Err(Error::NotFound { .. })
    ));
    Ok(())
}

pub async fn claim_on_idle_conversation_admits_and_bumps_revision(
    store: SharedStore,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let claim = new_request(conversation, Revision(0), "hello");
    let ClaimOutcome::Admitted(fence) = store.claim(&claim).await? else {
        panic!("a claim on an idle conversation must be admitted");
    };
    assert_eq!(fence.revision, Revision(1));
    assert_eq!(
        (fence.conversation_id, fence.request_id, fence.run_id),
        (conversation, claim.request_id, claim.run_id)
    );

    let admission = store.admission(conversation).await?;
    assert_eq!(admission.revision, Revision(1));
    let active = admission.active.expect("admission is held");
    assert_eq!(active.request_id, claim.request_id);
    assert_eq!(active.run_id, claim.run_id);
    assert_eq!(active.input_sha256, InputHash::of("hello"));
    assert_eq!(active.agent_fingerprint, "fp");

    let request = store.request(claim.request_id).await?.expect("request row");
    assert_eq!(request.status, RequestStatus::Active);
    assert_eq!(request.conversation_id, conversation);
    assert_eq!(request.outcome, None);
    let run = store.run(claim.run_id).await?.expect("run row");
    assert_eq!((run.status, run.resumed_from), (RunStatus::Running, None));

    // A run has no checkpoint before its first turn starts.
    assert_eq!(store.latest_checkpoint(claim.run_id).await?, None);
    assert_eq!(
        store.request_messages(claim.request_id, 10).await?,
        vec![Message::user("hello")]
    );
    // Nothing is committed until the request commits.
    assert_eq!(store.conversation(&ns(), conversation).await?.version, 0);
    assert!(store.transcript_window(conversation, 10).await?.is_empty());
    Ok(())
}

pub async fn second_claim_by_another_request_is_busy_with_current_holder(
    store: SharedStore,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let holder = admit(&*store, conversation, "first").await?;
    let before = Snapshot::take(&*store, conversation, &[holder.request_id], &[], 0).await?;

    for expected in [Revision(1), Revision(0)] {
        let second = new_request(conversation, expected, "second");
        match store.claim(&second).await {
            Err(Error::Busy {
                conversation_id,
                request_id,
                revision,
            }) => {
                assert_eq!(conversation_id, conversation);
                assert_eq!(request_id, holder.request_id);
                assert_eq!(revision, Revision(1));
            }
            other => panic!("expected Busy at revision {expected}, got {other:?}"),
        }
        assert_eq!(store.request(second.request_id).await?, None);
        assert_eq!(store.run(second.run_id).await?, None);
    }
    let after = Snapshot::take(&*store, conversation, &[holder.request_id], &[], 0).await?;
    assert_eq!(after, before);
    Ok(())
}

pub async fn same_request_claimed_again_returns_existing_and_writes_nothing(
    store: SharedStore,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let claim = new_request(conversation, Revision(0), "hello");
    assert!(matches!(
        store.claim(&claim).await?,
        ClaimOutcome::Admitted(_)
    ));
    let before = Snapshot::take(&*store, conversation, &[claim.request_id], &[], 0).await?;

    // The same request id, even at the current revision and with a new run.
    let retry = turnstile_core::store::NewRequest {
        expected_revision: Revision(1),
        run_id: RunId::new(),
        ..claim.clone()
    };
    match store.claim(&retry).await? {
        ClaimOutcome::Existing(record) => {
            assert_eq!(record.request_id, claim.request_id);
            assert_eq!(record.conversation_id, conversation);
            assert_eq!(record.input_sha256, InputHash::of("hello"));
            assert_eq!(record.status, RequestStatus::Active);
        }
        ClaimOutcome::Admitted(fence) => panic!("request admitted twice: {fence:?}"),
    }
    assert_eq!(store.run(retry.run_id).await?, None);
    let after = Snapshot::take(&*store, conversation, &[claim.request_id], &[], 0).await?;
    assert_eq!(after, before);
    Ok(())
}

pub async fn claim_with_stale_revision_conflicts_and_changes_nothing(
    store: SharedStore,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    // Revision 2 and idle: one request claimed and committed.
    let done = admit(&*store, conversation, "first").await?;
    commit_answer(&*store, &done, 1, 1, "answer").await?;
    let before = Snapshot::take(&*store, conversation, &[done.request_id], &[], 0).await?;
    assert_eq!(before.admission.revision, Revision(2));

    let stale = new_request(conversation, Revision(0), "late");
    match store.claim(&stale).await {
        Err(Error::Conflict {
            conversation_id,
            expected,
            actual,
        }) => assert_eq!(
            (conversation_id, expected, actual),
            (conversation, Revision(0), Revision(2))
        ),
        other => panic!("expected Conflict, got {other:?}"),
    }
    assert_eq!(store.request(stale.request_id).await?, None);
    assert_eq!(store.run(stale.run_id).await?, None);
    assert!(store.checkpoints(stale.run_id).await?.is_empty());
    let after = Snapshot::take(&*store, conversation, &[done.request_id], &[], 0).await?;
    assert_eq!(after, before);
    Ok(())
}

pub async fn recovery_claim_moves_admission_to_a_new_run(store: SharedStore) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let first = admit(&*store, conversation, "hello").await?;
    let count = tool_turn(&*store, &first, 1, 1, tool_call("c1", "{}"), "ok").await?;
    let last = store
        .latest_checkpoint(first.run_id)
        .await?
        .expect("turn 1");

    let second = recover(&*store, &first).await?;
    assert_eq!(second.revision, Revision(2));
    assert_eq!(second.request_id, first.request_id);
    assert_ne!(second.run_id, first.run_id);

    let admission = store.admission(conversation).await?;
    assert_eq!(admission.revision, Revision(2));
    let active = admission.active.expect("still held");
    assert_eq!(
        (active.request_id, active.run_id),
        (first.request_id, second.run_id)
    );

    let old = store.run(first.run_id).await?.expect("old run");
    assert_eq!(old.status, RunStatus::Superseded);
    let new = store.run(second.run_id).await?.expect("new run");
    assert_eq!(
        (new.status, new.resumed_from),
        (RunStatus::Running, Some(first.run_id))
    );

    // The new run starts from the old run's latest checkpoint, values intact.
    let seeded = store
        .latest_checkpoint(second.run_id)
        .await?
        .expect("seeded");
    assert_eq!(seeded.run_id, second.run_id);
    assert_eq!(
        (
            seeded.turn,
            seeded.phase,
            seeded.usage,
            seeded.tool_calls_count
        ),
        (last.turn, last.phase, last.usage, last.tool_calls_count)
    );
    assert_eq!(seeded.verification_reports, last.verification_reports);
    assert_eq!(seeded.message_count, count);
    // Pending messages belong to the request, not the run: none are copied.
    assert_eq!(
        store
            .request_messages(first.request_id, u64::MAX)
            .await?
            .len() as u64,
        count
    );
    assert_eq!(store.recovery_usage(first.request_id).await?, last.usage);
    Ok(())
}

pub async fn recovery_claim_with_stale_revision_conflicts_and_changes_nothing(
    store: SharedStore,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let first = admit(&*store, conversation, "hello").await?;
    let second = recover(&*store, &first).await?;
    let runs = [first.run_id, second.run_id];
    let before = Snapshot::take(&*store, conversation, &[first.request_id], &runs, 1).await?;

    // Revision 1 is stale: the admission moved to revision 2.
    let stale = RecoveryClaim {
        from_run: second.run_id,
        ..recovery_of(&first)
    };
    match store.claim_recovery(&stale).await {
        Err(Error::Conflict {
            expected, actual, ..
        }) => assert_eq!((expected, actual), (Revision(1), Revision(2))),
        other => panic!("expected Conflict, got {other:?}"),
    }
    assert_eq!(store.run(stale.new_run).await?, None);
    assert!(store.checkpoints(stale.new_run).await?.is_empty());
    let after = Snapshot::take(&*store, conversation, &[first.request_id], &runs, 1).await?;
    assert_eq!(after, before);
    Ok(())
}

pub async fn recovery_claim_refuses_a_turn_in_flight_unless_its_tool_round_is_resolved(
    store: SharedStore,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let first = admit(&*store, conversation, "hello").await?;
    let count = tool_turn(&*store, &first, 1, 1, tool_call("call-1", "{}"), "r1").await?;
    // Turn 2's tool round in flight: its model answer recorded, no result.
    let mut start = checkpoint(first.run_id, 1, CheckpointPhase::TurnInFlight, count);
    start.turn = 2;
    store.begin_turn(&first, &start).await?;
    let claim = |resolved: Option<(u32, u32)>, retry_model_call: bool| RecoveryClaim {
        reject_in_flight: true,
        resolved: resolved.map(|(turn, answered)| ResolvedRound { turn, answered }),
        retry_model_call,
        ..recovery_of(&first)
    };
    let runs = [first.run_id];
    let refused = |turn| {
        move |result: Result<_, Error>| match result {
            Err(Error::AmbiguousCheckpoint { run_id, turn: t }) => {
                assert_eq!((run_id, t), (first.run_id, turn))
            }
            other => panic!("expected AmbiguousCheckpoint, got {other:?}"),
        }
    };
    // A model call in flight is refused even for a resolved turn.
    let before = Snapshot::take(&*store, conversation, &[first.request_id], &runs, 2).await?;
    refused(2)(store.claim_recovery(&claim(Some((2, 0)), false)).await);
    let calls = vec![tool_call("call-2", "{}"), tool_call("call-3", "{}")];
    let assistant = Message::assistant_with_calls("", calls);
    let answered = checkpoint(first.run_id, 2, CheckpointPhase::ToolsInFlight, count);
    store
        .record_model_response(&first, &answered, &assistant)
        .await?;
    let result = ToolResult {
        content: "r2".into(),
        is_error: false,
    };
    store
        .record_tool_result(&first, 2, "call-2", &result)
        .await?;
    let before_round = Snapshot::take(&*store, conversation, &[first.request_id], &runs, 2).await?;
    assert_ne!(before_round, before);

    // The tool round, one call answered: refused unresolved, resolved at
    // another turn, or read with another number of answered calls (the
    // run being continued went on meanwhile), writing nothing; claimed
    // when resolved as it is.
    refused(2)(store.claim_recovery(&claim(None, false)).await);
    refused(2)(store.claim_recovery(&claim(None, true)).await);
    refused(2)(store.claim_recovery(&claim(Some((1, 1)), false)).await);
    refused(2)(store.claim_recovery(&claim(Some((2, 0)), false)).await);
    let after = Snapshot::take(&*store, conversation, &[first.request_id], &runs, 2).await?;
    assert_eq!(after, before_round);
    let resolved = claim(Some((2, 1)), false);
    let fence = store.claim_recovery(&resolved).await?;
    assert_eq!(fence.run_id, resolved.new_run);
    assert_eq!(fence.revision, Revision(first.revision.0 + 1));
    let latest = store
        .latest_checkpoint(fence.run_id)
        .await?
        .expect("copied");
    assert_eq!(
        (latest.turn, latest.phase),
        (2, CheckpointPhase::ToolsInFlight)
    );
    Ok(())
}

/// A claim that may retry a model call takes over a turn whose model call
/// was in flight, copying its write-ahead checkpoint (a tool round in
/// flight stays refused: above).
pub async fn recovery_claim_that_retries_a_model_call_takes_a_turn_in_flight(
    store: SharedStore,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let first = admit(&*store, conversation, "hello").await?;
    let count = tool_turn(&*store, &first, 1, 1, tool_call("call-1", "{}"), "r1").await?;
    let mut start = checkpoint(first.run_id, 1, CheckpointPhase::TurnInFlight, count);
    start.turn = 2;
    store.begin_turn(&first, &start).await?;
    let claim = |retry_model_call| RecoveryClaim {
        reject_in_flight: true,
        retry_model_call,
        ..recovery_of(&first)
    };
    assert!(matches!(
        store.claim_recovery(&claim(false)).await,
        Err(Error::AmbiguousCheckpoint { turn: 2, .. })
    ));
    let retried = claim(true);
    let fence = store.claim_recovery(&retried).await?;
    assert_eq!(
        (fence.run_id, fence.revision),
        (retried.new_run, Revision(first.revision.0 + 1))
    );
    let latest = store
        .latest_checkpoint(fence.run_id)
        .await?
        .expect("copied");
    assert_eq!(
        (latest.turn, latest.phase),
        (2, CheckpointPhase::TurnInFlight)
    );
    Ok(())
}

pub async fn abandon_with_stale_revision_is_refused_and_changes_nothing(
    store: SharedStore,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let first = admit(&*store, conversation, "hello").await?;
    let second = recover(&*store, &first).await?;
    let runs = [first.run_id, second.run_id];
    let before = Snapshot::take(&*store, conversation, &[first.request_id], &runs, 1).await?;

    match store
        .abandon(conversation, first.request_id, first.revision)
        .await
    {
        Err(Error::Conflict {
            expected, actual, ..
        }) => assert_eq!((expected, actual), (Revision(1), Revision(2))),
        other => panic!("expected Conflict, got {other:?}"),
    }
    let after = Snapshot::take(&*store, conversation, &[first.request_id], &runs, 1).await?;
    assert_eq!(after, before);
    Ok(())
}

pub async fn abandon_releases_admission_and_burns_request(store: SharedStore) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let claim = new_request(conversation, Revision(0), "hello");
    let ClaimOutcome::Admitted(fence) = store.claim(&claim).await? else {
        panic!("expected admission");
    };
    let released = store
        .abandon(conversation, fence.request_id, fence.revision)
        .await?;
    assert_eq!(released, Revision(2));
    let admission = store.admission(conversation).await?;
    assert_eq!((admission.revision, admission.active), (Revision(2), None));

    let request = store.request(fence.request_id).await?.expect("request");
    assert_eq!(
        (request.status, request.outcome),
        (RequestStatus::Abandoned, None)
    );
    assert!(request.completed_at.is_some());
    let run = store.run(fence.run_id).await?.expect("run");
    assert_eq!(run.status, RunStatus::Abandoned);
    assert_eq!(store.conversation(&ns(), conversation).await?.version, 0);
    assert!(store.transcript_window(conversation, 10).await?.is_empty());
    assert!(matches!(
        store.recovery_usage(fence.request_id).await,
        Err(Error::NotActive { .. })
    ));

    // The id is burned: claiming it again reports the abandoned request.
    let retry = turnstile_core::store::NewRequest {
        expected_revision: Revision(2),
        ..claim
    };
    match store.claim(&retry).await? {
        ClaimOutcome::Existing(record) => assert_eq!(record.status, RequestStatus::Abandoned),
        ClaimOutcome::Admitted(_) => panic!("an abandoned request id was admitted again"),
    }
    // The conversation is free for the next request.
    let next = admit(&*store, conversation, "next").await?;
    assert_eq!(next.revision, Revision(3));
    Ok(())
}
