-- A request's messages go to the transcript as they are written (its input
-- with its claim, each turn's with that turn), after the conversation's
-- committed entries, instead of to `run_messages` first and, at the
-- commit, copied to the transcript and deleted: a one-turn request writes
-- its input once, and its commit moves nothing.
--
-- `conversations.transcript_length` is where the committed entries end:
-- entries `0..transcript_length` are committed, and the rows after them
-- are the held request's messages, which no read of the transcript shows.
-- A commit appends the final answer and moves the length past it; an
-- abandon moves the held request's messages to `run_messages`, which now
-- holds only abandoned requests' messages, kept until they are pruned.
--
-- The steps are views whose triggers name `run_messages`, which is rebuilt
-- here: they go first (as in 0017), and the store installs its steps
-- again when it opens the database.
DROP VIEW IF EXISTS abandons;
DROP VIEW IF EXISTS claims;
DROP VIEW IF EXISTS claim_batches;
DROP VIEW IF EXISTS commits;
DROP VIEW IF EXISTS commit_batches;
DROP VIEW IF EXISTS conversation_opens;
DROP VIEW IF EXISTS recovery_claims;
DROP VIEW IF EXISTS tool_result_batches;
DROP VIEW IF EXISTS turn_writes;
DROP VIEW IF EXISTS turn_write_batches;
UPDATE step_set SET version = 0;

ALTER TABLE conversations ADD COLUMN transcript_length INTEGER NOT NULL DEFAULT 0;
UPDATE conversations
SET transcript_length = (SELECT COALESCE(MAX(seq) + 1, 0) FROM transcript
                         WHERE conversation_key = conversations.key);

-- The held requests' messages move to the transcript (their blobs are
-- counted there before they are let go here).
INSERT INTO transcript (conversation_key, seq, request_id, role, content, meta)
SELECT c.key, c.transcript_length + m.seq, m.request_id, m.role, m.content, m.meta
FROM admissions a
JOIN conversations c ON c.id = a.conversation_id
JOIN run_messages m ON m.request_id = a.active_request_id
ORDER BY c.key, m.seq;
DELETE FROM run_messages
WHERE request_id IN (SELECT active_request_id FROM admissions
                     WHERE active_request_id IS NOT NULL);

-- What is left are abandoned requests' messages; which run and turn wrote
-- each was never read, and an abandon moving a request's messages from the
-- transcript no longer knows it.
CREATE TABLE run_messages_new (
    request_id  BLOB NOT NULL REFERENCES requests (request_id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,
    role        TEXT NOT NULL,
    content     TEXT NOT NULL,
    meta        TEXT,
    UNIQUE (request_id, seq)
);
INSERT INTO run_messages_new (request_id, seq, role, content, meta)
SELECT request_id, seq, role, content, meta FROM run_messages ORDER BY rowid;
DROP TABLE run_messages;
ALTER TABLE run_messages_new RENAME TO run_messages;

CREATE TRIGGER run_message_takes_blobs AFTER INSERT ON run_messages
WHEN instr(NEW.meta, '"sha256"') > 0
BEGIN
    SELECT RAISE(ABORT, 'turnstile: blob missing')
    WHERE EXISTS (SELECT 1 FROM json_each(NEW.meta, '$.parts')
                  WHERE value ->> '$.sha256' IS NOT NULL
                    AND value ->> '$.sha256' NOT IN (SELECT sha256 FROM blobs));
    UPDATE blobs SET refs = refs + named.n
    FROM (SELECT value ->> '$.sha256' AS sha256, count(*) AS n
          FROM json_each(NEW.meta, '$.parts') WHERE value ->> '$.sha256' IS NOT NULL
          GROUP BY 1) AS named
    WHERE blobs.sha256 = named.sha256;
END;

CREATE TRIGGER run_message_drops_blobs AFTER DELETE ON run_messages
WHEN instr(OLD.meta, '"sha256"') > 0
BEGIN
    UPDATE blobs SET refs = refs - named.n
    FROM (SELECT value ->> '$.sha256' AS sha256, count(*) AS n
          FROM json_each(OLD.meta, '$.parts') WHERE value ->> '$.sha256' IS NOT NULL
          GROUP BY 1) AS named
    WHERE blobs.sha256 = named.sha256;
    DELETE FROM blobs
    WHERE refs <= 0 AND sha256 IN (SELECT value ->> '$.sha256' FROM json_each(OLD.meta, '$.parts'));
END;
