-- Human approval of tool calls, wall-clock deadlines kept with their
-- request, and the agent a run continued its request with.

-- One row per tool call a run stopped to ask about: awaiting -> approved |
-- rejected, with the decision's time. What runs is what this table says
-- was approved, never what a client sends back. A row stays after its turn
-- ends: it is the record of who was asked and what was decided.
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

-- Awaiting calls only (a partial index: a decided call costs nothing), for
-- the store-wide listing of what waits (`turnstile approvals`).
CREATE INDEX approvals_awaiting ON approvals (requested_at) WHERE status = 'awaiting';

-- A wall-clock deadline given with the request (Unix milliseconds): every
-- run of it, in any process, stops there.
ALTER TABLE requests ADD COLUMN deadline_at INTEGER;

-- Set only on a run that continued its request with another agent: its
-- fingerprint, and the one the request was held with before.
ALTER TABLE runs ADD COLUMN agent_fingerprint TEXT;
ALTER TABLE runs ADD COLUMN replaced_fingerprint TEXT;

-- The claim views of migration 0005 again, with the new columns (dropping
-- a view drops its trigger).
DROP VIEW claims;
DROP VIEW recovery_claims;

-- A new request's claim (as in 0005), storing its deadline.
CREATE VIEW claims (
    conversation_id, request_id, run_id, expected_revision, input_sha256, agent_fingerprint,
    now,
    -- the input, as a one-message array
    input,
    checkpoints, reports,
    -- Unix milliseconds, or NULL
    deadline_at
) AS SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL WHERE 0;

CREATE TRIGGER claim INSTEAD OF INSERT ON claims
BEGIN
    -- Request ids are unique across the store: a known one is answered
    -- from its row (a replay, or a refusal), whatever the admission says.
    SELECT RAISE(ABORT, 'turnstile: request exists')
    WHERE EXISTS (SELECT 1 FROM requests WHERE request_id = NEW.request_id);
    SELECT RAISE(ABORT, 'turnstile: admission moved')
    WHERE NOT EXISTS (SELECT 1 FROM admissions
                      WHERE conversation_id = NEW.conversation_id
                        AND revision = NEW.expected_revision AND active_request_id IS NULL);
    UPDATE admissions
    SET active_request_id = NEW.request_id, input_sha256 = NEW.input_sha256,
        run_id = NEW.run_id, agent_fingerprint = NEW.agent_fingerprint,
        input_tokens = 0, output_tokens = 0, cache_read_tokens = 0, cache_write_tokens = 0,
        summary_passes = 0, summary_from_seq = NULL, summary_through_seq = NULL,
        summary_version = NULL, summary_prompt_sha256 = NULL,
        revision = revision + 1, updated_at = NEW.now
    WHERE conversation_id = NEW.conversation_id AND revision = NEW.expected_revision
      AND active_request_id IS NULL;
    INSERT INTO requests (request_id, conversation_id, input_sha256, status, created_at,
        deadline_at)
    VALUES (NEW.request_id, NEW.conversation_id, NEW.input_sha256, 'active', NEW.now,
        NEW.deadline_at);
    INSERT INTO runs (run_id, request_id, status, started_at)
    VALUES (NEW.run_id, NEW.request_id, 'running', NEW.now);
    INSERT INTO run_messages (request_id, seq, run_id, turn, role, content, meta)
    SELECT NEW.request_id, key, NEW.run_id, 0, value ->> '$.role', value ->> '$.content',
        NULLIF(json_remove(value, '$.role', '$.content'), '{}')
    FROM json_each(NEW.input);
    INSERT OR REPLACE INTO loop_checkpoints (run_id, turn, phase, input_tokens, output_tokens,
        cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count, message_count,
        created_at)
    SELECT NEW.run_id, value ->> '$.turn', value ->> '$.phase', value ->> '$.input',
        value ->> '$.output', value ->> '$.cache_read', value ->> '$.cache_write',
        value ->> '$.tool_calls', value ->> '$.reports', value ->> '$.messages', NEW.now
    FROM json_each(NEW.checkpoints) ORDER BY key;
    INSERT INTO verification_reports (request_id, seq, turn, passed, detail)
    SELECT NEW.request_id, value ->> '$.seq', value ->> '$.turn', value ->> '$.passed',
        value ->> '$.detail'
    FROM json_each(NEW.reports) WHERE true
    ON CONFLICT (request_id, seq) DO NOTHING;
END;

-- A recovery's claim (as in 0005), taking the new agent's fingerprint when
-- it changes the agent.
CREATE VIEW recovery_claims (
    conversation_id, request_id, from_run, new_run, expected_revision, refuse_phases, now,
    -- the new run's agent fingerprint when it changes the agent, or NULL
    agent_fingerprint
) AS SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL WHERE 0;

CREATE TRIGGER recovery_claim INSTEAD OF INSERT ON recovery_claims
BEGIN
    SELECT RAISE(ABORT, 'turnstile: admission moved')
    WHERE NOT EXISTS (SELECT 1 FROM admissions
                      WHERE conversation_id = NEW.conversation_id
                        AND revision = NEW.expected_revision
                        AND active_request_id = NEW.request_id AND run_id = NEW.from_run);
    SELECT RAISE(ABORT, 'turnstile: turn in flight')
    WHERE (SELECT phase FROM loop_checkpoints WHERE run_id = NEW.from_run
           ORDER BY turn DESC LIMIT 1) IN (SELECT value FROM json_each(NEW.refuse_phases));
    -- The new run first: it records the fingerprint the admission held.
    INSERT INTO runs (run_id, request_id, resumed_from, status, started_at, agent_fingerprint,
        replaced_fingerprint)
    SELECT NEW.new_run, NEW.request_id, NEW.from_run, 'running', NEW.now, NEW.agent_fingerprint,
        CASE WHEN NEW.agent_fingerprint IS NOT NULL THEN agent_fingerprint END
    FROM admissions WHERE conversation_id = NEW.conversation_id;
    UPDATE admissions SET run_id = NEW.new_run, revision = revision + 1, updated_at = NEW.now,
        agent_fingerprint = COALESCE(NEW.agent_fingerprint, agent_fingerprint)
    WHERE conversation_id = NEW.conversation_id AND revision = NEW.expected_revision
      AND run_id = NEW.from_run;
    UPDATE runs SET status = 'superseded', ended_at = COALESCE(ended_at, NEW.now)
    WHERE run_id = NEW.from_run AND status IN ('running', 'failed');
    INSERT INTO loop_checkpoints (run_id, turn, phase, input_tokens, output_tokens,
        cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count, message_count,
        created_at)
    SELECT NEW.new_run, turn, phase, input_tokens, output_tokens, cache_read_tokens,
        cache_write_tokens, tool_calls_count, reports_count, message_count, NEW.now
    FROM loop_checkpoints WHERE run_id = NEW.from_run ORDER BY turn DESC LIMIT 1;
END;
