//! Forking a conversation: a new conversation whose committed history is a
//! prefix of another's, in one write transaction.
//!
//! The transcript prefix is copied row by row inside SQLite (`INSERT …
//! SELECT`): no message passes through the process, but each entry costs
//! one new row of its size (see docs/performance.md). The schema keys every
//! entry by its conversation, so sharing rows would change every
//! transcript read; a copy leaves them as they are.

use sqlx::{Connection, SqliteConnection};

use crate::codec::{db, now_ms, to_i64, Row};
use crate::SqliteStore;
use turnstile_core::backend::check_fork_cut;
use turnstile_core::ids::{ConversationId, Namespace};
use turnstile_core::store::ForkOutcome;
use turnstile_core::Error;

/// Forks `from` at `through_seq` into `new_id` (see
/// `Store::fork_conversation`).
pub(crate) async fn fork_conversation(
    store: &SqliteStore,
    namespace: &Namespace,
    from: ConversationId,
    through_seq: u64,
    new_id: ConversationId,
) -> Result<ForkOutcome, Error> {
    // The entries either side of the cut. Committed entries never change,
    // so they need not be read inside the transaction; the transaction
    // checks that they are still there.
    let boundary = crate::reads::load_transcript_range(
        &store.reader,
        from,
        through_seq.saturating_sub(1),
        through_seq.saturating_add(1),
    )
    .await?;
    let mut conn = store.writer.take().await?;
    let mut tx = conn
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(db("begin write transaction"))?;
    let entries = fork_in(&mut tx, namespace, from, through_seq, new_id, &boundary).await?;
    tx.commit().await.map_err(db("commit the fork"))?;
    tracing::info!(%from, conversation = %new_id, entries, "forked");
    Ok(ForkOutcome {
        conversation_id: new_id,
        entries,
    })
}

async fn fork_in(
    tx: &mut SqliteConnection,
    namespace: &Namespace,
    from: ConversationId,
    through_seq: u64,
    new_id: ConversationId,
    boundary: &[turnstile_core::store::TranscriptEntry],
) -> Result<u64, Error> {
    crate::admission::load_conversation(&mut *tx, namespace, from).await?;
    let (source, target) = (from.as_uuid(), new_id.as_uuid());
    let length = sqlx::query_scalar!(
        r#"SELECT COALESCE((SELECT transcript_length FROM conversations WHERE id = ?1), 0)
               AS "length!: i64""#,
        source
    )
    .fetch_one(&mut *tx)
    .await
    .map_err(db("read transcript length"))?;
    let key = Row {
        table: "transcript",
        key: &from,
    };
    check_fork_cut(from, through_seq, key.u64("seq", length)?, boundary)?;
    let taken = sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM conversations WHERE id = ?1) AS "taken!: bool""#,
        target
    )
    .fetch_one(&mut *tx)
    .await
    .map_err(db("look for the new conversation"))?;
    if taken {
        return Err(Error::InvalidInput(format!(
            "conversation {new_id} exists: a fork needs a new id"
        )));
    }
    if let Error::Deleted { conversation_id } = crate::deletion::missing(tx, None, new_id).await {
        return Err(Error::Deleted { conversation_id });
    }
    let through = to_i64(through_seq);
    let now = now_ms();
    let ns = namespace.as_str();
    // Its version counts the requests whose entries it holds.
    sqlx::query!(
        "INSERT INTO conversations (id, namespace, version, created_at, key, transcript_length)
         SELECT ?1, ?2, COUNT(DISTINCT request_id), ?4,
             max((SELECT COALESCE(MAX(key), 0) FROM conversations),
                 (SELECT COALESCE(MAX(conversation_key), 0) FROM transcript)) + 1, ?5
         FROM transcript
         WHERE conversation_key = (SELECT key FROM conversations WHERE id = ?3) AND seq < ?5",
        target,
        ns,
        source,
        now,
        through
    )
    .execute(&mut *tx)
    .await
    .map_err(db("create the fork"))?;
    sqlx::query!(
        "INSERT INTO admissions (conversation_id, revision, updated_at) VALUES (?1, 0, ?2)",
        target,
        now
    )
    .execute(&mut *tx)
    .await
    .map_err(db("create the fork's admission"))?;
    let copied = sqlx::query!(
        "INSERT INTO transcript (conversation_key, seq, request_id, role, content, meta)
         SELECT (SELECT key FROM conversations WHERE id = ?1), seq, request_id, role, content,
             meta
         FROM transcript
         WHERE conversation_key = (SELECT key FROM conversations WHERE id = ?2) AND seq < ?3
         ORDER BY seq",
        target,
        source,
        through
    )
    .execute(&mut *tx)
    .await
    .map_err(db("copy the transcript"))?
    .rows_affected();
    // The latest summary within the copied entries: it summarizes all of
    // them up to its `through_seq`. It read no newer version than the
    // fork's own.
    sqlx::query!(
        "INSERT INTO summaries (conversation_id, from_seq, through_seq, content,
             made_from_version, request_id, input_tokens, output_tokens, cache_read_tokens,
             cache_write_tokens, created_at)
         SELECT ?1, s.from_seq, s.through_seq, s.content,
             MIN(s.made_from_version, (SELECT version FROM conversations WHERE id = ?1)),
             s.request_id, s.input_tokens, s.output_tokens, s.cache_read_tokens,
             s.cache_write_tokens, s.created_at
         FROM summaries s WHERE s.conversation_id = ?2 AND s.through_seq < ?3
         ORDER BY s.through_seq DESC LIMIT 1",
        target,
        source,
        through
    )
    .execute(&mut *tx)
    .await
    .map_err(db("copy the summary"))?;
    Ok(copied)
}
