-- A request's first run, and that run's latest checkpoint, live in the
-- request's own row when the run carries the request's id (as the engine's
-- first run does): a one-turn request writes one bookkeeping row instead of
-- three, and no `runs_by_request` entry. That run's earlier checkpoints are
-- in `first_run_checkpoints`. Runs after the first (a resume, a recovery, a
-- take-over), and runs that carry an id of their own, stay in `runs` with
-- their checkpoints in `loop_checkpoints`. `all_runs` and `all_checkpoints`
-- read every place as one. Rows written before this migration stay where
-- they are, so it copies nothing.

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

-- The folded run's checkpoints of turns before its latest.
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
SELECT request_id, turn, phase, input_tokens, output_tokens, cache_read_tokens,
    cache_write_tokens, tool_calls_count, reports_count, message_count, created_at
FROM first_run_checkpoints
UNION ALL
SELECT run_id, turn, phase, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
    tool_calls_count, reports_count, message_count, created_at
FROM loop_checkpoints;
