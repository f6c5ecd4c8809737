-- A request's first run, and that run's latest checkpoint, live in the
-- request's own row when the run carries the request's id (as the engine's
-- first run does): a one-turn request writes one bookkeeping row instead of
-- three, and no `runs_by_request` entry. Runs after the first (a resume, a
-- recovery, a take-over), and runs that carry an id of their own, stay in
-- `runs`; checkpoints other than the folded run's latest stay in
-- `loop_checkpoints`. `all_runs` and `all_checkpoints` read both places as
-- one. Rows written before this migration stay where they are.

-- The steps name the tables rebuilt here; they are created again at open.
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

-- The folded run: NULL `run_status` when the request's runs are all in
-- `runs`. A first run has no fingerprint of its own (its admission holds
-- it), no run it resumed, no agent or budget change.
ALTER TABLE requests ADD COLUMN run_status TEXT
    CHECK (run_status IN ('running', 'completed', 'failed', 'superseded', 'abandoned'));
ALTER TABLE requests ADD COLUMN run_error TEXT;
ALTER TABLE requests ADD COLUMN run_ended_at INTEGER;
-- Its latest checkpoint: NULL `phase` when it has none.
ALTER TABLE requests ADD COLUMN turn INTEGER;
ALTER TABLE requests ADD COLUMN phase TEXT;
ALTER TABLE requests ADD COLUMN input_tokens INTEGER;
ALTER TABLE requests ADD COLUMN output_tokens INTEGER;
ALTER TABLE requests ADD COLUMN cache_read_tokens INTEGER;
ALTER TABLE requests ADD COLUMN cache_write_tokens INTEGER;
ALTER TABLE requests ADD COLUMN tool_calls_count INTEGER;
ALTER TABLE requests ADD COLUMN reports_count INTEGER;
ALTER TABLE requests ADD COLUMN message_count INTEGER;
ALTER TABLE requests ADD COLUMN checkpoint_at INTEGER;

-- A folded run's earlier checkpoints have no `runs` row to reference: the
-- table loses its foreign key, and triggers delete what the cascade did.
CREATE TABLE loop_checkpoints_new (
    run_id              BLOB NOT NULL,
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
INSERT INTO loop_checkpoints_new SELECT run_id, turn, phase, input_tokens, output_tokens,
    cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count, message_count,
    created_at
FROM loop_checkpoints;
DROP TABLE loop_checkpoints;
ALTER TABLE loop_checkpoints_new RENAME TO loop_checkpoints;

CREATE TRIGGER run_drops_checkpoints AFTER DELETE ON runs
BEGIN
    DELETE FROM loop_checkpoints WHERE run_id = OLD.run_id;
END;

CREATE TRIGGER request_drops_checkpoints AFTER DELETE ON requests
WHEN OLD.run_status IS NOT NULL
BEGIN
    DELETE FROM loop_checkpoints WHERE run_id = OLD.request_id;
END;

-- Every run, folded or not, as `runs` held them.
CREATE VIEW all_runs (run_id, request_id, resumed_from, status, error, started_at, ended_at,
    agent_fingerprint, replaced_fingerprint, budget_change) AS
SELECT request_id, request_id, CAST(NULL AS BLOB), run_status, run_error, created_at,
    run_ended_at, CAST(NULL AS TEXT), CAST(NULL AS TEXT), CAST(NULL AS TEXT)
FROM requests WHERE run_status IS NOT NULL
UNION ALL
SELECT run_id, request_id, resumed_from, status, error, started_at, ended_at, agent_fingerprint,
    replaced_fingerprint, budget_change
FROM runs;

-- Every checkpoint, folded or not, as `loop_checkpoints` held them.
CREATE VIEW all_checkpoints (run_id, turn, phase, input_tokens, output_tokens,
    cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count, message_count,
    created_at) AS
SELECT request_id, turn, phase, input_tokens, output_tokens, cache_read_tokens,
    cache_write_tokens, tool_calls_count, reports_count, message_count, checkpoint_at
FROM requests WHERE phase IS NOT NULL
UNION ALL
SELECT run_id, turn, phase, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
    tool_calls_count, reports_count, message_count, created_at
FROM loop_checkpoints;
