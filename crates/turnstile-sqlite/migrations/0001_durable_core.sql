-- The durable core: conversations, their admission, requests, runs, per-turn
-- loop checkpoints, verification reports, the tool-call journal and the
-- committed transcript. Ids are 16-byte UUID blobs; times are Unix
-- milliseconds.
--
-- Storage is O(new data) per step: no row is a whole-state blob rewritten
-- per turn. Small-row tables are WITHOUT ROWID (their key is the table);
-- message tables keep rowids so large messages stay on their leaf page
-- instead of spilling into mostly-empty overflow pages.

CREATE TABLE conversations (
    id          BLOB PRIMARY KEY NOT NULL,
    namespace   TEXT NOT NULL,
    -- +1 per committed request.
    version     INTEGER NOT NULL DEFAULT 0,
    created_at  INTEGER NOT NULL
) WITHOUT ROWID;

-- One row per conversation. Every ownership change is a compare-and-swap on
-- `revision`; every write of a run's owner is fenced by it.
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
) WITHOUT ROWID;

-- A completed request's outcome is these columns plus the `completed`
-- checkpoint of `committed_run_id` and the transcript rows
-- `first_seq..end_seq`: nothing is stored twice.
CREATE TABLE requests (
    request_id            BLOB PRIMARY KEY NOT NULL,
    conversation_id       BLOB NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    input_sha256          BLOB NOT NULL,
    status                TEXT NOT NULL CHECK (status IN ('active', 'completed', 'abandoned')),
    committed_run_id      BLOB,
    conversation_version  INTEGER,
    first_seq             INTEGER,
    end_seq               INTEGER,
    created_at            INTEGER NOT NULL,
    completed_at          INTEGER
) WITHOUT ROWID;

CREATE TABLE runs (
    run_id        BLOB PRIMARY KEY NOT NULL,
    request_id    BLOB NOT NULL REFERENCES requests (request_id) ON DELETE CASCADE,
    resumed_from  BLOB,
    status        TEXT NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'superseded', 'abandoned')),
    error         TEXT,
    started_at    INTEGER NOT NULL,
    ended_at      INTEGER
) WITHOUT ROWID;

-- A message is stored as its role, its text and, for tool calls and tool
-- results, a small JSON `meta` object; the text is never JSON-escaped.

-- Messages a request produced before its commit, in order. A resumed run
-- continues the same sequence, so resuming never copies earlier messages.
-- The commit moves them into `transcript`.
CREATE TABLE run_messages (
    request_id  BLOB NOT NULL REFERENCES requests (request_id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,
    run_id      BLOB NOT NULL,
    turn        INTEGER NOT NULL,
    role        TEXT NOT NULL,
    content     TEXT NOT NULL,
    meta        TEXT,
    UNIQUE (request_id, seq)
);

-- One row per (run, turn) that started. Phase `turn_in_flight` is the
-- write-ahead record (values as of the turn's start); `tools_in_flight`
-- means the model's answer is recorded (its usage included);
-- `model_pending` / `tools_pending` mean the run stopped on purpose with
-- nothing in flight; `ready` means the turn is complete; `completed` marks
-- the turn whose answer was committed. A run with no row is at its start.
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

-- Verification reports of a request, in order; a checkpoint counts them.
CREATE TABLE verification_reports (
    request_id  BLOB NOT NULL REFERENCES requests (request_id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,
    turn        INTEGER NOT NULL,
    passed      INTEGER NOT NULL,
    detail      TEXT NOT NULL,
    PRIMARY KEY (request_id, seq)
) WITHOUT ROWID;

-- One row per tool call of a request: requested -> completed | failed.
-- Keyed by request and turn, so a resumed run finds the results of the run
-- it continues and does not execute those calls again. Once the turn's
-- checkpoint holds the calls and results as messages, `arguments` and
-- `result` are cleared: the row keeps the call's identity and status, and
-- nothing is stored twice.
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
    completed_at  INTEGER,
    PRIMARY KEY (request_id, turn, call_id)
) WITHOUT ROWID;

-- Committed messages; `seq` is the position in the conversation.
CREATE TABLE transcript (
    conversation_id  BLOB NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    seq              INTEGER NOT NULL,
    request_id       BLOB NOT NULL,
    role             TEXT NOT NULL,
    content          TEXT NOT NULL,
    meta             TEXT,
    UNIQUE (conversation_id, seq)
);
