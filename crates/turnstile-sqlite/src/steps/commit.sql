-- A request's commit, fenced: the committed turn's checkpoint (phase
-- `completed`, the outcome's totals), the admission released, the request
-- completed with where its messages start and end in the transcript (they
-- are there already, after the committed entries), the final answer
-- appended (at `first_seq + final_seq`), the conversation's version bumped
-- and its transcript's length moved past the answer, the run completed.
CREATE VIEW commits (
    conversation_id, request_id, run_id, revision, now,
    -- the committed turn's checkpoint
    turn, phase, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
    tool_calls_count, reports_count, message_count,
    reports,
    -- the final answer, and its position in the request
    answer_role, answer_content, answer_meta, final_seq
) AS SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
     NULL, NULL, NULL, NULL, NULL
     WHERE 0;

CREATE TRIGGER commit_request INSTEAD OF INSERT ON commits
BEGIN
    -- Fence.
    SELECT RAISE(ABORT, 'turnstile: fenced')
    WHERE NOT EXISTS (SELECT 1 FROM admissions
                      WHERE conversation_id = NEW.conversation_id AND revision = NEW.revision
                        AND run_id = NEW.run_id AND active_request_id = NEW.request_id);
    -- Write. The committed turn's checkpoint: a folded run's (`claim.sql`) in
    -- the request's row, the one there before moving to
    -- `first_run_checkpoints` first when it is of an earlier turn; a run of
    -- its own's in `loop_checkpoints`.
    INSERT OR REPLACE INTO first_run_checkpoints (request_id, turn, phase, input_tokens,
        output_tokens, cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count,
        message_count, created_at)
    SELECT request_id, turn, phase, input_tokens, output_tokens, cache_read_tokens,
        cache_write_tokens, tool_calls_count, reports_count, message_count, checkpoint_at
    FROM requests
    WHERE request_id = NEW.request_id AND NEW.run_id = NEW.request_id AND phase IS NOT NULL
      AND turn < NEW.turn;
    -- The row keeps the highest turn: a commit below it (never the
    -- engine's) goes among the earlier ones, as in `loop_checkpoints`.
    INSERT OR REPLACE INTO first_run_checkpoints (request_id, turn, phase, input_tokens,
        output_tokens, cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count,
        message_count, created_at)
    SELECT NEW.request_id, NEW.turn, NEW.phase, NEW.input_tokens, NEW.output_tokens,
        NEW.cache_read_tokens, NEW.cache_write_tokens, NEW.tool_calls_count, NEW.reports_count,
        NEW.message_count, NEW.now
    FROM requests
    WHERE request_id = NEW.request_id AND NEW.run_id = NEW.request_id AND turn > NEW.turn;
    UPDATE requests
    SET turn = NEW.turn,
        checkpoint_phase = COALESCE((SELECT code FROM checkpoint_phases
                                     WHERE word = NEW.phase), -1),
        input_tokens = NEW.input_tokens,
        output_tokens = NEW.output_tokens, cache_read_tokens = NEW.cache_read_tokens,
        cache_write_tokens = NEW.cache_write_tokens, tool_calls_count = NEW.tool_calls_count,
        reports_count = NEW.reports_count, message_count = NEW.message_count,
        -- its time is the completion's
        checkpoint_early_at = NULL
    WHERE request_id = NEW.request_id AND NEW.run_id = NEW.request_id
      AND (phase IS NULL OR turn <= NEW.turn);
    INSERT OR REPLACE INTO loop_checkpoints (run_id, turn, phase, input_tokens, output_tokens,
        cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count, message_count,
        created_at)
    SELECT NEW.run_id, NEW.turn, NEW.phase, NEW.input_tokens, NEW.output_tokens,
        NEW.cache_read_tokens, NEW.cache_write_tokens, NEW.tool_calls_count, NEW.reports_count,
        NEW.message_count, NEW.now
    WHERE NEW.run_id <> NEW.request_id;
    INSERT INTO verification_reports (request_id, seq, turn, passed, detail)
    SELECT NEW.request_id, value ->> '$.seq', value ->> '$.turn', value ->> '$.passed',
        value ->> '$.detail'
    FROM json_each(NEW.reports) WHERE NEW.reports IS NOT NULL
    ON CONFLICT (request_id, seq) DO NOTHING;
    UPDATE admissions
    SET active_request_id = NULL, input_sha256 = NULL, run_id = NULL, agent_fingerprint = NULL,
        input_tokens = 0, output_tokens = 0, cache_read_tokens = 0, cache_write_tokens = 0,
        summary_passes = 0, summary_from_seq = NULL, summary_through_seq = NULL,
        summary_version = NULL, summary_prompt_sha256 = NULL,
        -- the number of the request's settling event, kept in its row
        -- (one claimed before migration 0025 logs it in `events`)
        event_seq = event_seq + (SELECT admitted_event IS NOT NULL FROM requests
                                 WHERE request_id = NEW.request_id),
        revision = revision + 1, updated_at = NEW.now
    WHERE conversation_id = NEW.conversation_id AND revision = NEW.revision
      AND run_id = NEW.run_id;
    UPDATE requests
    SET state = 1 /* completed */, committed_by = NULLIF(NEW.run_id, NEW.request_id),
        -- a folded run that commits ends at the completion
        run_state = IIF(NEW.run_id = NEW.request_id, 1 /* completed */, run_state),
        run_ended_early_at = IIF(NEW.run_id = NEW.request_id, NULL, run_ended_early_at),
        conversation_version = (SELECT version + 1 FROM conversations
                                WHERE id = NEW.conversation_id),
        first_seq = (SELECT transcript_length FROM conversations WHERE id = NEW.conversation_id),
        end_seq = (SELECT c.transcript_length + COUNT(t.seq) + 1
                   FROM conversations c
                   LEFT JOIN transcript t
                       ON t.conversation_key = c.key AND t.seq >= c.transcript_length
                   WHERE c.id = NEW.conversation_id),
        completed_at = NEW.now,
        settled_event = IIF(admitted_event IS NULL, NULL,
                            (SELECT event_seq FROM admissions
                             WHERE conversation_id = NEW.conversation_id))
    WHERE request_id = NEW.request_id;
    INSERT INTO transcript (conversation_key, seq, request_id, role, content, meta)
    VALUES ((SELECT key FROM conversations WHERE id = NEW.conversation_id),
        (SELECT first_seq FROM requests WHERE request_id = NEW.request_id) + NEW.final_seq,
        NEW.request_id, NEW.answer_role, NEW.answer_content, NEW.answer_meta);
    UPDATE conversations
    SET version = version + 1,
        transcript_length = (SELECT end_seq FROM requests WHERE request_id = NEW.request_id)
    WHERE id = NEW.conversation_id;
    UPDATE runs SET status = 'completed', ended_at = NEW.now WHERE run_id = NEW.run_id;
END;

-- The commits of one group transaction as one statement (as claims are:
-- `claim.sql`).
CREATE VIEW commit_batches (
    step, conversation_id, request_id, run_id, revision, now, turn, phase, input_tokens,
    output_tokens, cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count,
    message_count, reports, answer_role, answer_content, answer_meta, final_seq
) AS SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
     NULL, NULL, NULL, NULL, NULL, NULL
     WHERE 0;

CREATE TRIGGER commit_batch INSTEAD OF INSERT ON commit_batches
BEGIN
    SELECT RAISE(IGNORE)
    WHERE NOT EXISTS (SELECT 1 FROM admissions
                      WHERE conversation_id = NEW.conversation_id AND revision = NEW.revision
                        AND run_id = NEW.run_id AND active_request_id = NEW.request_id);
    INSERT INTO commits (conversation_id, request_id, run_id, revision, now, turn, phase,
        input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, tool_calls_count,
        reports_count, message_count, reports, answer_role, answer_content, answer_meta,
        final_seq)
    VALUES (NEW.conversation_id, NEW.request_id, NEW.run_id, NEW.revision, NEW.now, NEW.turn,
        NEW.phase, NEW.input_tokens, NEW.output_tokens, NEW.cache_read_tokens,
        NEW.cache_write_tokens, NEW.tool_calls_count, NEW.reports_count, NEW.message_count,
        NEW.reports, NEW.answer_role, NEW.answer_content, NEW.answer_meta, NEW.final_seq);
END;
