//! Reading a conversation's event log (written by the schema's triggers,
//! `migrations/0022_event_log.sql` and `0024`, and by the claim, commit and
//! abandon statements, `0026`, which keep their events in the request's
//! row, `0028`).

use sqlx::PgConnection;

use crate::codec::{db, text, to_i64, Row};
use crate::deletion::missing;
use turnstile_core::backend::EventRow;
use turnstile_core::ids::ConversationId;
use turnstile_core::store::LoggedEvent;
use turnstile_core::Error;

pub(crate) async fn load_events_after(
    conn: &mut PgConnection,
    conversation_id: ConversationId,
    after: u64,
    limit: u32,
) -> Result<Vec<LoggedEvent>, Error> {
    // The log's own rows, and the `admitted` and settling events kept in
    // the requests' rows (migration 0028): those admitted after `after`,
    // and the settling event of the one request admitted last at or before
    // it, which may follow it. Each part reads its index in the order of
    // the log and stops at the limit.
    let rows = sqlx::query!(
        r#"(SELECT seq AS "seq!", at AS "at!", kind AS "kind!", request_id AS "request_id!",
                run_id, turn, entry_seq, call_id
            FROM events WHERE conversation_id = $1 AND seq > $2 ORDER BY seq LIMIT $3)
           UNION ALL
           (SELECT admitted_event, created_at, 0::smallint, request_id, admitted_run_id, NULL,
                admitted_entry, NULL
            FROM requests WHERE conversation_id = $1 AND admitted_event > $2
            ORDER BY admitted_event LIMIT $3)
           UNION ALL
           (SELECT settled_event, completed_at,
                CASE WHEN status = 'completed' THEN 7 ELSE 8 END::smallint, request_id,
                CASE WHEN status = 'completed' THEN NULLIF(committed_run_id, request_id) END,
                NULL, NULL, NULL
            FROM requests
            WHERE conversation_id = $1 AND settled_event > $2
              AND admitted_event >= COALESCE(
                      (SELECT MAX(admitted_event) FROM requests
                       WHERE conversation_id = $1 AND admitted_event <= $2), 0)
            ORDER BY admitted_event LIMIT $3)
           ORDER BY 1 LIMIT $3"#,
        conversation_id.as_uuid(),
        to_i64(after),
        i64::from(limit)
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(db("load events"))?;
    // Nothing new: the conversation may be gone, which a follower must hear.
    if rows.is_empty() {
        let exists = sqlx::query_scalar!(
            r#"SELECT EXISTS (SELECT 1 FROM conversations WHERE conversation_id = $1) AS "exists!""#,
            conversation_id.as_uuid()
        )
        .fetch_one(&mut *conn)
        .await
        .map_err(db("look up conversation"))?;
        if !exists {
            return Err(missing(conn, None, conversation_id).await);
        }
    }
    rows.into_iter()
        .map(|r| {
            let key = format!("{conversation_id} #{}", r.seq);
            let row = Row {
                table: "events",
                key: &key,
            };
            let call_id = r.call_id.map(|id| text(&row, "call_id", id)).transpose()?;
            EventRow {
                seq: r.seq,
                at: r.at,
                kind: i64::from(r.kind),
                request_id: r.request_id.as_bytes().to_vec(),
                run_id: r.run_id.map(|id| id.as_bytes().to_vec()),
                turn: r.turn,
                entry_seq: r.entry_seq,
                call_id,
            }
            .decode(&conversation_id)
        })
        .collect()
}
