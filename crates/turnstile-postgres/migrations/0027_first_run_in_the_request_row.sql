-- A request's first run, and that run's latest checkpoint, live in the
-- request's own row when the run carries the request's id (as the engine's
-- first run does): a one-turn request writes no `runs` and no
-- `loop_checkpoints` row, with their index entries, foreign-key checks and
-- dead row versions. That run's earlier checkpoints are in
-- `first_run_checkpoints`. Runs after the first (a resume, a recovery, a
-- take-over), and runs that carry an id of their own, stay in `runs` with
-- their checkpoints in `loop_checkpoints`. `all_runs` and `all_checkpoints`
-- read every place as one. Rows written before this migration stay where
-- they are, so it copies nothing (the columns are added without a default:
-- no table is rewritten). As SQLite's 0020.

-- The folded run: NULL `run_status` when the request's runs are all in
-- `runs`. A first run has no fingerprint of its own (its admission holds
-- it), no run it resumed, no agent or budget change.
ALTER TABLE requests
    ADD COLUMN run_status text
        CHECK (run_status IN ('running', 'completed', 'failed', 'superseded', 'abandoned')),
    ADD COLUMN run_error bytea,
    ADD COLUMN run_ended_at bigint,
    -- Its latest checkpoint: NULL `phase` when it has none.
    ADD COLUMN turn bigint,
    ADD COLUMN phase text,
    ADD COLUMN input_tokens bigint,
    ADD COLUMN output_tokens bigint,
    ADD COLUMN cache_read_tokens bigint,
    ADD COLUMN cache_write_tokens bigint,
    ADD COLUMN tool_calls_count bigint,
    ADD COLUMN reports_count bigint,
    ADD COLUMN message_count bigint,
    ADD COLUMN checkpoint_at bigint;

-- The folded run's checkpoints of turns before its latest.
CREATE TABLE first_run_checkpoints (
    conversation_id     uuid NOT NULL,
    request_id          uuid NOT NULL,
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
    PRIMARY KEY (conversation_id, request_id, turn),
    FOREIGN KEY (conversation_id, request_id) REFERENCES requests ON DELETE CASCADE
);

-- Every run, folded or not, as `runs` holds them. The folded runs are
-- reached through `request_ids`, so that a run looked up by its id alone
-- finds its request by that table's key.
CREATE VIEW all_runs (conversation_id, run_id, request_id, resumed_from, status, error,
    started_at, ended_at, agent_fingerprint, replaced_fingerprint, budget_change) AS
SELECT k.conversation_id, k.request_id, k.request_id, NULL::uuid, q.run_status, q.run_error,
    q.created_at, q.run_ended_at, NULL::text, NULL::text, NULL::jsonb
FROM request_ids k
JOIN requests q ON q.conversation_id = k.conversation_id AND q.request_id = k.request_id
WHERE q.run_status IS NOT NULL
UNION ALL
SELECT conversation_id, run_id, request_id, resumed_from, status, error, started_at, ended_at,
    agent_fingerprint, replaced_fingerprint, budget_change
FROM runs;

-- Every checkpoint, folded or not, as `loop_checkpoints` holds them.
CREATE VIEW all_checkpoints (conversation_id, run_id, turn, phase, input_tokens, output_tokens,
    cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count, message_count,
    created_at) AS
SELECT conversation_id, request_id, turn, phase, input_tokens, output_tokens, cache_read_tokens,
    cache_write_tokens, tool_calls_count, reports_count, message_count, checkpoint_at
FROM requests WHERE phase IS NOT NULL
UNION ALL
SELECT conversation_id, request_id, turn, phase, input_tokens, output_tokens, cache_read_tokens,
    cache_write_tokens, tool_calls_count, reports_count, message_count, created_at
FROM first_run_checkpoints
UNION ALL
SELECT conversation_id, run_id, turn, phase, input_tokens, output_tokens, cache_read_tokens,
    cache_write_tokens, tool_calls_count, reports_count, message_count, created_at
FROM loop_checkpoints;

-- A folded run that fails is logged as a run in `runs` is (kind 6, 0022).
CREATE FUNCTION event_first_run_stopped() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM log_event(NEW.conversation_id, 6::smallint, NEW.request_id, NEW.request_id,
        NULL, NULL, NULL, COALESCE(NEW.run_ended_at, event_clock()));
    RETURN NULL;
END $$;
CREATE TRIGGER event_first_run_stopped AFTER UPDATE OF run_status ON requests
FOR EACH ROW WHEN (NEW.run_status = 'failed' AND OLD.run_status <> 'failed')
EXECUTE FUNCTION event_first_run_stopped();

-- A step writes a folded run's row from its statement's snapshot, taken
-- before the step waited for the admission's lock. When another statement
-- of the same run changed the row meanwhile (a first attempt still running
-- when its retry or the next step started), the step stops here as a
-- serialization failure, which the store retries with a fresh snapshot.
CREATE FUNCTION turnstile_row_moved() RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'turnstile: a run''s row changed while this step waited for its lock'
        USING ERRCODE = 'serialization_failure';
END $$;

-- A turn's end (kind 9, 0024) of a folded run is logged by the step that
-- writes it (`src/steps/turn_write.rs`): the turn's checkpoint may move from
-- the request's row to `first_run_checkpoints` as it turns `ready`.
