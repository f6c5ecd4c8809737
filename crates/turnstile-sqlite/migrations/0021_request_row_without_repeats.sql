-- A request's row stores its status words as small codes, and no value it
-- would repeat: a completed request's row, with its folded first run and
-- that run's final checkpoint, shrinks from 161 bytes to 107.
--
-- Each word and each repeat is read, as before, from a generated column of
-- its old name that is computed when read and takes no space (VIRTUAL):
-- every read of the table stays as it was. The steps write the stored
-- columns:
--
-- * `state`: the request's status, 0 active, 1 completed, 2 abandoned;
-- * `committed_by`: the committing run's id when it is not the request's
--   own (NULL when the request's first run committed it, or none did);
-- * `run_state`: the folded run's status, 0 running, 1 completed, 2 failed,
--   3 superseded, 4 abandoned (NULL: no folded run);
-- * `run_ended_early_at`: the folded run's end when it is not the
--   request's completion (a failure, a take-over);
-- * `checkpoint_phase`: the folded checkpoint's phase, in the order of
--   `CheckpointPhase` (NULL: no checkpoint);
-- * `checkpoint_early_at`: that checkpoint's time when it was not written
--   by the commit.
--
-- A code out of range cannot be stored (the CHECKs); read from a damaged
-- file it reads as a word no status or phase has, which the store refuses
-- as damage rather than taking the row for another. A word this migration
-- finds damaged stops it the same way, leaving the file as it was: SQLite
-- checks every CHECK of the table when a column with one is added (the old
-- status words'), and a phase word without a code maps to -1.
--
-- The update and each dropped column rewrite the table's rows in this
-- migration's transaction (8 s for the 650,000 requests of a 0.97 GB
-- file, docs/performance.md). A column is dropped once no view or trigger
-- names it: the steps are installed again when the store opens
-- (`step_set`), and the two schema views are made again below, unchanged.
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
DROP VIEW all_runs;
DROP VIEW all_checkpoints;

ALTER TABLE requests ADD COLUMN state INTEGER NOT NULL DEFAULT 0 CHECK (state BETWEEN 0 AND 2);
ALTER TABLE requests ADD COLUMN committed_by BLOB;
ALTER TABLE requests ADD COLUMN run_state INTEGER CHECK (run_state BETWEEN 0 AND 4);
ALTER TABLE requests ADD COLUMN run_ended_early_at INTEGER;
ALTER TABLE requests ADD COLUMN checkpoint_phase INTEGER CHECK (checkpoint_phase BETWEEN 0 AND 5);
ALTER TABLE requests ADD COLUMN checkpoint_early_at INTEGER;

-- The steps (and the update below) write a phase by its word; its code is its
-- position here.
CREATE VIEW checkpoint_phases (code, word) AS
VALUES (0, 'turn_in_flight'), (1, 'tools_in_flight'), (2, 'model_pending'),
    (3, 'tools_pending'), (4, 'ready'), (5, 'completed');

UPDATE requests
SET state = CASE status WHEN 'active' THEN 0 WHEN 'completed' THEN 1 WHEN 'abandoned' THEN 2
        ELSE -1 END,
    committed_by = NULLIF(committed_run_id, request_id),
    run_state = CASE run_status WHEN 'running' THEN 0 WHEN 'completed' THEN 1
        WHEN 'failed' THEN 2 WHEN 'superseded' THEN 3 WHEN 'abandoned' THEN 4
        ELSE IIF(run_status IS NULL, NULL, -1) END,
    run_ended_early_at = IIF(run_status IN ('completed', 'abandoned')
        AND run_ended_at = completed_at, NULL, run_ended_at),
    checkpoint_phase = IIF(phase IS NULL, NULL,
        COALESCE((SELECT code FROM checkpoint_phases WHERE word = phase), -1)),
    checkpoint_early_at = IIF(checkpoint_at = completed_at, NULL, checkpoint_at);

ALTER TABLE requests DROP COLUMN status;
ALTER TABLE requests DROP COLUMN committed_run_id;
ALTER TABLE requests DROP COLUMN run_status;
ALTER TABLE requests DROP COLUMN run_ended_at;
ALTER TABLE requests DROP COLUMN phase;
ALTER TABLE requests DROP COLUMN checkpoint_at;

ALTER TABLE requests ADD COLUMN status TEXT NOT NULL GENERATED ALWAYS AS (
    CASE state WHEN 0 THEN 'active' WHEN 1 THEN 'completed' WHEN 2 THEN 'abandoned'
    ELSE 'state ' || state END) VIRTUAL;
ALTER TABLE requests ADD COLUMN committed_run_id BLOB GENERATED ALWAYS AS (
    IIF(state = 1, COALESCE(committed_by, request_id), NULL)) VIRTUAL;
ALTER TABLE requests ADD COLUMN run_status TEXT GENERATED ALWAYS AS (
    CASE run_state WHEN 0 THEN 'running' WHEN 1 THEN 'completed' WHEN 2 THEN 'failed'
    WHEN 3 THEN 'superseded' WHEN 4 THEN 'abandoned' ELSE 'run state ' || run_state END) VIRTUAL;
ALTER TABLE requests ADD COLUMN run_ended_at INTEGER GENERATED ALWAYS AS (
    COALESCE(run_ended_early_at, IIF(run_state IN (1, 4), completed_at, NULL))) VIRTUAL;
ALTER TABLE requests ADD COLUMN phase TEXT GENERATED ALWAYS AS (
    CASE checkpoint_phase WHEN 0 THEN 'turn_in_flight' WHEN 1 THEN 'tools_in_flight'
    WHEN 2 THEN 'model_pending' WHEN 3 THEN 'tools_pending' WHEN 4 THEN 'ready'
    WHEN 5 THEN 'completed' ELSE 'phase ' || checkpoint_phase END) VIRTUAL;
ALTER TABLE requests ADD COLUMN checkpoint_at INTEGER GENERATED ALWAYS AS (
    IIF(checkpoint_phase IS NULL, NULL, COALESCE(checkpoint_early_at, completed_at))) VIRTUAL;

-- As migration 0020 made them.
CREATE VIEW all_runs (run_id, request_id, resumed_from, status, error, started_at, ended_at,
    agent_fingerprint, replaced_fingerprint, budget_change) AS
SELECT request_id, request_id, CAST(NULL AS BLOB), run_status, run_error, created_at,
    run_ended_at, CAST(NULL AS TEXT), CAST(NULL AS TEXT), CAST(NULL AS TEXT)
FROM requests WHERE run_status IS NOT NULL
UNION ALL
SELECT run_id, request_id, resumed_from, status, error, started_at, ended_at, agent_fingerprint,
    replaced_fingerprint, budget_change
FROM runs;

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
