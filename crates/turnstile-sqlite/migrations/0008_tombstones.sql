-- Deleted conversations (issue 17). Deleting a conversation removes every
-- row of it and leaves tombstones in tables of their own: its id, and the
-- ids of its requests. Nothing keyed by a tombstone is ever created again:
-- a conversation of a deleted id, or a request of a deleted request id, is
-- refused by the triggers below, whichever statement inserts it (the
-- `conversation_opens` and `claims` steps of 0005/0006 included), with a
-- raise the store maps to its typed `Deleted` error (`codec.rs`). The
-- triggers sit on the base tables rather than in those views, so the views
-- need not be recreated here.
--
-- A replaced owner still writing after the delete finds no admission row:
-- every fenced step raises `turnstile: fenced` as for any other lost
-- revision, and writes nothing.

CREATE TABLE deleted_conversations (
    id          BLOB PRIMARY KEY NOT NULL,
    namespace   TEXT NOT NULL,
    deleted_at  INTEGER NOT NULL
) WITHOUT ROWID;

-- A request id of a deleted conversation: a retry with it is told the
-- conversation was deleted, never admitted as new, never replayed.
CREATE TABLE deleted_requests (
    request_id       BLOB PRIMARY KEY NOT NULL,
    conversation_id  BLOB NOT NULL
) WITHOUT ROWID;

CREATE TRIGGER conversation_not_deleted BEFORE INSERT ON conversations
WHEN EXISTS (SELECT 1 FROM deleted_conversations WHERE id = NEW.id)
BEGIN
    SELECT RAISE(ABORT, 'turnstile: deleted');
END;

CREATE TRIGGER request_not_deleted BEFORE INSERT ON requests
WHEN EXISTS (SELECT 1 FROM deleted_requests WHERE request_id = NEW.request_id)
   OR EXISTS (SELECT 1 FROM deleted_conversations WHERE id = NEW.conversation_id)
BEGIN
    SELECT RAISE(ABORT, 'turnstile: deleted');
END;
