-- The current schema of a turnstile SQLite database, as a freshly migrated
-- database holds it (written by the test `schema_sql`; do not edit by hand).
-- Migrations under migrations/ change it; the durable steps, views with
-- their INSTEAD OF triggers, are installed from src/steps/ when a store opens.

CREATE TABLE conversations (
    id          BLOB PRIMARY KEY NOT NULL,
    namespace   TEXT NOT NULL,
    -- +1 per committed request.
    version     INTEGER NOT NULL DEFAULT 0,
    created_at  INTEGER NOT NULL
, title TEXT, owner TEXT, metadata TEXT NOT NULL DEFAULT '{}', meta_version INTEGER NOT NULL DEFAULT 0, meta_updated_at INTEGER, key INTEGER, transcript_length INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;

CREATE TABLE admissions (
    conversation_id    BLOB PRIMARY KEY NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    revision           INTEGER NOT NULL,
    active_request_id  BLOB,
    input_sha256       BLOB,
    run_id             BLOB,
    agent_fingerprint  TEXT,
    -- Latest persisted usage of the active request (what `recovery_usage` reports).
    input_tokens       INTEGER NOT NULL DEFAULT 0,
    output_tokens      INTEGER NOT NULL DEFAULT 0,
    cache_read_tokens  INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0,
    updated_at         INTEGER NOT NULL
, summary_passes INTEGER NOT NULL DEFAULT 0, summary_from_seq INTEGER, summary_through_seq INTEGER, summary_version INTEGER, summary_prompt_sha256 BLOB, lease_expires_at INTEGER, event_seq INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;

CREATE TABLE requests (
    request_id            BLOB PRIMARY KEY NOT NULL,
    conversation_id       BLOB NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    input_sha256          BLOB NOT NULL,
    conversation_version  INTEGER,
    first_seq             INTEGER,
    end_seq               INTEGER,
    created_at            INTEGER NOT NULL,
    completed_at          INTEGER
, deadline_at INTEGER, budget TEXT, run_error TEXT, turn INTEGER, input_tokens INTEGER, output_tokens INTEGER, cache_read_tokens INTEGER, cache_write_tokens INTEGER, tool_calls_count INTEGER, reports_count INTEGER, message_count INTEGER, state INTEGER NOT NULL DEFAULT 0 CHECK (state BETWEEN 0 AND 2), committed_by BLOB, run_state INTEGER CHECK (run_state BETWEEN 0 AND 4), run_ended_early_at INTEGER, checkpoint_phase INTEGER CHECK (checkpoint_phase BETWEEN 0 AND 5), checkpoint_early_at INTEGER, status TEXT NOT NULL GENERATED ALWAYS AS (
    CASE state WHEN 0 THEN 'active' WHEN 1 THEN 'completed' WHEN 2 THEN 'abandoned'
    ELSE 'state ' || state END) VIRTUAL, committed_run_id BLOB GENERATED ALWAYS AS (
    IIF(state = 1, COALESCE(committed_by, request_id), NULL)) VIRTUAL, run_status TEXT GENERATED ALWAYS AS (
    CASE run_state WHEN 0 THEN 'running' WHEN 1 THEN 'completed' WHEN 2 THEN 'failed'
    WHEN 3 THEN 'superseded' WHEN 4 THEN 'abandoned' ELSE 'run state ' || run_state END) VIRTUAL, run_ended_at INTEGER GENERATED ALWAYS AS (
    COALESCE(run_ended_early_at, IIF(run_state IN (1, 4), completed_at, NULL))) VIRTUAL, phase TEXT GENERATED ALWAYS AS (
    CASE checkpoint_phase WHEN 0 THEN 'turn_in_flight' WHEN 1 THEN 'tools_in_flight'
    WHEN 2 THEN 'model_pending' WHEN 3 THEN 'tools_pending' WHEN 4 THEN 'ready'
    WHEN 5 THEN 'completed' ELSE 'phase ' || checkpoint_phase END) VIRTUAL, checkpoint_at INTEGER GENERATED ALWAYS AS (
    IIF(checkpoint_phase IS NULL, NULL, COALESCE(checkpoint_early_at, completed_at))) VIRTUAL, admitted_event INTEGER, admitted_entry INTEGER, admitted_run_id BLOB, settled_event INTEGER) WITHOUT ROWID;

CREATE TABLE runs (
    run_id        BLOB PRIMARY KEY NOT NULL,
    request_id    BLOB NOT NULL REFERENCES requests (request_id) ON DELETE CASCADE,
    resumed_from  BLOB,
    status        TEXT NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'superseded', 'abandoned')),
    error         TEXT,
    started_at    INTEGER NOT NULL,
    ended_at      INTEGER
, agent_fingerprint TEXT, replaced_fingerprint TEXT, budget_change TEXT) WITHOUT ROWID;

CREATE TABLE loop_checkpoints (
    run_id              BLOB NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    turn                INTEGER NOT NULL,
    phase               TEXT NOT NULL,
    input_tokens        INTEGER NOT NULL,
    output_tokens       INTEGER NOT NULL,
    cache_read_tokens   INTEGER NOT NULL,
    cache_write_tokens  INTEGER NOT NULL,
    tool_calls_count    INTEGER NOT NULL,
    -- The request's first `reports_count` verification reports.
    reports_count       INTEGER NOT NULL,
    message_count       INTEGER NOT NULL,
    created_at          INTEGER NOT NULL,
    PRIMARY KEY (run_id, turn)
) WITHOUT ROWID;

CREATE TABLE verification_reports (
    request_id  BLOB NOT NULL REFERENCES requests (request_id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,
    turn        INTEGER NOT NULL,
    passed      INTEGER NOT NULL,
    detail      TEXT NOT NULL,
    PRIMARY KEY (request_id, seq)
) WITHOUT ROWID;

CREATE TABLE tool_calls (
    request_id    BLOB NOT NULL REFERENCES requests (request_id) ON DELETE CASCADE,
    turn          INTEGER NOT NULL,
    call_id       TEXT NOT NULL,
    position      INTEGER NOT NULL,
    run_id        BLOB NOT NULL,
    name          TEXT NOT NULL,
    arguments     TEXT,
    status        TEXT NOT NULL CHECK (status IN ('requested', 'completed', 'failed')),
    result        TEXT,
    created_at    INTEGER NOT NULL,
    completed_at  INTEGER, result_parts TEXT,
    PRIMARY KEY (request_id, turn, call_id)
) WITHOUT ROWID;

CREATE INDEX runs_by_request ON runs (request_id);

CREATE INDEX conversations_by_namespace ON conversations (namespace, created_at);

CREATE TABLE summaries (
    id                  INTEGER PRIMARY KEY,
    conversation_id     BLOB NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    from_seq            INTEGER NOT NULL,
    through_seq         INTEGER NOT NULL,
    content             TEXT NOT NULL,
    -- The conversation version (committed requests) the pass read.
    made_from_version   INTEGER NOT NULL,
    -- The request whose pass made it (not a foreign key: a summary belongs to
    -- the conversation and outlives the request), and what the pass cost.
    request_id          BLOB NOT NULL,
    input_tokens        INTEGER NOT NULL,
    output_tokens       INTEGER NOT NULL,
    cache_read_tokens   INTEGER NOT NULL,
    cache_write_tokens  INTEGER NOT NULL,
    created_at          INTEGER NOT NULL,
    UNIQUE (conversation_id, through_seq)
);

CREATE TRIGGER tool_result_reaches_admission AFTER UPDATE OF status ON tool_calls
WHEN NEW.completed_at IS NOT NULL
BEGIN
    UPDATE admissions SET updated_at = NEW.completed_at
    WHERE conversation_id = (SELECT conversation_id FROM requests
                             WHERE request_id = NEW.request_id)
      AND active_request_id = NEW.request_id;
END;

CREATE TABLE approvals (
    request_id    BLOB NOT NULL REFERENCES requests (request_id) ON DELETE CASCADE,
    turn          INTEGER NOT NULL,
    call_id       TEXT NOT NULL,
    -- The run that stopped to ask.
    run_id        BLOB NOT NULL,
    status        TEXT NOT NULL CHECK (status IN ('awaiting', 'approved', 'rejected')),
    reason        TEXT,
    requested_at  INTEGER NOT NULL,
    decided_at    INTEGER,
    PRIMARY KEY (request_id, turn, call_id)
) WITHOUT ROWID;

CREATE INDEX approvals_awaiting ON approvals (requested_at) WHERE status = 'awaiting';

CREATE INDEX conversations_newest ON conversations (created_at, id);

CREATE TABLE deleted_conversations (
    id          BLOB PRIMARY KEY NOT NULL,
    namespace   TEXT NOT NULL,
    deleted_at  INTEGER NOT NULL
) WITHOUT ROWID;

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

CREATE TRIGGER lease_follows_owner AFTER UPDATE OF revision ON admissions
WHEN NEW.revision <> OLD.revision AND NEW.lease_expires_at IS NOT NULL
BEGIN
    UPDATE admissions SET lease_expires_at = NULL
    WHERE conversation_id = NEW.conversation_id;
END;

CREATE INDEX admissions_leased ON admissions (lease_expires_at)
    WHERE lease_expires_at IS NOT NULL AND active_request_id IS NOT NULL;

CREATE TABLE deleted_runs (
    run_id           BLOB PRIMARY KEY NOT NULL,
    conversation_id  BLOB NOT NULL
) WITHOUT ROWID;

CREATE TABLE step_set (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    version  INTEGER NOT NULL
);

CREATE TABLE blobs (
    sha256  TEXT PRIMARY KEY NOT NULL,
    size    INTEGER NOT NULL,
    refs    INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

CREATE TABLE blob_bytes (
    sha256  TEXT PRIMARY KEY NOT NULL REFERENCES blobs (sha256) ON DELETE CASCADE,
    bytes   BLOB NOT NULL
);

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

CREATE UNIQUE INDEX conversations_by_key ON conversations (key);

CREATE TRIGGER conversation_has_key BEFORE INSERT ON conversations
WHEN NEW.key IS NULL
BEGIN
    SELECT RAISE(ABORT, 'turnstile: conversation without key');
END;

CREATE TABLE "transcript" (
    conversation_key  INTEGER NOT NULL REFERENCES conversations (key) ON DELETE CASCADE,
    seq               INTEGER NOT NULL,
    request_id        BLOB NOT NULL,
    role              TEXT NOT NULL,
    content           TEXT NOT NULL,
    meta              TEXT,
    UNIQUE (conversation_key, seq)
);

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

CREATE TABLE "run_messages" (
    request_id  BLOB NOT NULL REFERENCES requests (request_id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,
    role        TEXT NOT NULL,
    content     TEXT NOT NULL,
    meta        TEXT,
    UNIQUE (request_id, seq)
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

CREATE TABLE first_run_checkpoints (
    request_id          BLOB NOT NULL REFERENCES requests (request_id) ON DELETE CASCADE,
    turn                INTEGER NOT NULL,
    phase               TEXT NOT NULL,
    input_tokens        INTEGER NOT NULL,
    output_tokens       INTEGER NOT NULL,
    cache_read_tokens   INTEGER NOT NULL,
    cache_write_tokens  INTEGER NOT NULL,
    tool_calls_count    INTEGER NOT NULL,
    -- The request's first `reports_count` verification reports.
    reports_count       INTEGER NOT NULL,
    message_count       INTEGER NOT NULL,
    created_at          INTEGER NOT NULL,
    PRIMARY KEY (request_id, turn)
) WITHOUT ROWID;

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

CREATE TABLE tokens (
    id          BLOB PRIMARY KEY NOT NULL,
    namespace   TEXT NOT NULL,
    sha256      BLOB NOT NULL UNIQUE,
    created_at  INTEGER NOT NULL,
    revoked_at  INTEGER
) WITHOUT ROWID;

CREATE TABLE "events" (
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

CREATE TRIGGER events_numbered AFTER INSERT ON events
BEGIN
    UPDATE admissions SET event_seq = NEW.seq
    WHERE conversation_id = (SELECT id FROM conversations WHERE key = NEW.conversation_key);
END;

CREATE INDEX requests_by_conversation ON requests (conversation_id, admitted_event, created_at);

CREATE TRIGGER event_settled AFTER UPDATE OF state ON requests
WHEN NEW.state <> OLD.state AND NEW.state IN (1, 2) AND NEW.admitted_event IS NULL
BEGIN
    INSERT INTO events (conversation_key, seq, kind, request_id, run_id, at)
    SELECT c.key, a.event_seq + 1, IIF(NEW.state = 1, 7, 8), NEW.request_id,
        IIF(NEW.state = 1, NEW.committed_by, NULL), COALESCE(NEW.completed_at, 0)
    FROM admissions a JOIN conversations c ON c.id = a.conversation_id
    WHERE a.conversation_id = NEW.conversation_id;
END;
