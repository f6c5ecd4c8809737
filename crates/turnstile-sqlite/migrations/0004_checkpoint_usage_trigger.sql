-- Fewer statements per durable step (issue 7). An active admission reports
-- the usage of its run's latest checkpoint (what `recovery_usage` reads) and
-- the time of its latest write (what `ls --stuck` ages by). Each turn used to
-- write both with a separate `UPDATE admissions` that doubled as its fence;
-- now the checkpoint write itself is fenced (`turns.rs`: it inserts only
-- while the admission still names the writer's run and revision) and these
-- triggers carry its values to the admission inside the same statement.
-- Checkpoints are only ever inserted (a rewritten turn is `INSERT OR
-- REPLACE`, which deletes and inserts), so one trigger sees every write.
--
-- A checkpoint of any other run (a replaced owner's, or one written after the
-- admission was released) changes nothing here.

CREATE TRIGGER checkpoint_reaches_admission AFTER INSERT ON loop_checkpoints
BEGIN
    UPDATE admissions
    SET input_tokens = NEW.input_tokens, output_tokens = NEW.output_tokens,
        cache_read_tokens = NEW.cache_read_tokens, cache_write_tokens = NEW.cache_write_tokens,
        updated_at = NEW.created_at
    WHERE conversation_id = (SELECT q.conversation_id FROM runs r
                             JOIN requests q ON q.request_id = r.request_id
                             WHERE r.run_id = NEW.run_id)
      AND run_id = NEW.run_id;
END;

-- A tool result is activity too: a turn whose tools run for long is not
-- stuck while its results keep arriving.
CREATE TRIGGER tool_result_reaches_admission AFTER UPDATE OF status ON tool_calls
WHEN NEW.completed_at IS NOT NULL
BEGIN
    UPDATE admissions SET updated_at = NEW.completed_at
    WHERE conversation_id = (SELECT conversation_id FROM requests
                             WHERE request_id = NEW.request_id)
      AND active_request_id = NEW.request_id;
END;
