-- A tool call's result, in a group transaction with others. A lone result
-- is one fenced `UPDATE` (`tool_result.rs`), with no view; here each row's
-- trigger makes that update itself, after skipping (`RAISE(IGNORE)`) a row
-- whose owner was replaced or whose call awaits no result: the writer then
-- runs that result alone to name the refusal.
CREATE VIEW tool_result_batches (
    step, conversation_id, request_id, run_id, revision, turn, call_id, status, result,
    result_parts, now
) AS SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL WHERE 0;

CREATE TRIGGER tool_result_batch INSTEAD OF INSERT ON tool_result_batches
BEGIN
    SELECT RAISE(IGNORE)
    WHERE NOT EXISTS (SELECT 1 FROM admissions
                      WHERE conversation_id = NEW.conversation_id AND revision = NEW.revision
                        AND run_id = NEW.run_id AND active_request_id = NEW.request_id)
       OR NOT EXISTS (SELECT 1 FROM tool_calls
                      WHERE request_id = NEW.request_id AND turn = NEW.turn
                        AND call_id = NEW.call_id AND status = 'requested');
    UPDATE tool_calls SET status = NEW.status, result = NEW.result,
        result_parts = NEW.result_parts, completed_at = NEW.now
    WHERE request_id = NEW.request_id AND turn = NEW.turn AND call_id = NEW.call_id
      AND status = 'requested';
END;
