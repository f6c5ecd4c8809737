-- The durable core: conversations, their admission, requests, runs, per-turn
-- loop checkpoints, the tool-call journal and the committed transcript.
-- Ids are 16-byte UUID blobs; times are Unix milliseconds.

CREATE TABLE conversations (
    id          BLOB PRIMARY KEY NOT NULL,
    namespace   TEXT NOT NULL,
    -- +1 per committed request.
    version     INTEGER NOT NULL DEFAULT 0,
    created_at  INTEGER NOT NULL
);

CREATE INDEX conversations_by_namespace ON conversations (namespace, created_at);

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
);

CREATE TABLE requests (
    request_id       BLOB PRIMARY KEY NOT NULL,
    conversation_id  BLOB NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    input_sha256     BLOB NOT NULL,
    status           TEXT NOT NULL CHECK (status IN ('active', 'completed', 'abandoned')),
    -- JSON of the committed outcome, kept for replay (without the messages,
    -- which stay in `transcript` between `first_seq` and `end_seq`).
    outcome          TEXT,
    created_at       INTEGER NOT NULL,
    completed_at     INTEGER
);

CREATE INDEX requests_by_conversation ON requests (conversation_id, created_at);

CREATE TABLE runs (
    run_id        BLOB PRIMARY KEY NOT NULL,
    request_id    BLOB NOT NULL REFERENCES requests (request_id) ON DELETE CASCADE,
    resumed_from  BLOB REFERENCES runs (run_id) ON DELETE SET NULL,
    status        TEXT NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'superseded', 'abandoned')),
    error         TEXT,
    started_at    INTEGER NOT NULL,
    ended_at      INTEGER
);

CREATE INDEX runs_by_request ON runs (request_id, started_at);

-- Messages a request produced before its commit, in order. A resumed run
-- continues the same sequence, so resuming never copies earlier messages.
-- The commit moves them into `transcript`.
CREATE TABLE run_messages (
    request_id  BLOB NOT NULL REFERENCES requests (request_id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,
    run_id      BLOB NOT NULL,
    turn        INTEGER NOT NULL,
    message     TEXT NOT NULL,
    PRIMARY KEY (request_id, seq)
);

-- One row per (run, turn). Phase `turn_in_flight` is the write-ahead record
-- (values as of the turn's start), `tools_in_flight` means the model's answer
-- for the turn is recorded (its usage included), `ready` means the turn is
-- complete, `completed` marks the turn whose answer was committed.
CREATE TABLE loop_checkpoints (
    run_id                BLOB NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    turn                  INTEGER NOT NULL,
    phase                 TEXT NOT NULL,
    input_tokens          INTEGER NOT NULL,
    output_tokens         INTEGER NOT NULL,
    cache_read_tokens     INTEGER NOT NULL,
    cache_write_tokens    INTEGER NOT NULL,
    tool_calls_count      INTEGER NOT NULL,
    verification_reports  TEXT NOT NULL,
    message_count         INTEGER NOT NULL,
    created_at            INTEGER NOT NULL,
    PRIMARY KEY (run_id, turn)
);

-- One row per tool call of a request: requested -> completed | failed.
-- Keyed by request and turn, so a resumed run finds the results of the run
-- it continues and does not execute those calls again.
CREATE TABLE tool_calls (
    request_id  BLOB NOT NULL REFERENCES requests (request_id) ON DELETE CASCADE,
    turn        INTEGER NOT NULL,
    call_id     TEXT NOT NULL,
    run_id      BLOB NOT NULL,
    name        TEXT NOT NULL,
    arguments   TEXT NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('requested', 'completed', 'failed')),
    result      TEXT,
    created_at  INTEGER NOT NULL,
    completed_at INTEGER,
    PRIMARY KEY (request_id, turn, call_id)
);

-- Committed messages. `seq` is the position in the conversation.
CREATE TABLE transcript (
    conversation_id  BLOB NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    seq              INTEGER NOT NULL,
    request_id       BLOB NOT NULL,
    message          TEXT NOT NULL,
    PRIMARY KEY (conversation_id, seq)
);
