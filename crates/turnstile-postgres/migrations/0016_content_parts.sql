-- Messages may hold content parts (reasoning with its signature, images,
-- files) and provider metadata: stored in a message's `meta` as `parts`
-- (its text column then empty) and `provider_metadata`. A turnstile from
-- before this migration refuses the database (schema too new) instead of
-- reading such a message as empty text.
--
-- The triggers find the parts' hashes in `meta` as the store writes it
-- (compact JSON: `"sha256":"<64 hex digits>"`) with a regular expression
-- rather than PostgreSQL's JSON functions, which refuse text holding
-- U+0000; any other text holding those characters is inside a JSON string,
-- where its quotes are escaped.
--
-- Images' and files' bytes are stored once per database, keyed by their
-- SHA-256 (hex); a part in `meta` names them by `sha256`. `refs` counts the
-- parts of `run_messages` and `transcript` rows that name a blob, kept by
-- the triggers below on every insert and delete (a fork's copies, a
-- cascade from a deleted conversation, prune, retention), so a blob goes
-- in the same transaction as its last reference, never before, and a row
-- cannot name a blob that is not here. The store writes (or locks) a blob
-- ahead of the first row that names it, in the row's transaction: a
-- concurrent removal of its last other reference waits for it, or went
-- first and the store's upsert writes the blob again.
CREATE TABLE blobs (
    sha256  text PRIMARY KEY,
    id      bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    size    bigint NOT NULL,
    refs    bigint NOT NULL DEFAULT 0
);

-- The bytes, in chunks of 8,120 bytes, each a row filling a page of its
-- own (8,160 bytes, PostgreSQL's largest row: a 24-byte header, the two
-- keys and the value's 4-byte length), then what is left in pieces of at
-- most 2,000 bytes, which share pages (a last chunk over half a page would
-- waste the rest of its page). Kept inline (`PLAIN`), not in TOAST, whose
-- chunks of 1,996 bytes fill an 8 KiB page only to 97% and take an index
-- entry each: 200 KiB images take 1.6% more than their bytes this way,
-- 4.6% in TOAST. Not compressed: images and documents come compressed.
-- Counting references (`refs`) never touches them.
CREATE TABLE blob_bytes (
    blob    bigint NOT NULL REFERENCES blobs (id) ON DELETE CASCADE,
    chunk   integer NOT NULL,
    bytes   bytea NOT NULL,
    PRIMARY KEY (blob, chunk)
);
ALTER TABLE blob_bytes ALTER COLUMN bytes SET STORAGE PLAIN;

-- Each function reads the column named by its trigger's argument (`meta`
-- of a message, `result_parts` of a tool call).
CREATE FUNCTION turnstile_take_blobs() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    missing text;
    parts text := to_jsonb(NEW) ->> TG_ARGV[0];
BEGIN
    WITH named AS (
        SELECT hit[1] AS sha256, count(*) AS n
        FROM regexp_matches(parts, '"sha256":"([0-9a-f]{64})"', 'g') AS hit
        GROUP BY 1
    ), taken AS (
        UPDATE blobs SET refs = blobs.refs + named.n FROM named
        WHERE blobs.sha256 = named.sha256
        RETURNING blobs.sha256
    )
    SELECT named.sha256 INTO missing FROM named
    WHERE named.sha256 NOT IN (SELECT sha256 FROM taken) LIMIT 1;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'turnstile: blob missing' USING ERRCODE = 'P0001';
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION turnstile_drop_blobs() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    parts text := to_jsonb(OLD) ->> TG_ARGV[0];
BEGIN
    UPDATE blobs SET refs = blobs.refs - named.n
    FROM (SELECT hit[1] AS sha256, count(*) AS n
          FROM regexp_matches(parts, '"sha256":"([0-9a-f]{64})"', 'g') AS hit
          GROUP BY 1) AS named
    WHERE blobs.sha256 = named.sha256;
    DELETE FROM blobs
    WHERE refs <= 0
      AND sha256 IN (SELECT hit[1]
                     FROM regexp_matches(parts, '"sha256":"([0-9a-f]{64})"', 'g') AS hit);
    RETURN NULL;
END
$$;

CREATE TRIGGER run_message_takes_blobs AFTER INSERT ON run_messages
FOR EACH ROW WHEN (strpos(NEW.meta, '"sha256":"') > 0)
EXECUTE FUNCTION turnstile_take_blobs('meta');

-- A reference is dropped when the transaction commits: one statement may
-- move a message (a commit copies a request's pending messages into the
-- transcript and deletes them), and PostgreSQL fires its row triggers in no
-- order a migration can rely on, so a drop firing first would remove a blob
-- the copy names.
CREATE CONSTRAINT TRIGGER run_message_drops_blobs AFTER DELETE ON run_messages
DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW WHEN (strpos(OLD.meta, '"sha256":"') > 0)
EXECUTE FUNCTION turnstile_drop_blobs('meta');

CREATE TRIGGER transcript_takes_blobs AFTER INSERT ON transcript
FOR EACH ROW WHEN (strpos(NEW.meta, '"sha256":"') > 0)
EXECUTE FUNCTION turnstile_take_blobs('meta');

CREATE CONSTRAINT TRIGGER transcript_drops_blobs AFTER DELETE ON transcript
DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW WHEN (strpos(OLD.meta, '"sha256":"') > 0)
EXECUTE FUNCTION turnstile_drop_blobs('meta');

-- A tool result with other parts than text (an image a tool returned) is
-- journaled as its parts in `result_parts` (a JSON array; `result` then
-- empty), its blobs counted like a message's until the turn's end clears
-- the journal (the result is a message then).
ALTER TABLE tool_calls ADD COLUMN result_parts text;

CREATE TRIGGER tool_result_takes_blobs AFTER UPDATE OF result_parts ON tool_calls
FOR EACH ROW WHEN (strpos(NEW.result_parts, '"sha256":"') > 0)
EXECUTE FUNCTION turnstile_take_blobs('result_parts');

CREATE CONSTRAINT TRIGGER tool_result_drops_blobs AFTER UPDATE OF result_parts ON tool_calls
DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW WHEN (strpos(OLD.result_parts, '"sha256":"') > 0)
EXECUTE FUNCTION turnstile_drop_blobs('result_parts');

CREATE CONSTRAINT TRIGGER tool_call_drops_blobs AFTER DELETE ON tool_calls
DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW WHEN (strpos(OLD.result_parts, '"sha256":"') > 0)
EXECUTE FUNCTION turnstile_drop_blobs('result_parts');
