-- A conversation's event log: a numbered row for each durable step a
-- client watching the conversation cares about. The steps do not write it:
-- the triggers below do, when a step changes the rows that make the step
-- what it is, in the step's own statement, so an event exists exactly when
-- its step committed. `docs/guarantees.md` states what a reader relies on.
--
-- Numbers come from the admission's counter, not from the log's highest
-- row, so the events of a pruned request leave no number to reuse.
--
-- `kind`: 0 admitted, 1 run started (a resume, recovery or takeover),
-- 2 message (a model's answer or a tool's result reached the transcript at
-- `entry_seq`), 3 tool finished, 4 approval requested, 5 approval decided,
-- 6 stopped, 7 committed, 8 abandoned. `run_id` is NULL for a request's
-- first run (whose id is the request's) and where the kind names none.
ALTER TABLE admissions ADD COLUMN event_seq INTEGER NOT NULL DEFAULT 0;

CREATE TABLE events (
    conversation_id  BLOB NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    seq              INTEGER NOT NULL,
    kind             INTEGER NOT NULL CHECK (kind BETWEEN 0 AND 8),
    request_id       BLOB NOT NULL,
    run_id           BLOB,
    turn             INTEGER,
    entry_seq        INTEGER,
    call_id          TEXT,
    at               INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, seq)
) WITHOUT ROWID;

CREATE TRIGGER event_admitted AFTER INSERT ON requests
BEGIN
    UPDATE admissions SET event_seq = event_seq + 1 WHERE conversation_id = NEW.conversation_id;
    INSERT INTO events (conversation_id, seq, kind, request_id, run_id, at)
    SELECT conversation_id, event_seq, 0, NEW.request_id, NULLIF(run_id, NEW.request_id),
        NEW.created_at
    FROM admissions WHERE conversation_id = NEW.conversation_id;
END;

CREATE TRIGGER event_run_started AFTER INSERT ON runs
WHEN NEW.resumed_from IS NOT NULL
BEGIN
    UPDATE admissions SET event_seq = event_seq + 1
    WHERE conversation_id = (SELECT conversation_id FROM requests
                             WHERE request_id = NEW.request_id);
    INSERT INTO events (conversation_id, seq, kind, request_id, run_id, at)
    SELECT a.conversation_id, a.event_seq, 1, NEW.request_id, NEW.run_id, NEW.started_at
    FROM requests r JOIN admissions a ON a.conversation_id = r.conversation_id
    WHERE r.request_id = NEW.request_id;
END;

-- A request's own messages only (a fork copies entries of another
-- conversation's requests), and not its input, which `admitted` tells.
CREATE TRIGGER event_message AFTER INSERT ON transcript
WHEN NEW.role <> 'user'
BEGIN
    UPDATE admissions SET event_seq = event_seq + 1
    WHERE conversation_id = (SELECT r.conversation_id
                             FROM requests r JOIN conversations c ON c.id = r.conversation_id
                             WHERE r.request_id = NEW.request_id
                               AND c.key = NEW.conversation_key);
    INSERT INTO events (conversation_id, seq, kind, request_id, entry_seq, at)
    SELECT a.conversation_id, a.event_seq, 2, NEW.request_id, NEW.seq,
        CAST(unixepoch('subsec') * 1000 AS INTEGER)
    FROM requests r
    JOIN conversations c ON c.id = r.conversation_id
    JOIN admissions a ON a.conversation_id = r.conversation_id
    WHERE r.request_id = NEW.request_id AND c.key = NEW.conversation_key;
END;

CREATE TRIGGER event_tool_finished AFTER UPDATE OF status ON tool_calls
WHEN OLD.status = 'requested' AND NEW.status <> 'requested'
BEGIN
    UPDATE admissions SET event_seq = event_seq + 1
    WHERE conversation_id = (SELECT conversation_id FROM requests
                             WHERE request_id = NEW.request_id);
    INSERT INTO events (conversation_id, seq, kind, request_id, turn, call_id, at)
    SELECT a.conversation_id, a.event_seq, 3, NEW.request_id, NEW.turn, NEW.call_id,
        COALESCE(NEW.completed_at, CAST(unixepoch('subsec') * 1000 AS INTEGER))
    FROM requests r JOIN admissions a ON a.conversation_id = r.conversation_id
    WHERE r.request_id = NEW.request_id;
END;

CREATE TRIGGER event_approval_requested AFTER INSERT ON approvals
BEGIN
    UPDATE admissions SET event_seq = event_seq + 1
    WHERE conversation_id = (SELECT conversation_id FROM requests
                             WHERE request_id = NEW.request_id);
    INSERT INTO events (conversation_id, seq, kind, request_id, turn, call_id, at)
    SELECT a.conversation_id, a.event_seq, 4, NEW.request_id, NEW.turn, NEW.call_id,
        NEW.requested_at
    FROM requests r JOIN admissions a ON a.conversation_id = r.conversation_id
    WHERE r.request_id = NEW.request_id;
END;

CREATE TRIGGER event_approval_decided AFTER UPDATE OF status ON approvals
WHEN OLD.status = 'awaiting' AND NEW.status <> 'awaiting'
BEGIN
    UPDATE admissions SET event_seq = event_seq + 1
    WHERE conversation_id = (SELECT conversation_id FROM requests
                             WHERE request_id = NEW.request_id);
    INSERT INTO events (conversation_id, seq, kind, request_id, turn, call_id, at)
    SELECT a.conversation_id, a.event_seq, 5, NEW.request_id, NEW.turn, NEW.call_id,
        COALESCE(NEW.decided_at, CAST(unixepoch('subsec') * 1000 AS INTEGER))
    FROM requests r JOIN admissions a ON a.conversation_id = r.conversation_id
    WHERE r.request_id = NEW.request_id;
END;

-- A run stops: one of its own (`runs`), or a request's first run, kept in
-- the request's row (`run_state` 2, failed).
CREATE TRIGGER event_run_stopped AFTER UPDATE OF status ON runs
WHEN NEW.status = 'failed' AND OLD.status <> 'failed'
BEGIN
    UPDATE admissions SET event_seq = event_seq + 1
    WHERE conversation_id = (SELECT conversation_id FROM requests
                             WHERE request_id = NEW.request_id);
    INSERT INTO events (conversation_id, seq, kind, request_id, run_id, at)
    SELECT a.conversation_id, a.event_seq, 6, NEW.request_id, NEW.run_id,
        COALESCE(NEW.ended_at, CAST(unixepoch('subsec') * 1000 AS INTEGER))
    FROM requests r JOIN admissions a ON a.conversation_id = r.conversation_id
    WHERE r.request_id = NEW.request_id;
END;

CREATE TRIGGER event_first_run_stopped AFTER UPDATE OF run_state ON requests
WHEN NEW.run_state = 2 AND OLD.run_state IS NOT 2
BEGIN
    UPDATE admissions SET event_seq = event_seq + 1 WHERE conversation_id = NEW.conversation_id;
    INSERT INTO events (conversation_id, seq, kind, request_id, at)
    SELECT conversation_id, event_seq, 6, NEW.request_id,
        COALESCE(NEW.run_ended_early_at, CAST(unixepoch('subsec') * 1000 AS INTEGER))
    FROM admissions WHERE conversation_id = NEW.conversation_id;
END;

-- Committed (state 1) or abandoned (state 2). The commit step appends the
-- final answer before it completes the request, so its `message` comes
-- first.
CREATE TRIGGER event_settled AFTER UPDATE OF state ON requests
WHEN NEW.state <> OLD.state AND NEW.state IN (1, 2)
BEGIN
    UPDATE admissions SET event_seq = event_seq + 1 WHERE conversation_id = NEW.conversation_id;
    INSERT INTO events (conversation_id, seq, kind, request_id, run_id, at)
    SELECT conversation_id, event_seq, IIF(NEW.state = 1, 7, 8), NEW.request_id,
        IIF(NEW.state = 1, NEW.committed_by, NULL), COALESCE(NEW.completed_at, 0)
    FROM admissions WHERE conversation_id = NEW.conversation_id;
END;
