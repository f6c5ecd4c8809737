//! Summaries: a pass is recorded in the admission before its model call and
//! committed with its summary row, both fenced by the owner's revision and
//! guarded by the transcript (the conversation version the pass read, the
//! summary chain it extends, the pass in flight). A commit whose
//! acknowledgement was lost is recognised when it is sent again.
//!
//! Through the public API the conversation version only moves when the
//! holder commits, which ends its ownership: a version that moves *under* a
//! recorded pass needs a write behind the store's back (the SQLite tests
//! do that). Here the stale version is the pass's own.

use turnstile_core::store::{Fence, StoredSummary, SummaryCommit, SummaryPass, SummaryProgress};
use turnstile_core::{ConversationId, Error, Revision, Usage};

use crate::support::{
    admit, commit_answer, complete_request, new_conversation, recover, SharedStore, Snapshot,
    TestResult,
};

/// What every pass's model call costs.
fn pass_cost() -> Usage {
    Usage {
        input_tokens: 100,
        output_tokens: 20,
        cache_read_tokens: 3,
        cache_write_tokens: 4,
    }
}

/// A pass over entries `from..=through` read at conversation `version`.
fn pass(from: u64, through: u64, version: u64) -> SummaryPass {
    SummaryPass {
        from_seq: from,
        through_seq: through,
        transcript_version: version,
        prompt_sha256: [7; 32],
    }
}

/// The commit of `pass` with the summary `S[from-through]`.
fn commit_of(pass: &SummaryPass) -> SummaryCommit {
    SummaryCommit {
        pass: pass.clone(),
        content: format!("S[{}-{}]", pass.from_seq, pass.through_seq),
        usage: pass_cost(),
    }
}

/// A conversation with `requests` committed requests of two entries each
/// (its version is `requests`), and a fence of a new request holding it.
async fn held_with_entries(store: &SharedStore, requests: u32) -> Result<Fence, Error> {
    let conversation = new_conversation(&**store).await?;
    for i in 0..requests {
        complete_request(
            &**store,
            conversation,
            &format!("question {i}"),
            0,
            &format!("answer {i}"),
        )
        .await?;
    }
    admit(&**store, conversation, "summarize first").await
}

/// The summary progress of the request holding `conversation`.
async fn progress(store: &SharedStore, conversation: ConversationId) -> SummaryProgress {
    store
        .admission(conversation)
        .await
        .expect("read the admission")
        .active
        .expect("held admission")
        .summary
}

/// Everything observable about the held conversation and `runs` of its
/// request, its summaries included.
async fn state_of(
    store: &SharedStore,
    fence: &Fence,
    runs: &[turnstile_core::RunId],
) -> Result<(Snapshot, Option<StoredSummary>), Error> {
    let conversation = fence.conversation_id;
    let snapshot = Snapshot::take(&**store, conversation, &[fence.request_id], runs, 1).await?;
    Ok((snapshot, store.latest_summary(conversation).await?))
}

/// [`state_of`] the fence's own run.
async fn state(
    store: &SharedStore,
    fence: &Fence,
) -> Result<(Snapshot, Option<StoredSummary>), Error> {
    state_of(store, fence, &[fence.run_id]).await
}

fn assert_conflict<T: std::fmt::Debug>(
    result: Result<T, Error>,
    fence: &Fence,
    versions: (u64, u64),
    what: &str,
) {
    match result {
        Err(Error::Conflict {
            conversation_id,
            expected,
            actual,
        }) => assert_eq!(
            (conversation_id, expected, actual),
            (
                fence.conversation_id,
                Revision(versions.0),
                Revision(versions.1)
            ),
            "{what}: the conflict names the versions the pass read and found"
        ),
        other => panic!("{what}: expected Conflict, got {other:?}"),
    }
}

fn assert_fenced<T: std::fmt::Debug>(result: Result<T, Error>, fence: &Fence, what: &str) {
    match result {
        Err(Error::Fenced { run_id, revision }) => {
            assert_eq!((run_id, revision), (fence.run_id, fence.revision), "{what}");
        }
        other => panic!("{what}: expected Fenced, got {other:?}"),
    }
}

pub async fn summary_pass_that_does_not_fit_the_transcript_conflicts_and_changes_nothing(
    store: SharedStore,
) -> TestResult {
    // Entries 0..=3, conversation version 2.
    let fence = held_with_entries(&store, 2).await?;
    let before = state(&store, &fence).await?;
    assert_eq!(before.1, None);
    let good = pass(0, 3, 2);

    let refused = [
        (pass(0, 3, 1), (1, 2), "a stale conversation version"),
        (
            pass(0, 3, 3),
            (3, 2),
            "a version the conversation never had",
        ),
        (pass(1, 3, 2), (2, 2), "not right after the latest summary"),
        (pass(0, 4, 2), (2, 2), "past the end of the transcript"),
    ];
    for (bad, versions, what) in &refused {
        assert_conflict(
            store.record_summary_pass(&fence, bad).await,
            &fence,
            *versions,
            what,
        );
        assert_eq!(state(&store, &fence).await?, before, "{what}");
    }
    // No pass in flight: there is nothing to commit.
    assert_conflict(
        store.commit_summary(&fence, &commit_of(&good)).await,
        &fence,
        (2, 2),
        "commit without a recorded pass",
    );
    assert_eq!(state(&store, &fence).await?, before);
    assert_eq!(
        progress(&store, fence.conversation_id).await,
        SummaryProgress::default()
    );

    // The pass that fits is recorded; recording it again is a no-op.
    store.record_summary_pass(&fence, &good).await?;
    store.record_summary_pass(&fence, &good).await?;
    let recorded = SummaryProgress {
        passes: 0,
        pending: Some(good.clone()),
    };
    assert_eq!(progress(&store, fence.conversation_id).await, recorded);
    // Another pass while one is in flight is refused, a shorter one or the
    // same range with another prompt.
    let shorter = pass(0, 2, 2);
    let other_prompt = SummaryPass {
        prompt_sha256: [8; 32],
        ..good.clone()
    };
    for other in [shorter, other_prompt] {
        assert_conflict(
            store.record_summary_pass(&fence, &other).await,
            &fence,
            (2, 2),
            "a second pass in flight",
        );
        assert_eq!(progress(&store, fence.conversation_id).await, recorded);
    }
    assert_eq!(store.latest_summary(fence.conversation_id).await?, None);
    Ok(())
}

pub async fn summary_commit_at_a_stale_version_or_for_another_pass_conflicts_and_changes_nothing(
    store: SharedStore,
) -> TestResult {
    let fence = held_with_entries(&store, 2).await?;
    let recorded = pass(0, 3, 2);
    store.record_summary_pass(&fence, &recorded).await?;
    let before = state(&store, &fence).await?;

    let refused = [
        (pass(0, 3, 1), (1, 2), "a stale conversation version"),
        (
            pass(0, 2, 2),
            (2, 2),
            "a shorter range than the pass in flight",
        ),
        (
            SummaryPass {
                prompt_sha256: [8; 32],
                ..recorded.clone()
            },
            (2, 2),
            "another prompt than the pass in flight",
        ),
    ];
    for (bad, versions, what) in &refused {
        assert_conflict(
            store.commit_summary(&fence, &commit_of(bad)).await,
            &fence,
            *versions,
            what,
        );
        let after = state(&store, &fence).await?;
        assert_eq!(after, before, "{what}");
        assert_eq!(after.1, None, "{what}: no summary row");
        let active = after.0.admission.active.expect("held");
        assert_eq!(active.summary.pending.as_ref(), Some(&recorded), "{what}");
        assert_eq!(
            (active.summary.passes, active.usage),
            (0, Usage::default()),
            "{what}: nothing counted"
        );
    }

    // The pass in flight still commits.
    let summary = store.commit_summary(&fence, &commit_of(&recorded)).await?;
    assert_eq!(
        (summary.conversation_id, summary.request_id),
        (fence.conversation_id, fence.request_id)
    );
    assert_eq!(
        (
            summary.from_seq,
            summary.through_seq,
            summary.made_from_version
        ),
        (0, 3, 2)
    );
    assert_eq!(
        (summary.content.as_str(), summary.usage),
        ("S[0-3]", pass_cost())
    );
    Ok(())
}

pub async fn summary_commit_counts_once_and_a_repeat_after_a_lost_acknowledgement_returns_the_stored_row(
    store: SharedStore,
) -> TestResult {
    let fence = held_with_entries(&store, 2).await?;
    let conversation = fence.conversation_id;
    let recorded = pass(0, 3, 2);
    store.record_summary_pass(&fence, &recorded).await?;
    let commit = commit_of(&recorded);
    let first = store.commit_summary(&fence, &commit).await?;
    let committed = store.admission(conversation).await?.active.expect("held");
    assert_eq!(
        committed.summary,
        SummaryProgress {
            passes: 1,
            pending: None
        }
    );
    assert_eq!(committed.usage, pass_cost(), "the pass's usage is counted");
    assert_eq!(
        store.latest_summary(conversation).await?,
        Some(first.clone())
    );

    // The same commit again, as a caller whose acknowledgement was lost
    // sends it: the stored row, nothing written.
    let before = state(&store, &fence).await?;
    let again = store.commit_summary(&fence, &commit).await?;
    assert_eq!(again, first);
    assert_eq!(state(&store, &fence).await?, before);
    assert_eq!(store.recovery_usage(fence.request_id).await?, pass_cost());

    // The owner died before it saw the acknowledgement; its recovery
    // commits the same pass and gets the same row, still counted once.
    let owner = recover(&*store, &fence).await?;
    let recovered = store.commit_summary(&owner, &commit).await?;
    assert_eq!(recovered, first);
    let active = store.admission(conversation).await?.active.expect("held");
    assert_eq!(active.run_id, owner.run_id);
    assert_eq!((active.summary.passes, active.usage), (1, pass_cost()));
    assert_eq!(
        store.latest_summary(conversation).await?,
        Some(first.clone())
    );

    // Another request committing the same range is refused: there is
    // never a second row for it.
    commit_answer(&*store, &owner, 1, 1, "answer").await?;
    let next = admit(&*store, conversation, "next").await?;
    assert_conflict(
        store.commit_summary(&next, &commit).await,
        &next,
        (2, 3),
        "the same range committed by another request",
    );
    assert_eq!(store.latest_summary(conversation).await?, Some(first));
    let active = store.admission(conversation).await?.active.expect("held");
    assert_eq!(
        (active.summary, active.usage),
        (SummaryProgress::default(), Usage::default())
    );
    Ok(())
}

pub async fn summary_writes_of_a_replaced_owner_are_fenced_and_write_nothing(
    store: SharedStore,
) -> TestResult {
    // Entries 0..=5, version 3: room for two passes.
    let zombie = held_with_entries(&store, 3).await?;
    let conversation = zombie.conversation_id;
    let first = pass(0, 3, 3);
    store.record_summary_pass(&zombie, &first).await?;
    let owner = recover(&*store, &zombie).await?;
    let runs = [zombie.run_id, owner.run_id];
    let before = state_of(&store, &zombie, &runs).await?;
    // The recovery keeps the pass in flight.
    assert_eq!(
        progress(&store, conversation).await,
        SummaryProgress {
            passes: 0,
            pending: Some(first.clone())
        }
    );

    assert_fenced(
        store.record_summary_pass(&zombie, &first).await,
        &zombie,
        "the zombie records its pass again",
    );
    assert_fenced(
        store.commit_summary(&zombie, &commit_of(&first)).await,
        &zombie,
        "the zombie commits its pass",
    );
    // A fence with the current revision but the replaced run is no owner.
    let stolen = Fence {
        revision: owner.revision,
        ..zombie
    };
    assert_fenced(
        store.commit_summary(&stolen, &commit_of(&first)).await,
        &stolen,
        "current revision, replaced run",
    );
    let after = state_of(&store, &zombie, &runs).await?;
    assert_eq!(after, before);
    assert_eq!(after.1, None, "no summary row");

    // The owner commits the pass; the zombie is fenced even for the row it
    // would otherwise be handed back.
    let summary = store.commit_summary(&owner, &commit_of(&first)).await?;
    assert_eq!(summary.request_id, owner.request_id);
    let committed = state_of(&store, &zombie, &runs).await?;
    assert_fenced(
        store.commit_summary(&zombie, &commit_of(&first)).await,
        &zombie,
        "the zombie repeats the committed pass",
    );
    let second = pass(4, 5, 3);
    assert_fenced(
        store.record_summary_pass(&zombie, &second).await,
        &zombie,
        "the zombie records the next pass",
    );
    assert_eq!(state_of(&store, &zombie, &runs).await?, committed);
    assert_eq!(
        progress(&store, conversation).await,
        SummaryProgress {
            passes: 1,
            pending: None
        }
    );
    // The same next pass is the owner's to record.
    store.record_summary_pass(&owner, &second).await?;
    assert_eq!(
        progress(&store, conversation).await.pending,
        Some(second.clone())
    );
    Ok(())
}

pub async fn latest_summary_is_the_newest_with_its_through_seq(store: SharedStore) -> TestResult {
    // Entries 0..=7, version 4.
    let fence = held_with_entries(&store, 4).await?;
    let conversation = fence.conversation_id;
    let elsewhere = held_with_entries(&store, 1).await?;
    assert_eq!(store.latest_summary(conversation).await?, None);

    let first = pass(0, 3, 4);
    store.record_summary_pass(&fence, &first).await?;
    let s1 = store.commit_summary(&fence, &commit_of(&first)).await?;
    assert_eq!(store.latest_summary(conversation).await?, Some(s1.clone()));
    // The chain goes on right after the latest summary, not from 0 again.
    assert_conflict(
        store.record_summary_pass(&fence, &pass(0, 5, 4)).await,
        &fence,
        (4, 4),
        "a pass that does not start after the latest summary",
    );
    let second = pass(4, 7, 4);
    store.record_summary_pass(&fence, &second).await?;
    let s2 = store.commit_summary(&fence, &commit_of(&second)).await?;
    assert_ne!(s2.id, s1.id);
    let latest = store.latest_summary(conversation).await?.expect("summary");
    assert_eq!(latest, s2);
    assert_eq!(
        (latest.from_seq, latest.through_seq, latest.content.as_str()),
        (4, 7, "S[4-7]")
    );
    assert_eq!(
        progress(&store, conversation).await,
        SummaryProgress {
            passes: 2,
            pending: None
        }
    );

    // The summaries outlive the request that made them; the next request
    // extends the newest one. Its commit added entries 8 and 9 (version 5).
    commit_answer(&*store, &fence, 1, 1, "answer").await?;
    assert_eq!(store.latest_summary(conversation).await?, Some(s2.clone()));
    let next = admit(&*store, conversation, "next").await?;
    assert_conflict(
        store.record_summary_pass(&next, &pass(4, 9, 5)).await,
        &next,
        (5, 5),
        "a pass over entries already summarized",
    );
    let third = pass(8, 9, 5);
    store.record_summary_pass(&next, &third).await?;
    let s3 = store.commit_summary(&next, &commit_of(&third)).await?;
    let latest = store.latest_summary(conversation).await?.expect("summary");
    assert_eq!(latest, s3);
    assert_eq!(
        (
            latest.through_seq,
            latest.request_id,
            latest.made_from_version
        ),
        (9, next.request_id, 5)
    );
    // Another conversation's summaries are its own.
    assert_eq!(store.latest_summary(elsewhere.conversation_id).await?, None);
    Ok(())
}

pub async fn abandon_clears_the_pass_in_flight_and_keeps_the_committed_summaries(
    store: SharedStore,
) -> TestResult {
    let fence = held_with_entries(&store, 3).await?;
    let conversation = fence.conversation_id;
    let first = pass(0, 3, 3);
    store.record_summary_pass(&fence, &first).await?;
    let s1 = store.commit_summary(&fence, &commit_of(&first)).await?;
    let second = pass(4, 5, 3);
    store.record_summary_pass(&fence, &second).await?;
    let released = store
        .abandon(conversation, fence.request_id, fence.revision)
        .await?;
    assert_eq!(store.latest_summary(conversation).await?, Some(s1.clone()));

    // The next request starts with no progress and no usage, and may record
    // another pass over the range the abandoned one left in flight.
    let next = admit(&*store, conversation, "next").await?;
    assert_eq!(next.revision, Revision(released.0 + 1));
    let active = store.admission(conversation).await?.active.expect("held");
    assert_eq!(
        (active.summary, active.usage),
        (SummaryProgress::default(), Usage::default())
    );
    let other = SummaryPass {
        prompt_sha256: [9; 32],
        ..second
    };
    store.record_summary_pass(&next, &other).await?;
    let s2 = store.commit_summary(&next, &commit_of(&other)).await?;
    assert_eq!((s2.request_id, s2.through_seq), (next.request_id, 5));
    assert_eq!(store.latest_summary(conversation).await?, Some(s2));
    Ok(())
}
