//! Images and files: their bytes come back exactly, are stored once
//! however many messages (and forks) name them, are read only when asked
//! for, and go in the same transaction as their last reference.

use std::time::Duration;

use turnstile_core::admin::PruneOptions;
use turnstile_core::store::{ClaimOutcome, NewRequest, ToolResult};
use turnstile_core::{
    Attachment, BlobHash, CheckpointPhase, ConversationId, Error, Message, Part, Revision,
    StoreAdmin,
};

use crate::activity::SharedAdmin;
use crate::admin::tick;
use crate::support::*;

/// Bytes no text encoding would keep: every byte value, repeated.
fn arbitrary(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

fn image(bytes: Vec<u8>) -> Attachment {
    Attachment::new("image/png", bytes).expect("a media type")
}

/// Stored images and files, and their bytes in all, as the doctor counts;
/// none of them unreferenced (the doctor reads the rows, not the counts).
async fn stored_blobs(store: &dyn StoreAdmin) -> Result<(u64, u64), Error> {
    let report = store.doctor(Duration::from_secs(60)).await?;
    assert_eq!(report.unreferenced_blobs, Some(0), "{report:?}");
    Ok((
        report.blobs.expect("blobs counted"),
        report.blob_bytes.expect("blob bytes counted"),
    ))
}

/// A request of `parts` answered with `answer`, committed.
async fn commit_parts(
    store: &dyn StoreAdmin,
    conversation: ConversationId,
    parts: Vec<Part>,
    answer: Message,
) -> Result<(), Error> {
    let revision = store.admission(conversation).await?.revision;
    let mut claim = new_request(conversation, revision, "parts");
    claim.input = Message::user_parts(parts);
    let fence = admitted(store, &claim).await?;
    let last = checkpoint(fence.run_id, 1, CheckpointPhase::Ready, 2);
    store.commit(&fence, &last, &answer).await?;
    Ok(())
}

async fn assert_loads(store: &dyn StoreAdmin, attachment: &Attachment, bytes: &[u8]) -> TestResult {
    let loaded = store.blob(attachment.sha256()).await?;
    assert_eq!(loaded.as_deref(), Some(bytes), "{attachment:?}");
    Ok(())
}

pub async fn images_and_files_round_trip_exactly_and_reads_leave_their_bytes_unread(
    store: SharedAdmin,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let big = arbitrary(16 << 20, 7);
    let pdf = arbitrary(3000, 0);
    let photo = image(big.clone());
    let document = Attachment::new("application/pdf", pdf.clone())?.with_name("q3 \0 report.pdf");
    let empty = Attachment::new("text/plain", Vec::new())?;
    let input = Message::user_parts(vec![
        Part::text("what is in these?"),
        Part::Image(photo.clone()),
        Part::File(document.clone()),
        Part::File(empty.clone()),
        Part::ImageUrl {
            url: "https://example.com/a.png?x=1&y=\u{e9}".into(),
        },
    ]);
    let mut claim = new_request(conversation, Revision(0), "parts");
    claim.input = input.clone();
    let fence = admitted(&*store, &claim).await?;

    // A tool's answer with an image (a screenshot, say), and a model's.
    let screenshot = image(arbitrary(1000, 99));
    let tool_calls = vec![tool_call("shot", "{}")];
    let asks = Message::assistant_with_calls("", tool_calls.clone());
    store
        .record_model_response(
            &fence,
            &checkpoint(fence.run_id, 1, CheckpointPhase::ToolsInFlight, 1),
            &asks,
        )
        .await?;
    let tool = Message::Tool {
        call_id: "shot".into(),
        content: vec![Part::text("taken"), Part::Image(screenshot.clone())].into(),
        is_error: false,
    };
    store
        .finish_turn(
            &fence,
            &checkpoint(fence.run_id, 1, CheckpointPhase::Ready, 3),
            std::slice::from_ref(&tool),
            None,
        )
        .await?;
    let drawn = image(arbitrary(500, 3));
    let answer = Message::Assistant {
        content: vec![Part::Image(drawn.clone()), Part::text("drawn")].into(),
        tool_calls: Vec::new(),
        provider_metadata: None,
    };
    let pending = store.request_messages(fence.request_id, 3).await?;
    assert_eq!(pending, [input.clone(), asks.clone(), tool.clone()]);
    store
        .commit(
            &fence,
            &checkpoint(fence.run_id, 2, CheckpointPhase::Ready, 4),
            &answer,
        )
        .await?;

    let expected = [input, asks, tool, answer];
    let transcript = store.transcript_range(conversation, 0, u64::MAX).await?;
    assert!(transcript.iter().map(|e| &e.message).eq(expected.iter()));
    // A read holds the references only: bytes are loaded when asked for.
    for entry in &transcript {
        for attachment in entry.message.content().attachments() {
            assert!(attachment.bytes().is_none(), "{attachment:?} was read");
        }
    }
    assert_loads(&*store, &photo, &big).await?;
    assert_loads(&*store, &document, &pdf).await?;
    assert_loads(&*store, &empty, &[]).await?;
    assert_loads(&*store, &screenshot, &arbitrary(1000, 99)).await?;
    assert_loads(&*store, &drawn, &arbitrary(500, 3)).await?;
    assert_eq!(store.blob(BlobHash::of(b"never stored")).await?, None);
    assert_eq!(
        stored_blobs(&*store).await?,
        (5, (16 << 20) + 3000 + 1000 + 500)
    );
    Ok(())
}

pub async fn one_image_in_a_hundred_requests_and_a_fork_is_stored_once_until_its_last_reference_goes(
    store: SharedAdmin,
) -> TestResult {
    let source = new_conversation(&*store).await?;
    let bytes = arbitrary(200 * 1024, 1);
    let logo = image(bytes.clone());
    for n in 0..100 {
        commit_parts(
            &*store,
            source,
            vec![
                Part::text(format!("request {n}")),
                Part::Image(logo.clone()),
            ],
            Message::assistant("seen"),
        )
        .await?;
    }
    assert_eq!(stored_blobs(&*store).await?, (1, 200 * 1024));

    // A claim of a known request id writes nothing, the blobs of its input
    // included: the same input, or another image (which a session refuses
    // as a mismatch; the store answers with the stored request).
    let revision = store.admission(source).await?.revision;
    let mut claim = new_request(source, revision, "once");
    claim.input = Message::user_parts(vec![Part::Image(image(arbitrary(10, 2)))]);
    let fence = admitted(&*store, &claim).await?;
    assert_eq!(stored_blobs(&*store).await?, (2, 200 * 1024 + 10));
    let another = Message::user_parts(vec![Part::Image(image(arbitrary(20, 3)))]);
    for input in [claim.input.clone(), another] {
        let again = NewRequest {
            input,
            ..claim.clone()
        };
        match store.claim(&again).await? {
            ClaimOutcome::Existing(record) => assert_eq!(record.request_id, claim.request_id),
            other => panic!("expected the stored request, got {other:?}"),
        }
        assert_eq!(stored_blobs(&*store).await?, (2, 200 * 1024 + 10));
    }
    store
        .abandon(source, fence.request_id, fence.revision)
        .await?;

    let fork = ConversationId::new();
    store.fork_conversation(&ns(), source, 200, fork).await?;
    let version = store.conversation(&ns(), source).await?.version;
    store
        .delete_conversation(&ns(), source, version, None)
        .await?;
    // The fork still names the image; the abandoned request's is gone.
    assert_eq!(stored_blobs(&*store).await?, (1, 200 * 1024));
    assert_loads(&*store, &logo, &bytes).await?;
    let kept = store.transcript_range(fork, 0, u64::MAX).await?;
    assert_eq!(kept.len(), 200);
    assert_eq!(kept[0].message.content().attachments().next(), Some(&logo));

    let version = store.conversation(&ns(), fork).await?.version;
    store
        .delete_conversation(&ns(), fork, version, None)
        .await?;
    assert_eq!(stored_blobs(&*store).await?, (0, 0));
    assert_eq!(store.blob(logo.sha256()).await?, None);
    Ok(())
}

pub async fn prune_removes_a_blob_with_its_last_reference_and_keeps_a_named_one(
    store: SharedAdmin,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let kept = image(arbitrary(4096, 5));
    let shared = image(arbitrary(2048, 6));
    let only_pending = image(arbitrary(1024, 8));
    commit_parts(
        &*store,
        conversation,
        vec![Part::Image(kept.clone()), Part::Image(shared.clone())],
        Message::assistant("ok"),
    )
    .await?;
    // An abandoned request's pending messages name two images, one of
    // them also in the transcript.
    let revision = store.admission(conversation).await?.revision;
    let mut claim = new_request(conversation, revision, "dropped");
    claim.input = Message::user_parts(vec![
        Part::Image(shared.clone()),
        Part::Image(only_pending.clone()),
    ]);
    let fence = admitted(&*store, &claim).await?;
    store
        .abandon(conversation, fence.request_id, fence.revision)
        .await?;
    assert_eq!(stored_blobs(&*store).await?, (3, 4096 + 2048 + 1024));

    tick().await;
    store
        .prune(&PruneOptions::older_than(Duration::ZERO))
        .await?;
    assert_eq!(stored_blobs(&*store).await?, (2, 4096 + 2048));
    assert_eq!(store.blob(only_pending.sha256()).await?, None);
    assert_loads(&*store, &shared, &arbitrary(2048, 6)).await?;

    let whole = PruneOptions {
        include_transcripts: true,
        ..PruneOptions::older_than(Duration::ZERO)
    };
    store.prune(&whole).await?;
    assert!(matches!(
        store.conversation(&ns(), conversation).await,
        Err(Error::NotFound { .. })
    ));
    assert_eq!(stored_blobs(&*store).await?, (0, 0));
    Ok(())
}

pub async fn a_part_over_the_limit_or_naming_unstored_bytes_is_refused_and_writes_nothing(
    store: SharedAdmin,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let before = store.admission(conversation).await?;
    let huge = image(vec![0u8; (20 << 20) + 1]);
    let reference: Attachment =
        serde_json::from_value(serde_json::to_value(image(arbitrary(64, 4)))?)?;
    for (what, part) in [
        ("over 20 MiB", Part::Image(huge)),
        ("bytes never stored", Part::File(reference)),
    ] {
        let mut claim = new_request(conversation, before.revision, "refused");
        claim.input = Message::user_parts(vec![Part::text("see"), part]);
        match store.claim(&claim).await {
            Err(Error::InvalidInput(message)) => {
                assert!(!message.is_empty(), "{what}")
            }
            other => panic!("{what}: expected InvalidInput, got {other:?}"),
        }
        assert_eq!(store.request(claim.request_id).await?, None, "{what}");
    }
    assert_eq!(store.admission(conversation).await?, before);
    assert_eq!(stored_blobs(&*store).await?, (0, 0));

    // A message read back names its bytes by reference: it can be written
    // again (a fork, a resumed run) while the store holds them.
    let photo = image(arbitrary(100, 9));
    commit_parts(
        &*store,
        conversation,
        vec![Part::Image(photo.clone())],
        Message::assistant("ok"),
    )
    .await?;
    let read_back = store
        .transcript_range(conversation, 0, 1)
        .await?
        .remove(0)
        .message;
    commit_parts(
        &*store,
        conversation,
        read_back.content().parts().to_vec(),
        Message::assistant("again"),
    )
    .await?;
    assert_eq!(stored_blobs(&*store).await?, (1, 100));

    // A reference edited to claim another size is refused: it would pass
    // the limits unchecked and fail every later model call.
    let mut edited = serde_json::to_value(&photo)?;
    edited["size"] = 1.into();
    let edited: Attachment = serde_json::from_value(edited)?;
    let revision = store.admission(conversation).await?.revision;
    let mut claim = new_request(conversation, revision, "edited");
    claim.input = Message::user_parts(vec![Part::Image(edited)]);
    match store.claim(&claim).await {
        Err(Error::InvalidInput(message)) => assert!(message.contains("holds 100"), "{message}"),
        other => panic!("expected InvalidInput, got {other:?}"),
    }
    assert_eq!(store.request(claim.request_id).await?, None);
    Ok(())
}

pub async fn a_tool_result_with_an_image_is_journaled_whole_and_its_blob_follows_the_result(
    store: SharedAdmin,
) -> TestResult {
    let conversation = new_conversation(&*store).await?;
    let fence = admit(&*store, conversation, "take a screenshot").await?;
    let asks = Message::assistant_with_calls("", vec![tool_call("shot", "{}")]);
    store
        .record_model_response(
            &fence,
            &checkpoint(fence.run_id, 1, CheckpointPhase::ToolsInFlight, 1),
            &asks,
        )
        .await?;

    // A reference to bytes the store does not hold is refused.
    let unheld: Attachment =
        serde_json::from_value(serde_json::to_value(image(arbitrary(32, 1)))?)?;
    let refused = ToolResult {
        content: vec![Part::Image(unheld)].into(),
        is_error: false,
    };
    match store.record_tool_result(&fence, 1, "shot", &refused).await {
        Err(Error::InvalidInput(_)) => {}
        other => panic!("expected InvalidInput, got {other:?}"),
    }
    let journal = store.journal(fence.request_id, 1).await?;
    assert_eq!(journal[0].result, None, "nothing journaled");

    let screenshot = image(arbitrary(3000, 2));
    let result = ToolResult {
        content: vec![Part::text("taken \0"), Part::Image(screenshot.clone())].into(),
        is_error: false,
    };
    store.record_tool_result(&fence, 1, "shot", &result).await?;
    let journal = store.journal(fence.request_id, 1).await?;
    assert_eq!(journal[0].result.as_ref(), Some(&result));
    assert_eq!(stored_blobs(&*store).await?, (1, 3000));

    // The turn's end moves the result into its tool message and clears the
    // journal: the blob stays, named by the message.
    let tool = Message::tool("shot", result.content.clone(), false);
    store
        .finish_turn(
            &fence,
            &checkpoint(fence.run_id, 1, CheckpointPhase::Ready, 3),
            std::slice::from_ref(&tool),
            None,
        )
        .await?;
    let journal = store.journal(fence.request_id, 1).await?;
    assert_eq!(journal[0].result, None, "the journal is cleared");
    assert_eq!(stored_blobs(&*store).await?, (1, 3000));
    assert_eq!(store.request_messages(fence.request_id, 3).await?[2], tool);
    assert_loads(&*store, &screenshot, &arbitrary(3000, 2)).await?;

    store
        .abandon(conversation, fence.request_id, fence.revision)
        .await?;
    tick().await;
    store
        .prune(&PruneOptions::older_than(Duration::ZERO))
        .await?;
    assert_eq!(stored_blobs(&*store).await?, (0, 0));
    Ok(())
}
