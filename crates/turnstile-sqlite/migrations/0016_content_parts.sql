-- Messages may hold content parts (reasoning with its signature, images,
-- files) and provider metadata: stored in a message's `meta` as `parts`
-- (its text column then empty) and `provider_metadata`. A turnstile from
-- before this migration refuses the database (schema too new) instead of
-- reading such a message as empty text.
--
-- Images' and files' bytes are stored once per database, keyed by their
-- SHA-256 (hex); a part in `meta` names them by `sha256`. `refs` counts the
-- parts of `run_messages` and `transcript` rows that name a blob, kept by
-- the triggers below on every insert and delete (a fork's copies, a
-- cascade from a deleted conversation, prune, retention), so a blob goes
-- in the same transaction as its last reference, never before, and a row
-- cannot name a blob that is not here. The store writes a blob ahead of the
-- first row that names it, in the row's transaction.
--
-- The bytes are a row of their own (`blob_bytes`): SQLite rebuilds a whole
-- row to update one column, so a count kept beside megabytes of bytes would
-- read them, and at times rewrite them, on every reference taken or dropped.
CREATE TABLE blobs (
    sha256  TEXT PRIMARY KEY NOT NULL,
    size    INTEGER NOT NULL,
    refs    INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

CREATE TABLE blob_bytes (
    sha256  TEXT PRIMARY KEY NOT NULL REFERENCES blobs (sha256) ON DELETE CASCADE,
    bytes   BLOB NOT NULL
);

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

-- A tool result with other parts than text (an image a tool returned) is
-- journaled as its parts in `result_parts` (a JSON array; `result` then
-- empty), its blobs counted like a message's until the turn's end clears
-- the journal (the result is a message then).
ALTER TABLE tool_calls ADD COLUMN result_parts TEXT;

CREATE TRIGGER tool_result_takes_blobs AFTER UPDATE OF result_parts ON tool_calls
WHEN instr(NEW.result_parts, '"sha256"') > 0 OR instr(OLD.result_parts, '"sha256"') > 0
BEGIN
    SELECT RAISE(ABORT, 'turnstile: blob missing')
    WHERE EXISTS (SELECT 1 FROM json_each(NEW.result_parts)
                  WHERE value ->> '$.sha256' IS NOT NULL
                    AND value ->> '$.sha256' NOT IN (SELECT sha256 FROM blobs));
    UPDATE blobs SET refs = refs + named.n
    FROM (SELECT value ->> '$.sha256' AS sha256, count(*) AS n
          FROM json_each(NEW.result_parts) WHERE value ->> '$.sha256' IS NOT NULL
          GROUP BY 1) AS named
    WHERE blobs.sha256 = named.sha256;
    UPDATE blobs SET refs = refs - named.n
    FROM (SELECT value ->> '$.sha256' AS sha256, count(*) AS n
          FROM json_each(OLD.result_parts) WHERE value ->> '$.sha256' IS NOT NULL
          GROUP BY 1) AS named
    WHERE blobs.sha256 = named.sha256;
    DELETE FROM blobs
    WHERE refs <= 0
      AND sha256 IN (SELECT value ->> '$.sha256' FROM json_each(OLD.result_parts));
END;

CREATE TRIGGER tool_call_drops_blobs AFTER DELETE ON tool_calls
WHEN instr(OLD.result_parts, '"sha256"') > 0
BEGIN
    UPDATE blobs SET refs = refs - named.n
    FROM (SELECT value ->> '$.sha256' AS sha256, count(*) AS n
          FROM json_each(OLD.result_parts) WHERE value ->> '$.sha256' IS NOT NULL
          GROUP BY 1) AS named
    WHERE blobs.sha256 = named.sha256;
    DELETE FROM blobs
    WHERE refs <= 0
      AND sha256 IN (SELECT value ->> '$.sha256' FROM json_each(OLD.result_parts));
END;
