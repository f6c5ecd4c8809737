-- An abandon: the compare-and-swap on the active admission, its run
-- abandoned, the admission released, the request id burned, and its
-- messages moved from the transcript's uncommitted tail to `run_messages`,
-- where they stay readable until the request is pruned.
CREATE VIEW abandons (conversation_id, request_id, expected_revision, now)
AS SELECT NULL, NULL, NULL, NULL WHERE 0;

CREATE TRIGGER abandon INSTEAD OF INSERT ON abandons
BEGIN
    -- Fence.
    SELECT RAISE(ABORT, 'turnstile: admission moved')
    WHERE NOT EXISTS (SELECT 1 FROM admissions
                      WHERE conversation_id = NEW.conversation_id
                        AND revision = NEW.expected_revision
                        AND active_request_id = NEW.request_id);
    -- Write.
    UPDATE runs SET status = 'abandoned', ended_at = COALESCE(ended_at, NEW.now)
    WHERE run_id = (SELECT run_id FROM admissions WHERE conversation_id = NEW.conversation_id)
      AND status IN ('running', 'failed');
    -- A folded run that was running ends at the request's abandon
    -- (`completed_at`); a failed one keeps its end.
    UPDATE requests SET run_state = 4 /* abandoned */
    WHERE request_id = NEW.request_id AND run_status IN ('running', 'failed')
      AND request_id = (SELECT run_id FROM admissions WHERE conversation_id = NEW.conversation_id);
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
    WHERE conversation_id = NEW.conversation_id AND revision = NEW.expected_revision
      AND active_request_id = NEW.request_id;
    UPDATE requests
    SET state = 2 /* abandoned */, completed_at = NEW.now,
        settled_event = IIF(admitted_event IS NULL, NULL,
                            (SELECT event_seq FROM admissions
                             WHERE conversation_id = NEW.conversation_id))
    WHERE request_id = NEW.request_id;
    INSERT INTO run_messages (request_id, seq, role, content, meta)
    SELECT t.request_id, t.seq - c.transcript_length, t.role, t.content, t.meta
    FROM conversations c
    JOIN transcript t ON t.conversation_key = c.key AND t.seq >= c.transcript_length
    WHERE c.id = NEW.conversation_id
    ORDER BY t.seq;
    DELETE FROM transcript
    WHERE conversation_key = (SELECT key FROM conversations WHERE id = NEW.conversation_id)
      AND seq >= (SELECT transcript_length FROM conversations WHERE id = NEW.conversation_id);
END;
