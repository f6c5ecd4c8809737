-- A turn's end is an event of its own: kind 9, checkpoint saved, with the
-- run that saved it and the turn that ended. PostgreSQL's migration 0024
-- makes the same change.
--
-- The turn's write step logs it (`src/steps/turn_write.sql`), not a
-- trigger: a run's checkpoint lands in one of three tables (the request's
-- row, `first_run_checkpoints`, `loop_checkpoints`) and moves between the
-- first two, so no one table's trigger sees a turn end exactly once.
--
-- SQLite cannot widen a CHECK in place, so the log is copied into a table
-- that takes the new kind. Every trigger that writes the log names it
-- `events`; with `legacy_alter_table` the rename leaves them naming the new
-- table rather than failing on the old one's name (the table has no rowid
-- to copy it in batches by, and its rows are a few bytes each).
PRAGMA legacy_alter_table = ON;

CREATE TABLE events_with_checkpoints (
    conversation_key INTEGER NOT NULL REFERENCES conversations (key) ON DELETE CASCADE,
    seq              INTEGER NOT NULL,
    kind             INTEGER NOT NULL CHECK (kind BETWEEN 0 AND 9),
    request_id       BLOB NOT NULL,
    run_id           BLOB,
    turn             INTEGER,
    entry_seq        INTEGER,
    call_id          TEXT,
    at               INTEGER NOT NULL,
    PRIMARY KEY (conversation_key, seq)
) WITHOUT ROWID;

INSERT INTO events_with_checkpoints
SELECT conversation_key, seq, kind, request_id, run_id, turn, entry_seq, call_id, at
FROM events;
DROP TABLE events;
ALTER TABLE events_with_checkpoints RENAME TO events;

PRAGMA legacy_alter_table = OFF;

CREATE TRIGGER events_numbered AFTER INSERT ON events
BEGIN
    UPDATE admissions SET event_seq = NEW.seq
    WHERE conversation_id = (SELECT id FROM conversations WHERE key = NEW.conversation_key);
END;
