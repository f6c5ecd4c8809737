-- Every event is numbered and written by `log_event`. Before version 18,
-- PostgreSQL plans the body of a `LANGUAGE sql` function again at each
-- call from a trigger; PL/pgSQL keeps its statement parsed for the
-- connection, and after the first few calls its plan. The same statement,
-- the same rows.
CREATE OR REPLACE FUNCTION log_event(uuid, smallint, uuid, uuid, bigint, bigint, bytea, bigint)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    WITH counted AS (
        UPDATE admissions SET event_seq = event_seq + 1 WHERE conversation_id = $1
        RETURNING event_seq
    )
    INSERT INTO events (conversation_id, seq, kind, request_id, run_id, turn, entry_seq,
        call_id, at)
    SELECT $1, event_seq, $2, $3, NULLIF($4, $3), $5, $6, $7, $8 FROM counted;
END $$;
