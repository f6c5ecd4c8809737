//! The abandon of an active admission by its request, in one transaction:
//! a statement that fences on the expected active revision (the
//! compare-and-swap) and writes the release (the admission idle, its run
//! and its request abandoned, by a token of the call so that a retry whose
//! first attempt committed knows it, and its `abandoned` event), then one
//! that moves the request's messages from the transcript, where they
//! followed the committed entries, to `run_messages`.
//!
//! Refusal: a moved admission is explained by reading it (`diagnose`).

use sqlx::PgConnection;
use uuid::Uuid;

use super::{diagnose, fence_at};
use crate::codec::{db, now_ms, to_i64};
use turnstile_core::backend::Wanted;
use turnstile_core::ids::{ConversationId, RequestId, Revision};
use turnstile_core::Error;

/// The abandon: the release, which marks the run and request abandoned by
/// `token` (one per call, the same for all its attempts), and the move of
/// the request's messages. Runs inside a transaction.
pub(crate) async fn abandon(
    conn: &mut PgConnection,
    conversation_id: ConversationId,
    request_id: RequestId,
    expected_revision: Revision,
    token: Uuid,
    retry: bool,
) -> Result<Revision, Error> {
    let conversation = conversation_id.as_uuid();
    let request = request_id.as_uuid();
    let released = sqlx::query_scalar!(
        r#"WITH held AS (
               SELECT run_id FROM admissions
               WHERE conversation_id = $2 AND revision = $3 AND active_request_id = $4
           ), released AS (
               UPDATE admissions
               SET active_request_id = NULL, input_sha256 = NULL, run_id = NULL,
                   agent_fingerprint = NULL, input_tokens = 0, output_tokens = 0,
                   cache_read_tokens = 0, cache_write_tokens = 0, summary_passes = 0,
                   summary_from_seq = NULL, summary_through_seq = NULL, summary_version = NULL,
                   summary_prompt_sha256 = NULL, revision = revision + 1, updated_at = $1,
                   event_seq = event_seq + 1
               WHERE conversation_id = $2 AND revision = $3 AND active_request_id = $4
               RETURNING revision, event_seq
           ), abandoned AS (
               -- The abandon's event, numbered by the release: kind 8. Kept
               -- in the request's row (below) when its admission is (0028).
               INSERT INTO events (conversation_id, seq, kind, request_id, run_id, turn,
                   entry_seq, call_id, at)
               SELECT $2, event_seq, 8, $4, NULL, NULL, NULL, NULL, $1 FROM released
               WHERE NOT EXISTS (SELECT 1 FROM requests
                                 WHERE conversation_id = $2 AND request_id = $4
                                   AND admitted_event IS NOT NULL)
           ), run AS (
               UPDATE runs SET status = 'abandoned', ended_at = COALESCE(ended_at, $1)
               WHERE conversation_id = $2 AND run_id = (SELECT run_id FROM held)
                 AND status IN ('running', 'failed') AND EXISTS (SELECT 1 FROM released)
           ), request AS (
               -- A run folded into the request's row (migration 0027) is
               -- abandoned there when it holds the admission.
               UPDATE requests q
               SET status = 'abandoned', completed_at = $1, abandoned_by = $5,
                   settled_event = CASE WHEN q.admitted_event IS NOT NULL
                                        THEN (SELECT event_seq FROM released) END,
                   run_status = CASE WHEN h.run_id = $4 AND q.run_status IN ('running', 'failed')
                                     THEN 'abandoned' ELSE q.run_status END,
                   run_ended_at = CASE WHEN h.run_id = $4
                                           AND q.run_status IN ('running', 'failed')
                                       THEN COALESCE(q.run_ended_at, $1)
                                       ELSE q.run_ended_at END
               FROM held h
               WHERE q.conversation_id = $2 AND q.request_id = $4
                 AND EXISTS (SELECT 1 FROM released)
           )
           SELECT revision AS "revision!" FROM released"#,
        now_ms(),
        conversation,
        to_i64(expected_revision.0),
        request,
        token
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db("abandon"))?;
    if let Some(revision) = released {
        // A statement of its own, in the same transaction: its snapshot is
        // taken after the release got the admission's lock, so it sees the
        // messages of a turn write that committed while the release waited.
        sqlx::query!(
            "WITH unheld AS (
                 DELETE FROM transcript t USING conversations c
                 WHERE t.conversation_id = $1 AND c.conversation_id = $1
                   AND t.seq >= c.transcript_length
                 RETURNING t.seq - c.transcript_length AS seq, t.role, t.content, t.meta
             )
             INSERT INTO run_messages (conversation_id, request_id, seq, role, content, meta)
             SELECT $1, $2, seq, role, content, meta FROM unheld",
            conversation,
            request
        )
        .execute(&mut *conn)
        .await
        .map_err(db("keep the abandoned request's messages"))?;
        return fence_at(conversation_id, revision);
    }
    if retry {
        // This call's first attempt released it (from `expected_revision`),
        // and its acknowledgement was lost.
        let mine = sqlx::query_scalar!(
            r#"SELECT EXISTS (SELECT 1 FROM requests
                   WHERE conversation_id = $1 AND request_id = $2 AND abandoned_by = $3)
               AS "mine!""#,
            conversation,
            request,
            token
        )
        .fetch_one(&mut *conn)
        .await
        .map_err(db("read abandon"))?;
        if mine {
            return Ok(Revision(expected_revision.0 + 1));
        }
    }
    Err(diagnose(
        conn,
        Wanted::Active,
        conversation_id,
        request_id,
        expected_revision,
    )
    .await)
}
