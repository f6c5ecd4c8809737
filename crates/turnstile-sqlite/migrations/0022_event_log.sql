-- A conversation's event log: a numbered row for each durable step a
-- client watching the conversation cares about. The steps do not write it:
-- the triggers below do, when a step changes the rows that make the step
-- what it is, in the step's own statement, so an event exists exactly when
-- its step committed. PostgreSQL's migration 0022 makes the same log (read
-- the two side by side); `docs/guarantees.md` states what a reader relies
-- on.
--
-- Numbers come from the admission's counter, not from the log's highest
-- row, so the events of a pruned request leave no number to reuse.
--
-- `kind`: 0 admitted (its input is the transcript entry `entry_seq`),
-- 1 run started (a resume, recovery or takeover),
-- 2 answered (the model's answer with tool calls is the transcript entry
-- `entry_seq`), 3 tool finished, 4 approval requested, 5 approval decided,
-- 6 stopped, 7 committed (the final answer is the request's last entry),
-- 8 abandoned. `run_id` is NULL for a request's first run when its id is
-- the request's, and where the kind names none. A few bytes a row: the
-- conversation by its integer key, the rest NULL where the kind needs none.
ALTER TABLE admissions ADD COLUMN event_seq INTEGER NOT NULL DEFAULT 0;

CREATE TABLE events (
    conversation_key INTEGER NOT NULL REFERENCES conversations (key) ON DELETE CASCADE,
    seq              INTEGER NOT NULL,
    kind             INTEGER NOT NULL CHECK (kind BETWEEN 0 AND 8),
    request_id       BLOB NOT NULL,
    run_id           BLOB,
    turn             INTEGER,
    entry_seq        INTEGER,
    call_id          TEXT,
    at               INTEGER NOT NULL,
    PRIMARY KEY (conversation_key, seq)
) WITHOUT ROWID;

-- Each trigger below inserts its step's event with the number after the
-- admission's counter; this one moves the counter on to it.
CREATE TRIGGER events_numbered AFTER INSERT ON events
BEGIN
    UPDATE admissions SET event_seq = NEW.seq
    WHERE conversation_id = (SELECT id FROM conversations WHERE key = NEW.conversation_key);
END;

CREATE TRIGGER event_admitted AFTER INSERT ON requests
BEGIN
    INSERT INTO events (conversation_key, seq, kind, request_id, run_id, entry_seq, at)
    SELECT c.key, a.event_seq + 1, 0, NEW.request_id, NULLIF(a.run_id, NEW.request_id),
        c.transcript_length, NEW.created_at
    FROM admissions a JOIN conversations c ON c.id = a.conversation_id
    WHERE a.conversation_id = NEW.conversation_id;
END;

CREATE TRIGGER event_run_started AFTER INSERT ON runs
WHEN NEW.resumed_from IS NOT NULL
BEGIN
    INSERT INTO events (conversation_key, seq, kind, request_id, run_id, at)
    SELECT c.key, a.event_seq + 1, 1, NEW.request_id, NEW.run_id, NEW.started_at
    FROM requests r
    JOIN admissions a ON a.conversation_id = r.conversation_id
    JOIN conversations c ON c.id = r.conversation_id
    WHERE r.request_id = NEW.request_id;
END;

-- The model's answers that call tools, written while the request is held
-- in this conversation, after its input: not the input (`admitted` tells
-- it, whatever its role), not its tool
-- results (`tool finished` does), not its final answer (the commit writes
-- it with the request completed: `committed` tells it), and not a fork's
-- copy of another conversation's entries.
CREATE TRIGGER event_answered AFTER INSERT ON transcript
WHEN NEW.role = 'assistant'
BEGIN
    INSERT INTO events (conversation_key, seq, kind, request_id, entry_seq, at)
    SELECT NEW.conversation_key, a.event_seq + 1, 2, NEW.request_id, NEW.seq,
        CAST(unixepoch('subsec') * 1000 AS INTEGER)
    FROM admissions a
    WHERE a.active_request_id = NEW.request_id
      AND a.conversation_id = (SELECT id FROM conversations
                               WHERE key = NEW.conversation_key
                                 AND NEW.seq > transcript_length);
END;

CREATE TRIGGER event_tool_finished AFTER UPDATE OF status ON tool_calls
WHEN OLD.status = 'requested' AND NEW.status <> 'requested'
BEGIN
    INSERT INTO events (conversation_key, seq, kind, request_id, turn, call_id, at)
    SELECT c.key, a.event_seq + 1, 3, NEW.request_id, NEW.turn, NEW.call_id,
        COALESCE(NEW.completed_at, CAST(unixepoch('subsec') * 1000 AS INTEGER))
    FROM requests r
    JOIN admissions a ON a.conversation_id = r.conversation_id
    JOIN conversations c ON c.id = r.conversation_id
    WHERE r.request_id = NEW.request_id;
END;

CREATE TRIGGER event_approval_requested AFTER INSERT ON approvals
BEGIN
    INSERT INTO events (conversation_key, seq, kind, request_id, turn, call_id, at)
    SELECT c.key, a.event_seq + 1, 4, NEW.request_id, NEW.turn, NEW.call_id, NEW.requested_at
    FROM requests r
    JOIN admissions a ON a.conversation_id = r.conversation_id
    JOIN conversations c ON c.id = r.conversation_id
    WHERE r.request_id = NEW.request_id;
END;

CREATE TRIGGER event_approval_decided AFTER UPDATE OF status ON approvals
WHEN OLD.status = 'awaiting' AND NEW.status <> 'awaiting'
BEGIN
    INSERT INTO events (conversation_key, seq, kind, request_id, turn, call_id, at)
    SELECT c.key, a.event_seq + 1, 5, NEW.request_id, NEW.turn, NEW.call_id,
        COALESCE(NEW.decided_at, CAST(unixepoch('subsec') * 1000 AS INTEGER))
    FROM requests r
    JOIN admissions a ON a.conversation_id = r.conversation_id
    JOIN conversations c ON c.id = r.conversation_id
    WHERE r.request_id = NEW.request_id;
END;

-- A run stops: one of its own (`runs`), or a request's first run, kept in
-- the request's row (`run_state` 2, failed).
CREATE TRIGGER event_run_stopped AFTER UPDATE OF status ON runs
WHEN NEW.status = 'failed' AND OLD.status <> 'failed'
BEGIN
    INSERT INTO events (conversation_key, seq, kind, request_id, run_id, at)
    SELECT c.key, a.event_seq + 1, 6, NEW.request_id, NEW.run_id,
        COALESCE(NEW.ended_at, CAST(unixepoch('subsec') * 1000 AS INTEGER))
    FROM requests r
    JOIN admissions a ON a.conversation_id = r.conversation_id
    JOIN conversations c ON c.id = r.conversation_id
    WHERE r.request_id = NEW.request_id;
END;

CREATE TRIGGER event_first_run_stopped AFTER UPDATE OF run_state ON requests
WHEN NEW.run_state = 2 AND OLD.run_state IS NOT 2
BEGIN
    INSERT INTO events (conversation_key, seq, kind, request_id, at)
    SELECT c.key, a.event_seq + 1, 6, NEW.request_id,
        COALESCE(NEW.run_ended_early_at, CAST(unixepoch('subsec') * 1000 AS INTEGER))
    FROM admissions a JOIN conversations c ON c.id = a.conversation_id
    WHERE a.conversation_id = NEW.conversation_id;
END;

-- Committed (state 1) or abandoned (state 2).
CREATE TRIGGER event_settled AFTER UPDATE OF state ON requests
WHEN NEW.state <> OLD.state AND NEW.state IN (1, 2)
BEGIN
    INSERT INTO events (conversation_key, seq, kind, request_id, run_id, at)
    SELECT c.key, a.event_seq + 1, IIF(NEW.state = 1, 7, 8), NEW.request_id,
        IIF(NEW.state = 1, NEW.committed_by, NULL), COALESCE(NEW.completed_at, 0)
    FROM admissions a JOIN conversations c ON c.id = a.conversation_id
    WHERE a.conversation_id = NEW.conversation_id;
END;
