-- The durable core on PostgreSQL: the same rows as the SQLite schema, keyed
-- for a distributed Postgres. Every primary key and unique index leads with
-- `conversation_id`, the column a sharded engine distributes by, so all of
-- a conversation's rows live together and every write of a step touches one
-- shard. The one store-global rule (a request id is unique across the
-- store) goes through `request_ids`, keyed by request id
-- (docs/scale-out.md).
--
-- Ids are `uuid`; times are Unix milliseconds. Text a model, a tool or a
-- user wrote is `bytea` holding its UTF-8: PostgreSQL `text` cannot hold
-- U+0000, and such text must round-trip verbatim. `meta` is a message's
-- other fields as JSON text (JSON escapes U+0000).

CREATE TABLE conversations (
    conversation_id  uuid PRIMARY KEY,
    namespace        text NOT NULL,
    -- +1 per committed request.
    version          bigint NOT NULL DEFAULT 0,
    created_at       bigint NOT NULL
);

-- One row per conversation. Every ownership change is a compare-and-swap on
-- `revision`; every write of a run's owner starts by updating this row
-- under its fence (`WHERE revision = … AND run_id = …`), which also holds
-- the row lock until the step commits, so no takeover can slip between a
-- step's fence and its commit.
CREATE TABLE admissions (
    conversation_id        uuid PRIMARY KEY REFERENCES conversations ON DELETE CASCADE,
    revision               bigint NOT NULL,
    active_request_id      uuid,
    input_sha256           bytea,
    run_id                 uuid,
    agent_fingerprint      text,
    -- Latest persisted usage of the active request (what `recovery_usage` reports).
    input_tokens           bigint NOT NULL DEFAULT 0,
    output_tokens          bigint NOT NULL DEFAULT 0,
    cache_read_tokens      bigint NOT NULL DEFAULT 0,
    cache_write_tokens     bigint NOT NULL DEFAULT 0,
    -- Summary progress of the active request (DESIGN §6).
    summary_passes         bigint NOT NULL DEFAULT 0,
    summary_from_seq       bigint,
    summary_through_seq    bigint,
    summary_version        bigint,
    summary_prompt_sha256  bytea,
    updated_at             bigint NOT NULL
);

-- A request id is unique across the store: claimed once, in one
-- conversation. Keyed by request id (on a sharded engine, distributed by
-- it), so finding a request by id alone is one lookup.
CREATE TABLE request_ids (
    request_id       uuid PRIMARY KEY,
    conversation_id  uuid NOT NULL
);

CREATE TABLE requests (
    conversation_id       uuid NOT NULL REFERENCES conversations ON DELETE CASCADE,
    request_id            uuid NOT NULL,
    input_sha256          bytea NOT NULL,
    status                text NOT NULL CHECK (status IN ('active', 'completed', 'abandoned')),
    committed_run_id      uuid,
    conversation_version  bigint,
    first_seq             bigint,
    end_seq               bigint,
    created_at            bigint NOT NULL,
    completed_at          bigint,
    -- The abandon that released it, by the token of that call: a retried
    -- abandon whose first attempt committed unacknowledged knows its own.
    abandoned_by          uuid,
    PRIMARY KEY (conversation_id, request_id)
);

CREATE TABLE runs (
    conversation_id  uuid NOT NULL,
    run_id           uuid NOT NULL,
    request_id       uuid NOT NULL,
    resumed_from     uuid,
    status           text NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'superseded', 'abandoned')),
    error            bytea,
    started_at       bigint NOT NULL,
    ended_at         bigint,
    PRIMARY KEY (conversation_id, run_id),
    FOREIGN KEY (conversation_id, request_id) REFERENCES requests ON DELETE CASCADE
);

-- Messages a request produced before its commit, in order; the commit moves
-- them into `transcript`.
CREATE TABLE run_messages (
    conversation_id  uuid NOT NULL,
    request_id       uuid NOT NULL,
    seq              bigint NOT NULL,
    run_id           uuid NOT NULL,
    turn             bigint NOT NULL,
    role             text NOT NULL,
    content          bytea NOT NULL,
    meta             text,
    PRIMARY KEY (conversation_id, request_id, seq),
    FOREIGN KEY (conversation_id, request_id) REFERENCES requests ON DELETE CASCADE
);

-- One row per (run, turn) that started; the phases are those of the SQLite
-- schema (`turn_in_flight` … `completed`).
CREATE TABLE loop_checkpoints (
    conversation_id     uuid NOT NULL,
    run_id              uuid NOT NULL,
    turn                bigint NOT NULL,
    phase               text NOT NULL,
    input_tokens        bigint NOT NULL,
    output_tokens       bigint NOT NULL,
    cache_read_tokens   bigint NOT NULL,
    cache_write_tokens  bigint NOT NULL,
    tool_calls_count    bigint NOT NULL,
    -- The request's first `reports_count` verification reports.
    reports_count       bigint NOT NULL,
    message_count       bigint NOT NULL,
    created_at          bigint NOT NULL,
    PRIMARY KEY (conversation_id, run_id, turn),
    FOREIGN KEY (conversation_id, run_id) REFERENCES runs ON DELETE CASCADE
);

CREATE TABLE verification_reports (
    conversation_id  uuid NOT NULL,
    request_id       uuid NOT NULL,
    seq              bigint NOT NULL,
    turn             bigint NOT NULL,
    passed           boolean NOT NULL,
    detail           bytea NOT NULL,
    PRIMARY KEY (conversation_id, request_id, seq),
    FOREIGN KEY (conversation_id, request_id) REFERENCES requests ON DELETE CASCADE
);

-- One row per tool call of a request: requested -> completed | failed. Once
-- the turn's checkpoint holds the calls and results as messages,
-- `arguments` and `result` are cleared. Keyed by the call's position: a
-- call id is the model's text, of any length, too long for a btree key; its
-- uniqueness within the turn is kept on its SHA-256.
CREATE TABLE tool_calls (
    conversation_id  uuid NOT NULL,
    request_id       uuid NOT NULL,
    turn             bigint NOT NULL,
    call_id          bytea NOT NULL,
    position         bigint NOT NULL,
    run_id           uuid NOT NULL,
    name             bytea NOT NULL,
    arguments        bytea,
    status           text NOT NULL CHECK (status IN ('requested', 'completed', 'failed')),
    result           bytea,
    created_at       bigint NOT NULL,
    completed_at     bigint,
    PRIMARY KEY (conversation_id, request_id, turn, position),
    FOREIGN KEY (conversation_id, request_id) REFERENCES requests ON DELETE CASCADE
);
CREATE UNIQUE INDEX tool_calls_by_call_id
    ON tool_calls (conversation_id, request_id, turn, sha256(call_id));

-- Committed messages; `seq` is the position in the conversation.
CREATE TABLE transcript (
    conversation_id  uuid NOT NULL REFERENCES conversations ON DELETE CASCADE,
    seq              bigint NOT NULL,
    request_id       uuid NOT NULL,
    role             text NOT NULL,
    content          bytea NOT NULL,
    meta             text,
    PRIMARY KEY (conversation_id, seq)
);

-- Summary rows (DESIGN §6): row `n` covers `from_seq..=through_seq` and
-- extends the row before it. The key makes a pass whose commit was
-- acknowledged too late recognizable: it is found, not inserted twice.
CREATE TABLE summaries (
    conversation_id     uuid NOT NULL REFERENCES conversations ON DELETE CASCADE,
    through_seq         bigint NOT NULL,
    id                  bigint GENERATED ALWAYS AS IDENTITY,
    from_seq            bigint NOT NULL,
    content             bytea NOT NULL,
    made_from_version   bigint NOT NULL,
    request_id          uuid NOT NULL,
    input_tokens        bigint NOT NULL,
    output_tokens       bigint NOT NULL,
    cache_read_tokens   bigint NOT NULL,
    cache_write_tokens  bigint NOT NULL,
    created_at          bigint NOT NULL,
    PRIMARY KEY (conversation_id, through_seq)
);

-- Lookups by run id alone (`Store::run`, checkpoints of a run): not unique,
-- so a sharded engine may keep it per shard.
CREATE INDEX runs_by_run_id ON runs (run_id);
-- Runs of a request (`prune`, `ls runs`).
CREATE INDEX runs_by_request ON runs (conversation_id, request_id);
-- Requests of a conversation, newest first (`ls requests --conversation`).
CREATE INDEX requests_by_conversation ON requests (conversation_id, created_at);
-- Requests by age, for `prune` and `ls requests`.
CREATE INDEX requests_by_created ON requests (created_at);
-- Conversations of a namespace, newest first.
CREATE INDEX conversations_by_namespace ON conversations (namespace, created_at);
-- The request ids of a conversation, deleted with it (`prune`).
CREATE INDEX request_ids_by_conversation ON request_ids (conversation_id);
-- Held admissions only, for `ls --stuck` and `doctor`.
CREATE INDEX admissions_held ON admissions (updated_at) WHERE active_request_id IS NOT NULL;
