-- A recovery's claim of an active admission for a new run that continues
-- `from_run`: the compare-and-swap, the run superseded, the new run (with
-- the new agent's fingerprint when it changes the agent, and the change of
-- the request's budget when it changes that: the request takes the new
-- one) and a copy of the latest checkpoint of the run it continues (one
-- small row, no messages copied). The latest checkpoint of `from_run` in one of `refuse_phases` (a
-- JSON array of phase names, NULL for none) refuses the claim: a turn was
-- in flight; unless it is a tool round at `resolved_turn` with
-- `resolved_answered` calls answered, as the caller read and resolved it.
CREATE VIEW recovery_claims (
    conversation_id, request_id, from_run, new_run, expected_revision, refuse_phases, now,
    -- the turn of a tool round in flight the claim does not refuse, or NULL,
    -- and how many of its calls were answered when the caller read it
    resolved_turn, resolved_answered,
    -- the new run's agent fingerprint when it changes the agent, or NULL
    agent_fingerprint,
    -- when the run changes the request's budget: the new budget and the
    -- change (JSON), or NULL
    budget, budget_change
) AS SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL WHERE 0;

CREATE TRIGGER recovery_claim INSTEAD OF INSERT ON recovery_claims
BEGIN
    -- Fence.
    SELECT RAISE(ABORT, 'turnstile: admission moved')
    WHERE NOT EXISTS (SELECT 1 FROM admissions
                      WHERE conversation_id = NEW.conversation_id
                        AND revision = NEW.expected_revision
                        AND active_request_id = NEW.request_id AND run_id = NEW.from_run);
    -- Check.
    SELECT RAISE(ABORT, 'turnstile: turn in flight')
    FROM (SELECT turn, phase FROM all_checkpoints WHERE run_id = NEW.from_run
          ORDER BY turn DESC LIMIT 1) AS latest
    WHERE latest.phase IN (SELECT value FROM json_each(NEW.refuse_phases))
      AND NOT (latest.phase = 'tools_in_flight' AND latest.turn IS NEW.resolved_turn
               AND (SELECT COUNT(*) FROM tool_calls
                    WHERE request_id = NEW.request_id AND turn = NEW.resolved_turn
                      AND status <> 'requested') = NEW.resolved_answered);
    -- Write. The new run first: it records the fingerprint the admission held.
    INSERT INTO runs (run_id, request_id, resumed_from, status, started_at, agent_fingerprint,
        replaced_fingerprint, budget_change)
    SELECT NEW.new_run, NEW.request_id, NEW.from_run, 'running', NEW.now, NEW.agent_fingerprint,
        CASE WHEN NEW.agent_fingerprint IS NOT NULL THEN agent_fingerprint END,
        NEW.budget_change
    FROM admissions WHERE conversation_id = NEW.conversation_id;
    UPDATE requests SET budget = NEW.budget
    WHERE request_id = NEW.request_id AND NEW.budget_change IS NOT NULL;
    UPDATE admissions SET run_id = NEW.new_run, revision = revision + 1, updated_at = NEW.now,
        agent_fingerprint = COALESCE(NEW.agent_fingerprint, agent_fingerprint)
    WHERE conversation_id = NEW.conversation_id AND revision = NEW.expected_revision
      AND run_id = NEW.from_run;
    UPDATE runs SET status = 'superseded', ended_at = COALESCE(ended_at, NEW.now)
    WHERE run_id = NEW.from_run AND status IN ('running', 'failed');
    UPDATE requests
    SET run_state = 3 /* superseded */,
        run_ended_early_at = COALESCE(run_ended_early_at, NEW.now)
    WHERE request_id = NEW.request_id AND NEW.from_run = NEW.request_id
      AND run_status IN ('running', 'failed');
    INSERT INTO loop_checkpoints (run_id, turn, phase, input_tokens, output_tokens,
        cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count, message_count,
        created_at)
    SELECT NEW.new_run, turn, phase, input_tokens, output_tokens, cache_read_tokens,
        cache_write_tokens, tool_calls_count, reports_count, message_count, NEW.now
    FROM all_checkpoints WHERE run_id = NEW.from_run ORDER BY turn DESC LIMIT 1;
END;
