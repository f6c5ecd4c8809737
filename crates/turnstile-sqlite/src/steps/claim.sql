-- A new request's claim of an idle admission: the compare-and-swap, the
-- request (with its deadline and budget), its first run, its input as its
-- first message (in the transcript, right after the conversation's
-- committed entries, which no read shows before the commit moves the
-- transcript's length past it) and, when the loop starts at once, the first turn's
-- write-ahead checkpoint. The message and the checkpoint are plain columns (a NULL
-- `phase`: no checkpoint); verification reports a JSON array.
--
-- A request id of a deleted conversation is refused by the
-- `request_not_deleted` trigger of the schema (`turnstile: deleted`).
CREATE VIEW claims (
    conversation_id, request_id, run_id, expected_revision, input_sha256, agent_fingerprint,
    now,
    -- the input message
    input_role, input_content, input_meta,
    -- the first turn's write-ahead checkpoint, or a NULL phase
    turn, phase, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
    tool_calls_count, reports_count, message_count,
    reports,
    -- Unix milliseconds, or NULL
    deadline_at,
    -- a JSON object of the limits set, or NULL
    budget,
    -- the conversation's creation time the claim expects (Unix ms), or NULL
    expected_created_at
) AS SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
     NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
     WHERE 0;

CREATE TRIGGER claim INSTEAD OF INSERT ON claims
BEGIN
    -- Check. Request ids are unique across the store: a known one is answered
    -- from its row (a replay, or a refusal), whatever the admission says.
    SELECT RAISE(ABORT, 'turnstile: request exists')
    WHERE EXISTS (SELECT 1 FROM requests WHERE request_id = NEW.request_id);
    -- Fence: the revision, and the conversation's creation when the claim
    -- names it (one created again under its id counts from revision 0).
    SELECT RAISE(ABORT, 'turnstile: admission moved')
    WHERE NOT EXISTS (SELECT 1 FROM admissions
                      WHERE conversation_id = NEW.conversation_id
                        AND revision = NEW.expected_revision AND active_request_id IS NULL)
       OR NOT EXISTS (SELECT 1 FROM conversations
                      WHERE id = NEW.conversation_id
                        AND created_at = COALESCE(NEW.expected_created_at, created_at));
    -- Write.
    UPDATE admissions
    SET active_request_id = NEW.request_id, input_sha256 = NEW.input_sha256,
        run_id = NEW.run_id, agent_fingerprint = NEW.agent_fingerprint,
        -- the first turn's checkpoint's usage, when there is one
        input_tokens = IIF(NEW.phase IS NULL, 0, NEW.input_tokens),
        output_tokens = IIF(NEW.phase IS NULL, 0, NEW.output_tokens),
        cache_read_tokens = IIF(NEW.phase IS NULL, 0, NEW.cache_read_tokens),
        cache_write_tokens = IIF(NEW.phase IS NULL, 0, NEW.cache_write_tokens),
        summary_passes = 0, summary_from_seq = NULL, summary_through_seq = NULL,
        summary_version = NULL, summary_prompt_sha256 = NULL,
        -- the number of the request's `admitted` event, kept in its row
        event_seq = event_seq + 1,
        revision = revision + 1, updated_at = NEW.now
    WHERE conversation_id = NEW.conversation_id AND revision = NEW.expected_revision
      AND active_request_id IS NULL;
    -- A run with the request's id is folded into the request's row, its
    -- checkpoint too (`folded`: none for a run with an id of its own, which
    -- has a `runs` row).
    -- The row stores codes for its words (migration 0021): an active
    -- request, a running run. It holds the request's `admitted` event
    -- (migration 0025): its number, its input's transcript entry, its run
    -- when that has an id of its own.
    INSERT INTO requests (request_id, conversation_id, input_sha256, state, created_at,
        deadline_at, budget, admitted_event, admitted_entry, admitted_run_id, run_state, turn,
        checkpoint_phase, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,
        tool_calls_count, reports_count, message_count, checkpoint_early_at)
    SELECT NEW.request_id, NEW.conversation_id, NEW.input_sha256, 0, NEW.now,
        NEW.deadline_at, NEW.budget,
        (SELECT event_seq FROM admissions WHERE conversation_id = NEW.conversation_id),
        (SELECT transcript_length FROM conversations WHERE id = NEW.conversation_id),
        NULLIF(NEW.run_id, NEW.request_id), folded.*
    FROM (SELECT 1) LEFT JOIN (
        SELECT 0, NEW.turn,
            IIF(NEW.phase IS NULL, NULL,
                COALESCE((SELECT code FROM checkpoint_phases WHERE word = NEW.phase), -1)),
            NEW.input_tokens, NEW.output_tokens, NEW.cache_read_tokens, NEW.cache_write_tokens,
            NEW.tool_calls_count, NEW.reports_count, NEW.message_count,
            IIF(NEW.phase IS NULL, NULL, NEW.now)
    ) AS folded ON NEW.run_id = NEW.request_id;
    INSERT INTO runs (run_id, request_id, status, started_at)
    SELECT NEW.run_id, NEW.request_id, 'running', NEW.now
    WHERE NEW.run_id <> NEW.request_id;
    INSERT INTO transcript (conversation_key, seq, request_id, role, content, meta)
    SELECT key, transcript_length, NEW.request_id, NEW.input_role, NEW.input_content,
        NEW.input_meta
    FROM conversations WHERE id = NEW.conversation_id;
    -- The run is new: nothing to replace.
    INSERT INTO loop_checkpoints (run_id, turn, phase, input_tokens, output_tokens,
        cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count, message_count,
        created_at)
    SELECT NEW.run_id, NEW.turn, NEW.phase, NEW.input_tokens, NEW.output_tokens,
        NEW.cache_read_tokens, NEW.cache_write_tokens, NEW.tool_calls_count, NEW.reports_count,
        NEW.message_count, NEW.now
    WHERE NEW.phase IS NOT NULL AND NEW.run_id <> NEW.request_id;
    INSERT INTO verification_reports (request_id, seq, turn, passed, detail)
    SELECT NEW.request_id, value ->> '$.seq', value ->> '$.turn', value ->> '$.passed',
        value ->> '$.detail'
    FROM json_each(NEW.reports) WHERE NEW.reports IS NOT NULL
    ON CONFLICT (request_id, seq) DO NOTHING;
END;

-- The claims of one group transaction as one statement: one row per claim
-- (`step` is its position, what `RETURNING` gives back). A row whose claim
-- would be refused writes nothing and returns no row (`RAISE(IGNORE)`), and
-- the writer runs that claim alone to name the refusal. Skipped as well: a
-- request id of a deleted conversation, which the tombstone trigger would
-- refuse by ending the whole statement.
CREATE VIEW claim_batches (
    step, conversation_id, request_id, run_id, expected_revision, input_sha256,
    agent_fingerprint, now, input_role, input_content, input_meta, turn, phase, input_tokens,
    output_tokens, cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count,
    message_count, reports, deadline_at, budget, expected_created_at
) AS SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
     NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
     WHERE 0;

CREATE TRIGGER claim_batch INSTEAD OF INSERT ON claim_batches
BEGIN
    SELECT RAISE(IGNORE)
    WHERE EXISTS (SELECT 1 FROM requests WHERE request_id = NEW.request_id)
       OR EXISTS (SELECT 1 FROM deleted_requests WHERE request_id = NEW.request_id)
       OR NOT EXISTS (SELECT 1 FROM admissions
                      WHERE conversation_id = NEW.conversation_id
                        AND revision = NEW.expected_revision AND active_request_id IS NULL)
       OR NOT EXISTS (SELECT 1 FROM conversations
                      WHERE id = NEW.conversation_id
                        AND created_at = COALESCE(NEW.expected_created_at, created_at));
    INSERT INTO claims (conversation_id, request_id, run_id, expected_revision, input_sha256,
        agent_fingerprint, now, input_role, input_content, input_meta, turn, phase,
        input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, tool_calls_count,
        reports_count, message_count, reports, deadline_at, budget, expected_created_at)
    VALUES (NEW.conversation_id, NEW.request_id, NEW.run_id, NEW.expected_revision,
        NEW.input_sha256, NEW.agent_fingerprint, NEW.now, NEW.input_role, NEW.input_content,
        NEW.input_meta, NEW.turn, NEW.phase, NEW.input_tokens, NEW.output_tokens,
        NEW.cache_read_tokens, NEW.cache_write_tokens, NEW.tool_calls_count,
        NEW.reports_count, NEW.message_count, NEW.reports, NEW.deadline_at, NEW.budget,
        NEW.expected_created_at);
END;
