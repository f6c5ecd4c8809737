-- Many steps in one statement (issue 14). Under concurrency the group
-- writer commits many sessions' steps in one transaction; sending each step
-- as a statement of its own still costs one round trip to sqlx's worker
-- thread per step. Here the steps of one kind in a group transaction go as
-- one statement: `INSERT INTO <kind>_batches … SELECT … FROM json_each(?)`,
-- one row per step. Each row's trigger checks what its step's own trigger
-- would refuse and, if it would, skips that row alone (`RAISE(IGNORE)`:
-- the row writes nothing and returns no `RETURNING` row, the statement
-- goes on with the next); otherwise it inserts the row into the step's own
-- view (migrations 0005 and 0006), whose trigger writes the step. A step
-- without a returned row is then run alone, as its own statement, which
-- names the refusal. The checks are repeated, not moved: the step views
-- keep every check of their own.
--
-- `step` is the step's position in the batch; it is what `RETURNING` gives
-- back, with what the step's caller is answered.

CREATE VIEW turn_write_batches (
    step, conversation_id, request_id, run_id, revision, now,
    checkpoints, reports, turn, first_seq, messages, calls, compact, failure
) AS SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
     WHERE 0;

CREATE TRIGGER turn_write_batch INSTEAD OF INSERT ON turn_write_batches
BEGIN
    SELECT RAISE(IGNORE)
    WHERE NOT EXISTS (SELECT 1 FROM admissions
                      WHERE conversation_id = NEW.conversation_id AND revision = NEW.revision
                        AND run_id = NEW.run_id AND active_request_id = NEW.request_id);
    INSERT INTO turn_writes (conversation_id, request_id, run_id, revision, now,
        checkpoints, reports, turn, first_seq, messages, calls, compact, failure)
    VALUES (NEW.conversation_id, NEW.request_id, NEW.run_id, NEW.revision, NEW.now,
        NEW.checkpoints, NEW.reports, NEW.turn, NEW.first_seq, NEW.messages, NEW.calls,
        NEW.compact, NEW.failure);
END;

CREATE VIEW commit_batches (
    step, conversation_id, request_id, run_id, revision, now, checkpoints, reports,
    answer, final_seq
) AS SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL WHERE 0;

CREATE TRIGGER commit_batch INSTEAD OF INSERT ON commit_batches
BEGIN
    SELECT RAISE(IGNORE)
    WHERE NOT EXISTS (SELECT 1 FROM admissions
                      WHERE conversation_id = NEW.conversation_id AND revision = NEW.revision
                        AND run_id = NEW.run_id AND active_request_id = NEW.request_id);
    INSERT INTO commits (conversation_id, request_id, run_id, revision, now, checkpoints,
        reports, answer, final_seq)
    VALUES (NEW.conversation_id, NEW.request_id, NEW.run_id, NEW.revision, NEW.now,
        NEW.checkpoints, NEW.reports, NEW.answer, NEW.final_seq);
END;

CREATE VIEW claim_batches (
    step, conversation_id, request_id, run_id, expected_revision, input_sha256,
    agent_fingerprint, now, input, checkpoints, reports, deadline_at
) AS SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL WHERE 0;

-- Skipped as well: a request id of a deleted conversation, which the
-- tombstone trigger of 0008 would refuse by ending the whole statement.
CREATE TRIGGER claim_batch INSTEAD OF INSERT ON claim_batches
BEGIN
    SELECT RAISE(IGNORE)
    WHERE EXISTS (SELECT 1 FROM requests WHERE request_id = NEW.request_id)
       OR EXISTS (SELECT 1 FROM deleted_requests WHERE request_id = NEW.request_id)
       OR NOT EXISTS (SELECT 1 FROM admissions
                      WHERE conversation_id = NEW.conversation_id
                        AND revision = NEW.expected_revision AND active_request_id IS NULL);
    INSERT INTO claims (conversation_id, request_id, run_id, expected_revision, input_sha256,
        agent_fingerprint, now, input, checkpoints, reports, deadline_at)
    VALUES (NEW.conversation_id, NEW.request_id, NEW.run_id, NEW.expected_revision,
        NEW.input_sha256, NEW.agent_fingerprint, NEW.now, NEW.input, NEW.checkpoints,
        NEW.reports, NEW.deadline_at);
END;

-- A tool call's result. Its single statement is a fenced `UPDATE` (no
-- view), so the row's trigger makes that update itself, after skipping a
-- row whose owner was replaced or whose call awaits no result.
CREATE VIEW tool_result_batches (
    step, conversation_id, request_id, run_id, revision, turn, call_id, status, result, now
) AS SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL WHERE 0;

CREATE TRIGGER tool_result_batch INSTEAD OF INSERT ON tool_result_batches
BEGIN
    SELECT RAISE(IGNORE)
    WHERE NOT EXISTS (SELECT 1 FROM admissions
                      WHERE conversation_id = NEW.conversation_id AND revision = NEW.revision
                        AND run_id = NEW.run_id AND active_request_id = NEW.request_id)
       OR NOT EXISTS (SELECT 1 FROM tool_calls
                      WHERE request_id = NEW.request_id AND turn = NEW.turn
                        AND call_id = NEW.call_id AND status = 'requested');
    UPDATE tool_calls SET status = NEW.status, result = NEW.result, completed_at = NEW.now
    WHERE request_id = NEW.request_id AND turn = NEW.turn AND call_id = NEW.call_id
      AND status = 'requested';
END;
