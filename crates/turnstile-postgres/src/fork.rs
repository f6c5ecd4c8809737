//! Forking a conversation: a new conversation whose committed history is a
//! prefix of another's, in one transaction. The prefix is copied row by row
//! on the server (`INSERT … SELECT`): no message passes through the
//! process; each entry costs one new row of its size (docs/performance.md).

use sqlx::PgConnection;

use crate::codec::{db, now_ms, to_i64, Row};
use turnstile_core::backend::check_fork_cut;
use turnstile_core::ids::{ConversationId, Namespace};
use turnstile_core::store::ForkOutcome;
use turnstile_core::Error;

/// Forks `from` at `through_seq` into `new_id` inside the caller's
/// transaction (see `Store::fork_conversation`). A retry whose first
/// attempt committed unacknowledged finds `new_id` made of the same
/// entries and answers as that attempt did.
pub(crate) async fn fork_in(
    conn: &mut PgConnection,
    namespace: &Namespace,
    from: ConversationId,
    through_seq: u64,
    new_id: ConversationId,
    retry: bool,
) -> Result<ForkOutcome, Error> {
    // `from` shared-locked: a delete of it waits for the fork, or the fork
    // for the delete (and then finds it gone).
    let source = sqlx::query!(
        "SELECT namespace FROM conversations WHERE conversation_id = $1 FOR SHARE",
        from.as_uuid()
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("lock conversation"))?;
    match source {
        None => return Err(crate::deletion::missing(conn, Some(namespace), from).await),
        Some(row) if row.namespace != namespace.as_str() => {
            return Err(Error::NamespaceMismatch {
                conversation_id: from,
                namespace: namespace.clone(),
            })
        }
        Some(_) => {}
    }
    let length = sqlx::query_scalar!(
        r#"SELECT transcript_length AS "length!" FROM conversations WHERE conversation_id = $1"#,
        from.as_uuid()
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(db("read transcript length"))?;
    let key = Row {
        table: "transcript",
        key: &from,
    };
    let boundary = crate::reads::load_transcript_range(
        conn,
        from,
        through_seq.saturating_sub(1),
        through_seq.saturating_add(1),
    )
    .await?;
    check_fork_cut(from, through_seq, key.u64("seq", length)?, &boundary)?;
    let through = to_i64(through_seq);
    let existing = sqlx::query_scalar!(
        r#"SELECT transcript_length AS "entries!" FROM conversations WHERE conversation_id = $1"#,
        new_id.as_uuid()
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("look for the new conversation"))?;
    if let Some(entries) = existing {
        // This call's own fork, committed by an attempt whose answer was lost.
        if retry && entries == through {
            return Ok(ForkOutcome {
                conversation_id: new_id,
                entries: through_seq,
            });
        }
        return Err(Error::InvalidInput(format!(
            "conversation {new_id} exists: a fork needs a new id"
        )));
    }
    if let Error::Deleted { conversation_id } = crate::deletion::missing(conn, None, new_id).await {
        return Err(Error::Deleted { conversation_id });
    }
    let now = now_ms();
    // Its version counts the requests whose entries it holds.
    sqlx::query!(
        "WITH created AS (
             INSERT INTO conversations (conversation_id, namespace, version, created_at,
                 transcript_length)
             SELECT $1, $2, COUNT(DISTINCT request_id), $4, $5 FROM transcript
             WHERE conversation_id = $3 AND seq < $5
             RETURNING conversation_id, version
         ), admission AS (
             INSERT INTO admissions (conversation_id, revision, updated_at)
             SELECT conversation_id, 0, $4 FROM created
         ), copied AS (
             INSERT INTO transcript (conversation_id, seq, request_id, role, content, meta)
             SELECT $1, seq, request_id, role, content, meta FROM transcript
             WHERE conversation_id = $3 AND seq < $5
         )
         INSERT INTO summaries (conversation_id, through_seq, from_seq, content,
             made_from_version, request_id, input_tokens, output_tokens, cache_read_tokens,
             cache_write_tokens, created_at)
         SELECT $1, s.through_seq, s.from_seq, s.content,
             LEAST(s.made_from_version, (SELECT version FROM created)), s.request_id,
             s.input_tokens, s.output_tokens, s.cache_read_tokens, s.cache_write_tokens,
             s.created_at
         FROM summaries s WHERE s.conversation_id = $3 AND s.through_seq < $5
         ORDER BY s.through_seq DESC LIMIT 1",
        new_id.as_uuid(),
        namespace.as_str(),
        from.as_uuid(),
        now,
        through
    )
    .execute(&mut *conn)
    .await
    .map_err(|e| match crate::deletion::is_deleted(&e) {
        true => Error::Deleted {
            conversation_id: new_id,
        },
        false => db("fork conversation")(e),
    })?;
    Ok(ForkOutcome {
        conversation_id: new_id,
        entries: through_seq,
    })
}
