-- A conversation's event log: a numbered row for each durable step a
-- client watching the conversation cares about, as SQLite's migration 0022
-- makes it (read the two side by side). The steps do not write it: the
-- triggers below do, when a step changes the rows that make the step what
-- it is, in the step's own transaction, so an event exists exactly when its
-- step committed.
--
-- Numbers come from the admission's counter, taken under the admission's
-- row lock (every step locks that row first), not from the log's highest
-- row: the events of a pruned request leave no number to reuse, and two
-- steps of one conversation never take the same number.
--
-- `kind`: 0 admitted (its input is the transcript entry `entry_seq`),
-- 1 run started (a resume, recovery or takeover),
-- 2 answered (the model's answer with tool calls is the transcript entry
-- `entry_seq`), 3 tool finished, 4 approval requested, 5 approval decided,
-- 6 stopped, 7 committed (the final answer is the request's last entry),
-- 8 abandoned. `run_id` is NULL for a request's
-- first run when its id is the request's, and where the kind names none.
ALTER TABLE admissions ADD COLUMN event_seq bigint NOT NULL DEFAULT 0;

CREATE TABLE events (
    conversation_id  uuid NOT NULL REFERENCES conversations ON DELETE CASCADE,
    seq              bigint NOT NULL,
    kind             smallint NOT NULL CHECK (kind BETWEEN 0 AND 8),
    request_id       uuid NOT NULL,
    run_id           uuid,
    turn             bigint,
    entry_seq        bigint,
    call_id          bytea,
    at               bigint NOT NULL,
    PRIMARY KEY (conversation_id, seq)
);

-- The one place an event is numbered and written:
-- (conversation, kind, request, run, turn, entry_seq, call_id, at).
CREATE FUNCTION log_event(uuid, smallint, uuid, uuid, bigint, bigint, bytea, bigint)
RETURNS void LANGUAGE sql AS $$
    WITH counted AS (
        UPDATE admissions SET event_seq = event_seq + 1 WHERE conversation_id = $1
        RETURNING event_seq
    )
    INSERT INTO events (conversation_id, seq, kind, request_id, run_id, turn, entry_seq,
        call_id, at)
    SELECT $1, event_seq, $2, $3, NULLIF($4, $3), $5, $6, $7, $8 FROM counted
$$;

CREATE FUNCTION event_clock() RETURNS bigint LANGUAGE sql AS $$
    SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint
$$;

CREATE FUNCTION event_admitted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM log_event(NEW.conversation_id, 0::smallint, NEW.request_id,
        (SELECT run_id FROM admissions WHERE conversation_id = NEW.conversation_id),
        NULL,
        (SELECT transcript_length FROM conversations
         WHERE conversation_id = NEW.conversation_id),
        NULL, NEW.created_at);
    RETURN NULL;
END $$;
CREATE TRIGGER event_admitted AFTER INSERT ON requests
FOR EACH ROW EXECUTE FUNCTION event_admitted();

CREATE FUNCTION event_run_started() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM log_event(NEW.conversation_id, 1::smallint, NEW.request_id, NEW.run_id,
        NULL, NULL, NULL, NEW.started_at);
    RETURN NULL;
END $$;
CREATE TRIGGER event_run_started AFTER INSERT ON runs
FOR EACH ROW WHEN (NEW.resumed_from IS NOT NULL) EXECUTE FUNCTION event_run_started();

-- The model's answers that call tools, written while the request is held
-- in this conversation, after its input: not the input (`admitted` tells
-- it, whatever its role), not its tool
-- results (`tool finished` does), not its final answer (the commit's
-- statement releases the admission: `committed` tells it), and not a
-- fork's copy of another conversation's entries.
CREATE FUNCTION event_answered() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    stepped_at bigint;
BEGIN
    -- The time the step's fence wrote, on the clock of every other event.
    SELECT a.updated_at INTO stepped_at
    FROM admissions a JOIN conversations c USING (conversation_id)
    WHERE a.conversation_id = NEW.conversation_id AND a.active_request_id = NEW.request_id
      AND NEW.seq > c.transcript_length;
    IF FOUND THEN
        PERFORM log_event(NEW.conversation_id, 2::smallint, NEW.request_id, NULL,
            NULL, NEW.seq, NULL, stepped_at);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER event_answered AFTER INSERT ON transcript
FOR EACH ROW WHEN (NEW.role = 'assistant') EXECUTE FUNCTION event_answered();

CREATE FUNCTION event_tool_finished() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM log_event(NEW.conversation_id, 3::smallint, NEW.request_id, NULL,
        NEW.turn, NULL, NEW.call_id, COALESCE(NEW.completed_at, event_clock()));
    RETURN NULL;
END $$;
CREATE TRIGGER event_tool_finished AFTER UPDATE OF status ON tool_calls
FOR EACH ROW WHEN (OLD.status = 'requested' AND NEW.status <> 'requested')
EXECUTE FUNCTION event_tool_finished();

-- Deferred to the end of the transaction: the stop that asks (`fail_run`'s
-- write, after this insert) is told first, as on SQLite.
CREATE FUNCTION event_approval_requested() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM log_event(NEW.conversation_id, 4::smallint, NEW.request_id, NULL, NEW.turn,
        NULL,
        (SELECT call_id FROM tool_calls
         WHERE conversation_id = NEW.conversation_id AND request_id = NEW.request_id
           AND turn = NEW.turn AND position = NEW.position),
        NEW.requested_at);
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER event_approval_requested AFTER INSERT ON approvals
DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW EXECUTE FUNCTION event_approval_requested();

CREATE FUNCTION event_approval_decided() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM log_event(NEW.conversation_id, 5::smallint, NEW.request_id, NULL, NEW.turn,
        NULL,
        (SELECT call_id FROM tool_calls
         WHERE conversation_id = NEW.conversation_id AND request_id = NEW.request_id
           AND turn = NEW.turn AND position = NEW.position),
        COALESCE(NEW.decided_at, event_clock()));
    RETURN NULL;
END $$;
CREATE TRIGGER event_approval_decided AFTER UPDATE OF status ON approvals
FOR EACH ROW WHEN (OLD.status = 'awaiting' AND NEW.status <> 'awaiting')
EXECUTE FUNCTION event_approval_decided();

CREATE FUNCTION event_run_stopped() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM log_event(NEW.conversation_id, 6::smallint, NEW.request_id, NEW.run_id,
        NULL, NULL, NULL, COALESCE(NEW.ended_at, event_clock()));
    RETURN NULL;
END $$;
CREATE TRIGGER event_run_stopped AFTER UPDATE OF status ON runs
FOR EACH ROW WHEN (NEW.status = 'failed' AND OLD.status <> 'failed')
EXECUTE FUNCTION event_run_stopped();

-- Committed or abandoned.
CREATE FUNCTION event_settled() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM log_event(NEW.conversation_id,
        (CASE NEW.status WHEN 'completed' THEN 7 ELSE 8 END)::smallint, NEW.request_id,
        CASE NEW.status WHEN 'completed' THEN NEW.committed_run_id END,
        NULL, NULL, NULL, COALESCE(NEW.completed_at, event_clock()));
    RETURN NULL;
END $$;
CREATE TRIGGER event_settled AFTER UPDATE OF status ON requests
FOR EACH ROW WHEN (NEW.status <> OLD.status AND NEW.status IN ('completed', 'abandoned'))
EXECUTE FUNCTION event_settled();
