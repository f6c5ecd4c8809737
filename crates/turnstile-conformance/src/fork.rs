//! Forking a conversation: the new one holds a prefix of the committed
//! history (and the latest summary within it), the source is untouched, a
//! cut inside a tool round is refused, and both go on independently.

use turnstile_core::store::{SummaryCommit, SummaryPass};
use turnstile_core::{ConversationId, Error, Namespace, Revision, Usage};

use crate::support::{admit, complete_request, new_conversation, ns, SharedStore, TestResult};

fn assert_invalid<T: std::fmt::Debug>(result: Result<T, Error>, what: &str) {
    assert!(
        matches!(result, Err(Error::InvalidInput(_))),
        "{what}: expected InvalidInput, got {result:?}"
    );
}

/// A conversation of two requests: one with a tool round (user, assistant
/// calling a tool, the tool's result, answer: seqs 0..=3) and one without
/// (user, answer: seqs 4, 5).
async fn two_requests(store: &SharedStore) -> Result<ConversationId, Error> {
    let conversation = new_conversation(&**store).await?;
    complete_request(&**store, conversation, "first", 1, "first answer").await?;
    complete_request(&**store, conversation, "second", 0, "second answer").await?;
    Ok(conversation)
}

pub async fn fork_at_every_boundary_copies_the_prefix_or_refuses_a_cut_inside_a_tool_round(
    store: SharedStore,
) -> TestResult {
    let source = two_requests(&store).await?;
    let history = store.transcript_window(source, u32::MAX).await?;
    assert_eq!(history.len(), 6);
    let source_before = store.conversation(&ns(), source).await?;
    let admission_before = store.admission(source).await?;
    // Through 0 keeps nothing, 2 cuts after the tool call, 7 is past the end.
    for through in 0..=7u64 {
        let new_id = ConversationId::new();
        let forked = store
            .fork_conversation(&ns(), source, through, new_id)
            .await;
        match through {
            0 | 2 | 7 => {
                assert_invalid(forked, &format!("through {through}"));
                assert!(matches!(
                    store.conversation(&ns(), new_id).await,
                    Err(Error::NotFound { .. })
                ));
            }
            _ => {
                let outcome = forked?;
                assert_eq!(
                    (outcome.conversation_id, outcome.entries),
                    (new_id, through)
                );
                let copied = store.transcript_window(new_id, u32::MAX).await?;
                assert_eq!(
                    copied,
                    history[..through as usize].to_vec(),
                    "through {through}"
                );
                let fork = store.conversation(&ns(), new_id).await?;
                // One request's entries, or some of the second's too.
                let version = if through <= 4 { 1 } else { 2 };
                assert_eq!(fork.version, version, "through {through}");
                let admission = store.admission(new_id).await?;
                assert_eq!((admission.revision, admission.active), (Revision(0), None));
            }
        }
    }
    assert_eq!(store.transcript_window(source, u32::MAX).await?, history);
    assert_eq!(store.conversation(&ns(), source).await?, source_before);
    assert_eq!(store.admission(source).await?, admission_before);
    Ok(())
}

pub async fn fork_to_a_taken_id_or_from_a_missing_conversation_is_refused(
    store: SharedStore,
) -> TestResult {
    let source = two_requests(&store).await?;
    let taken = new_conversation(&*store).await?;
    assert_invalid(
        store.fork_conversation(&ns(), source, 4, taken).await,
        "an existing id",
    );
    assert_invalid(
        store.fork_conversation(&ns(), source, 4, source).await,
        "its own id",
    );
    assert!(store.transcript_window(taken, u32::MAX).await?.is_empty());
    let deleted = two_requests(&store).await?;
    store.delete_conversation(&ns(), deleted, 2, None).await?;
    assert!(matches!(
        store.fork_conversation(&ns(), source, 4, deleted).await,
        Err(Error::Deleted { conversation_id }) if conversation_id == deleted
    ));
    assert!(matches!(
        store
            .fork_conversation(&ns(), deleted, 4, ConversationId::new())
            .await,
        Err(Error::Deleted { conversation_id }) if conversation_id == deleted
    ));
    assert!(matches!(
        store
            .fork_conversation(&ns(), ConversationId::new(), 1, ConversationId::new())
            .await,
        Err(Error::NotFound { .. })
    ));
    let elsewhere = Namespace::new("elsewhere")?;
    assert!(matches!(
        store
            .fork_conversation(&elsewhere, source, 4, ConversationId::new())
            .await,
        Err(Error::NamespaceMismatch { .. })
    ));
    Ok(())
}

pub async fn fork_of_a_busy_conversation_copies_its_committed_history_and_the_latest_summary_within_the_cut(
    store: SharedStore,
) -> TestResult {
    let source = two_requests(&store).await?;
    let holder = admit(&*store, source, "third").await?;
    let pass = |from, through| SummaryPass {
        from_seq: from,
        through_seq: through,
        transcript_version: 2,
        prompt_sha256: [3; 32],
    };
    for (from, through) in [(0, 1), (2, 3)] {
        store
            .record_summary_pass(&holder, &pass(from, through))
            .await?;
        store
            .commit_summary(
                &holder,
                &SummaryCommit {
                    pass: pass(from, through),
                    content: format!("S[{from}-{through}]"),
                    usage: Usage::default(),
                },
            )
            .await?;
    }
    // Through 4 keeps seqs 0..=3: the summary through 3 is within it.
    let wide = ConversationId::new();
    store.fork_conversation(&ns(), source, 4, wide).await?;
    let summary = store.latest_summary(wide).await?.expect("a summary");
    assert_eq!(
        (
            summary.from_seq,
            summary.through_seq,
            summary.content.as_str()
        ),
        (2, 3, "S[2-3]")
    );
    // Through 3 keeps seqs 0..=2: only the summary through 1 fits.
    let narrow = ConversationId::new();
    store.fork_conversation(&ns(), source, 3, narrow).await?;
    let summary = store.latest_summary(narrow).await?.expect("a summary");
    assert_eq!(
        (summary.through_seq, summary.content.as_str()),
        (1, "S[0-1]")
    );
    // Through 1 keeps seq 0: no summary fits.
    let first = ConversationId::new();
    store.fork_conversation(&ns(), source, 1, first).await?;
    assert_eq!(store.latest_summary(first).await?, None);
    // The source still holds its request and its summaries.
    let admission = store.admission(source).await?;
    assert_eq!(admission.revision, holder.revision);
    assert_eq!(
        store.latest_summary(source).await?.map(|s| s.through_seq),
        Some(3)
    );
    Ok(())
}

pub async fn a_fork_and_its_source_take_requests_independently(store: SharedStore) -> TestResult {
    let source = two_requests(&store).await?;
    let fork = ConversationId::new();
    store.fork_conversation(&ns(), source, 4, fork).await?;
    complete_request(&*store, source, "on the source", 0, "source answer").await?;
    complete_request(&*store, fork, "on the fork", 1, "fork answer").await?;
    let source_history = store.transcript_window(source, u32::MAX).await?;
    let fork_history = store.transcript_window(fork, u32::MAX).await?;
    assert_eq!(source_history.len(), 8);
    assert_eq!(fork_history.len(), 8);
    assert_eq!(source_history[..4], fork_history[..4]);
    assert_ne!(source_history[4..], fork_history[4..]);
    assert_eq!(store.conversation(&ns(), source).await?.version, 3);
    assert_eq!(store.conversation(&ns(), fork).await?.version, 2);
    // Deleting the source leaves the fork whole.
    store.delete_conversation(&ns(), source, 3, None).await?;
    assert_eq!(store.transcript_window(fork, u32::MAX).await?, fork_history);
    Ok(())
}
