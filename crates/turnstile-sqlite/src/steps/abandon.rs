//! The abandon of an active admission by its request (`abandon.sql`): one
//! `INSERT` into the `abandons` view, always alone, whose trigger fences on
//! the expected active revision and writes the release: the owning run
//! abandoned, the admission idle, the request id burned.
//!
//! Refusal: a moved admission (`admission moved`) is explained by reading
//! it (`diagnose`).

use sqlx::SqliteConnection;

use super::{admission_revision, diagnose, raised, Raised};
use crate::codec::{db, now_ms, only_row, to_i64};
use turnstile_core::backend::Wanted;
use turnstile_core::ids::{ConversationId, RequestId, Revision};
use turnstile_core::Error;

/// The abandon's writes, inside the group transaction: one statement (the
/// `abandons` view of `abandon.sql`): the compare-and-swap, the owning run
/// abandoned, the admission released, the request id burned.
pub(crate) async fn abandon_in(
    tx: &mut SqliteConnection,
    conversation_id: ConversationId,
    request_id: RequestId,
    expected_revision: Revision,
) -> Result<Revision, Error> {
    let conversation = conversation_id.as_uuid();
    let request = request_id.as_uuid();
    let expected = to_i64(expected_revision.0);
    let now = now_ms();
    let released = sqlx::query_scalar!(
        r#"INSERT INTO abandons (conversation_id, request_id, expected_revision, now)
           VALUES (?1, ?2, ?3, ?4)
           RETURNING (SELECT revision FROM admissions WHERE conversation_id = ?1)
               AS "revision!: i64""#,
        conversation,
        request,
        expected,
        now
    )
    .fetch_all(&mut *tx)
    .await
    .and_then(only_row);
    match released {
        Ok(revision) => admission_revision(conversation_id, revision),
        Err(e) => Err(match raised(&e) {
            Some(Raised::AdmissionMoved) => {
                diagnose(
                    tx,
                    Wanted::Active,
                    conversation_id,
                    request_id,
                    expected_revision,
                )
                .await
            }
            _ => db("abandon")(e),
        }),
    }
}
