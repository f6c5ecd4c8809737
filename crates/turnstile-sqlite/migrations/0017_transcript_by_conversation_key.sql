-- Transcript rows name their conversation by a small integer key instead
-- of its 16-byte id. With the larger pages new databases get (8 KiB, see
-- `open.rs`), a 500-byte message's row then fits 15 to a page instead of
-- 14, and its (conversation, seq) index entries shrink by two thirds.
--
-- The transcript stays in insertion order (its rowid), not clustered by
-- conversation: conversations are written interleaved, and a table kept in
-- conversation order splits its pages under interleaved appends (1.26×
-- raw at 8 KiB against 1.12× for this layout, measured in
-- docs/performance.md).
--
-- A conversation's key is given when it is created: one more than the
-- largest any conversation or transcript row holds (the steps say how). A
-- deleted conversation's transcript goes with it through the foreign key.
--
-- The steps are views whose triggers name the transcript; a database
-- migrated from before `step_set` still holds those its migrations made.
-- They go first (every view of the schema is a step, and these are all the
-- names any migration gave one), and the store installs its steps again
-- when it opens the database.
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

ALTER TABLE conversations ADD COLUMN key INTEGER;
UPDATE conversations SET key = numbered.n
FROM (SELECT id, row_number() OVER (ORDER BY created_at, id) AS n FROM conversations) AS numbered
WHERE conversations.id = numbered.id;
CREATE UNIQUE INDEX conversations_by_key ON conversations (key);
-- Every conversation has a key: the statements that create one give it.
CREATE TRIGGER conversation_has_key BEFORE INSERT ON conversations
WHEN NEW.key IS NULL
BEGIN
    SELECT RAISE(ABORT, 'turnstile: conversation without key');
END;

-- Rows whose conversation is gone (deleted with foreign keys off) have no
-- key to go under: deleted through the table, so the blobs they name lose
-- their references as the triggers count them.
DELETE FROM transcript WHERE conversation_id NOT IN (SELECT id FROM conversations);

CREATE TABLE transcript_by_key (
    conversation_key  INTEGER NOT NULL REFERENCES conversations (key) ON DELETE CASCADE,
    seq               INTEGER NOT NULL,
    request_id        BLOB NOT NULL,
    role              TEXT NOT NULL,
    content           TEXT NOT NULL,
    meta              TEXT,
    UNIQUE (conversation_key, seq)
);
-- In the old table's order, so the copy appends. The store runs the copy
-- in batches of rowids (`?1` to `?2`) inside this migration's transaction,
-- telling how many rows are done (`src/migrate.rs`); applied whole, with
-- nothing bound, it copies every row at once.
-- turnstile: batched copy of transcript
INSERT INTO transcript_by_key (conversation_key, seq, request_id, role, content, meta)
SELECT c.key, t.seq, t.request_id, t.role, t.content, t.meta
FROM transcript t JOIN conversations c ON c.id = t.conversation_id
WHERE t.rowid BETWEEN COALESCE(?1, -9223372036854775808) AND COALESCE(?2, 9223372036854775807)
ORDER BY t.rowid;
-- turnstile: end of batched copy
-- Dropping a table fires none of its triggers, so the blobs' reference
-- counts stand as they were: the copy's rows name the same blobs.
DROP TABLE transcript;
ALTER TABLE transcript_by_key RENAME TO transcript;

CREATE TRIGGER transcript_takes_blobs AFTER INSERT ON transcript
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

CREATE TRIGGER transcript_drops_blobs AFTER DELETE ON transcript
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
