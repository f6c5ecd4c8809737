-- One statement per durable step (issue 14). sqlx hands every statement to
-- its connection's worker thread and back; that round trip, not SQLite or
-- fsync, is most of what a step costs. So each write of the store is now
-- one `INSERT` into one of the views below, whose `INSTEAD OF` trigger is
-- the step: it checks the fence, then writes every row of the step, all
-- inside that one statement.
--
-- A refused step raises (`RAISE(ABORT, 'turnstile: …')`): SQLite undoes that
-- statement, and only it, and the transaction goes on; the store maps the
-- message to its typed error (`codec.rs`). So a fenced step writes nothing
-- and needs no savepoint, even among other sessions' steps in one group
-- transaction. Every message raised here starts with `turnstile: `.
--
-- Each compare-and-swap is checked twice in its statement: the raise
-- before any write, and the guarded `UPDATE admissions … WHERE revision = …`
-- itself (which, after the check, always matches its one row).
--
-- The views hold no rows (`WHERE 0`); their columns are the step's
-- parameters. Times are Unix milliseconds (`now`); lists are JSON arrays
-- expanded with `json_each`. The base tables, their triggers (0004) and
-- their constraints are unchanged: the rows written are the rows the
-- separate statements wrote before, and a database of schema 4 needs no
-- data migration.

-- The fence of a run's owner: the admission still names its request, run
-- and revision.
--
-- A checkpoint row as JSON: {"turn", "phase", "input", "output",
-- "cache_read", "cache_write", "tool_calls", "reports", "messages"}; a
-- verification report: {"seq", "turn", "passed", "detail"}; a message: the
-- store's message JSON (role and content become columns, the rest `meta`).

-- The writes of a run's owner during its turns: a turn's write-ahead, the
-- model's answer with its journaled tool calls, a turn's end with the next
-- turn's write-ahead, a run's failure. Each part is optional (NULL: none).
CREATE VIEW turn_writes (
    conversation_id, request_id, run_id, revision, now,
    -- checkpoint rows to save (a row of the same turn is replaced whole)
    checkpoints,
    -- verification reports new in those checkpoints' turns
    reports,
    -- the turn the messages, calls and journal compaction belong to
    turn,
    -- messages appended at `first_seq`..
    first_seq, messages,
    -- tool calls to journal as requested
    calls,
    -- true: clear the turn's journaled arguments and results (they are
    -- messages now)
    compact,
    -- the run failed with this error
    failure
) AS SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
     WHERE 0;

CREATE TRIGGER turn_write INSTEAD OF INSERT ON turn_writes
BEGIN
    SELECT RAISE(ABORT, 'turnstile: fenced')
    WHERE NOT EXISTS (SELECT 1 FROM admissions
                      WHERE conversation_id = NEW.conversation_id AND revision = NEW.revision
                        AND run_id = NEW.run_id AND active_request_id = NEW.request_id);
    -- The admission takes the last row's usage and time (0004's trigger).
    INSERT OR REPLACE INTO loop_checkpoints (run_id, turn, phase, input_tokens, output_tokens,
        cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count, message_count,
        created_at)
    SELECT NEW.run_id, value ->> '$.turn', value ->> '$.phase', value ->> '$.input',
        value ->> '$.output', value ->> '$.cache_read', value ->> '$.cache_write',
        value ->> '$.tool_calls', value ->> '$.reports', value ->> '$.messages', NEW.now
    FROM json_each(NEW.checkpoints) ORDER BY key;
    -- A write without a checkpoint is activity all the same.
    UPDATE admissions SET updated_at = NEW.now
    WHERE NEW.checkpoints IS NULL AND conversation_id = NEW.conversation_id;
    INSERT INTO verification_reports (request_id, seq, turn, passed, detail)
    SELECT NEW.request_id, value ->> '$.seq', value ->> '$.turn', value ->> '$.passed',
        value ->> '$.detail'
    FROM json_each(NEW.reports) WHERE true
    ON CONFLICT (request_id, seq) DO NOTHING;
    INSERT INTO run_messages (request_id, seq, run_id, turn, role, content, meta)
    SELECT NEW.request_id, NEW.first_seq + key, NEW.run_id, NEW.turn, value ->> '$.role',
        value ->> '$.content', NULLIF(json_remove(value, '$.role', '$.content'), '{}')
    FROM json_each(NEW.messages);
    INSERT INTO tool_calls (request_id, turn, call_id, position, run_id, name, arguments,
        status, created_at)
    SELECT NEW.request_id, NEW.turn, value ->> '$.id', key, NEW.run_id, value ->> '$.name',
        value ->> '$.arguments', 'requested', NEW.now
    FROM json_each(NEW.calls);
    UPDATE tool_calls SET arguments = NULL, result = NULL
    WHERE NEW.compact AND request_id = NEW.request_id AND turn = NEW.turn;
    UPDATE runs SET status = 'failed', error = NEW.failure, ended_at = NEW.now
    WHERE NEW.failure IS NOT NULL AND run_id = NEW.run_id;
END;

-- A new request's claim of an idle admission: the compare-and-swap, the
-- request, its first run, its input as its first message and, when the
-- loop starts at once, the first turn's write-ahead.
CREATE VIEW claims (
    conversation_id, request_id, run_id, expected_revision, input_sha256, agent_fingerprint,
    now,
    -- the input, as a one-message array
    input,
    checkpoints, reports
) AS SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL WHERE 0;

CREATE TRIGGER claim INSTEAD OF INSERT ON claims
BEGIN
    -- Request ids are unique across the store: a known one is answered
    -- from its row (a replay, or a refusal), whatever the admission says.
    SELECT RAISE(ABORT, 'turnstile: request exists')
    WHERE EXISTS (SELECT 1 FROM requests WHERE request_id = NEW.request_id);
    SELECT RAISE(ABORT, 'turnstile: admission moved')
    WHERE NOT EXISTS (SELECT 1 FROM admissions
                      WHERE conversation_id = NEW.conversation_id
                        AND revision = NEW.expected_revision AND active_request_id IS NULL);
    UPDATE admissions
    SET active_request_id = NEW.request_id, input_sha256 = NEW.input_sha256,
        run_id = NEW.run_id, agent_fingerprint = NEW.agent_fingerprint,
        input_tokens = 0, output_tokens = 0, cache_read_tokens = 0, cache_write_tokens = 0,
        summary_passes = 0, summary_from_seq = NULL, summary_through_seq = NULL,
        summary_version = NULL, summary_prompt_sha256 = NULL,
        revision = revision + 1, updated_at = NEW.now
    WHERE conversation_id = NEW.conversation_id AND revision = NEW.expected_revision
      AND active_request_id IS NULL;
    INSERT INTO requests (request_id, conversation_id, input_sha256, status, created_at)
    VALUES (NEW.request_id, NEW.conversation_id, NEW.input_sha256, 'active', NEW.now);
    INSERT INTO runs (run_id, request_id, status, started_at)
    VALUES (NEW.run_id, NEW.request_id, 'running', NEW.now);
    INSERT INTO run_messages (request_id, seq, run_id, turn, role, content, meta)
    SELECT NEW.request_id, key, NEW.run_id, 0, value ->> '$.role', value ->> '$.content',
        NULLIF(json_remove(value, '$.role', '$.content'), '{}')
    FROM json_each(NEW.input);
    INSERT OR REPLACE INTO loop_checkpoints (run_id, turn, phase, input_tokens, output_tokens,
        cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count, message_count,
        created_at)
    SELECT NEW.run_id, value ->> '$.turn', value ->> '$.phase', value ->> '$.input',
        value ->> '$.output', value ->> '$.cache_read', value ->> '$.cache_write',
        value ->> '$.tool_calls', value ->> '$.reports', value ->> '$.messages', NEW.now
    FROM json_each(NEW.checkpoints) ORDER BY key;
    INSERT INTO verification_reports (request_id, seq, turn, passed, detail)
    SELECT NEW.request_id, value ->> '$.seq', value ->> '$.turn', value ->> '$.passed',
        value ->> '$.detail'
    FROM json_each(NEW.reports) WHERE true
    ON CONFLICT (request_id, seq) DO NOTHING;
END;

-- A recovery's claim of an active admission for a new run that continues
-- `from_run`: the compare-and-swap, the run superseded, the new run and a
-- copy of the latest checkpoint of the run it continues (one small row, no
-- messages copied). The latest checkpoint of `from_run` in one of
-- `refuse_phases` (a JSON array of phase names, NULL for none) refuses the
-- claim: a turn was in flight.
CREATE VIEW recovery_claims (
    conversation_id, request_id, from_run, new_run, expected_revision, refuse_phases, now
) AS SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL WHERE 0;

CREATE TRIGGER recovery_claim INSTEAD OF INSERT ON recovery_claims
BEGIN
    SELECT RAISE(ABORT, 'turnstile: admission moved')
    WHERE NOT EXISTS (SELECT 1 FROM admissions
                      WHERE conversation_id = NEW.conversation_id
                        AND revision = NEW.expected_revision
                        AND active_request_id = NEW.request_id AND run_id = NEW.from_run);
    SELECT RAISE(ABORT, 'turnstile: turn in flight')
    WHERE (SELECT phase FROM loop_checkpoints WHERE run_id = NEW.from_run
           ORDER BY turn DESC LIMIT 1) IN (SELECT value FROM json_each(NEW.refuse_phases));
    UPDATE admissions SET run_id = NEW.new_run, revision = revision + 1, updated_at = NEW.now
    WHERE conversation_id = NEW.conversation_id AND revision = NEW.expected_revision
      AND run_id = NEW.from_run;
    UPDATE runs SET status = 'superseded', ended_at = COALESCE(ended_at, NEW.now)
    WHERE run_id = NEW.from_run AND status IN ('running', 'failed');
    INSERT INTO runs (run_id, request_id, resumed_from, status, started_at)
    VALUES (NEW.new_run, NEW.request_id, NEW.from_run, 'running', NEW.now);
    INSERT INTO loop_checkpoints (run_id, turn, phase, input_tokens, output_tokens,
        cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count, message_count,
        created_at)
    SELECT NEW.new_run, turn, phase, input_tokens, output_tokens, cache_read_tokens,
        cache_write_tokens, tool_calls_count, reports_count, message_count, NEW.now
    FROM loop_checkpoints WHERE run_id = NEW.from_run ORDER BY turn DESC LIMIT 1;
END;

-- A request's commit, fenced: the committed turn's checkpoint (phase
-- `completed`, the outcome's totals), the admission released, the
-- conversation version bumped, the request completed with where its
-- messages start and end in the transcript, the pending messages and the
-- final answer (at `first_seq + final_seq`) moved to the transcript, the
-- run completed. The statement returns the version and the range.
CREATE VIEW commits (
    conversation_id, request_id, run_id, revision, now, checkpoints, reports,
    -- the final answer as a one-message array, and its position in the request
    answer, final_seq
) AS SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL WHERE 0;

CREATE TRIGGER commit_request INSTEAD OF INSERT ON commits
BEGIN
    SELECT RAISE(ABORT, 'turnstile: fenced')
    WHERE NOT EXISTS (SELECT 1 FROM admissions
                      WHERE conversation_id = NEW.conversation_id AND revision = NEW.revision
                        AND run_id = NEW.run_id AND active_request_id = NEW.request_id);
    INSERT OR REPLACE INTO loop_checkpoints (run_id, turn, phase, input_tokens, output_tokens,
        cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count, message_count,
        created_at)
    SELECT NEW.run_id, value ->> '$.turn', value ->> '$.phase', value ->> '$.input',
        value ->> '$.output', value ->> '$.cache_read', value ->> '$.cache_write',
        value ->> '$.tool_calls', value ->> '$.reports', value ->> '$.messages', NEW.now
    FROM json_each(NEW.checkpoints) ORDER BY key;
    INSERT INTO verification_reports (request_id, seq, turn, passed, detail)
    SELECT NEW.request_id, value ->> '$.seq', value ->> '$.turn', value ->> '$.passed',
        value ->> '$.detail'
    FROM json_each(NEW.reports) WHERE true
    ON CONFLICT (request_id, seq) DO NOTHING;
    UPDATE admissions
    SET active_request_id = NULL, input_sha256 = NULL, run_id = NULL, agent_fingerprint = NULL,
        input_tokens = 0, output_tokens = 0, cache_read_tokens = 0, cache_write_tokens = 0,
        summary_passes = 0, summary_from_seq = NULL, summary_through_seq = NULL,
        summary_version = NULL, summary_prompt_sha256 = NULL,
        revision = revision + 1, updated_at = NEW.now
    WHERE conversation_id = NEW.conversation_id AND revision = NEW.revision
      AND run_id = NEW.run_id;
    UPDATE conversations SET version = version + 1 WHERE id = NEW.conversation_id;
    -- The request's messages start after the transcript's current end.
    UPDATE requests
    SET status = 'completed', committed_run_id = NEW.run_id,
        conversation_version = (SELECT version FROM conversations WHERE id = NEW.conversation_id),
        first_seq = (SELECT COALESCE(MAX(seq) + 1, 0) FROM transcript
                     WHERE conversation_id = NEW.conversation_id),
        end_seq = (SELECT COALESCE(MAX(seq) + 1, 0) FROM transcript
                   WHERE conversation_id = NEW.conversation_id)
                  + (SELECT COUNT(*) FROM run_messages WHERE request_id = NEW.request_id)
                  + json_array_length(NEW.answer),
        completed_at = NEW.now
    WHERE request_id = NEW.request_id;
    INSERT INTO transcript (conversation_id, seq, request_id, role, content, meta)
    SELECT NEW.conversation_id, r.first_seq + m.seq, m.request_id, m.role, m.content, m.meta
    FROM run_messages m JOIN requests r ON r.request_id = m.request_id
    WHERE m.request_id = NEW.request_id
    UNION ALL
    SELECT NEW.conversation_id,
        (SELECT first_seq FROM requests WHERE request_id = NEW.request_id) + NEW.final_seq + key,
        NEW.request_id, value ->> '$.role', value ->> '$.content',
        NULLIF(json_remove(value, '$.role', '$.content'), '{}')
    FROM json_each(NEW.answer)
    ORDER BY 2;
    DELETE FROM run_messages WHERE request_id = NEW.request_id;
    UPDATE runs SET status = 'completed', ended_at = NEW.now WHERE run_id = NEW.run_id;
END;

-- An abandon: the compare-and-swap on the active admission, its run
-- abandoned, the admission released, the request id burned.
CREATE VIEW abandons (conversation_id, request_id, expected_revision, now)
AS SELECT NULL, NULL, NULL, NULL WHERE 0;

CREATE TRIGGER abandon INSTEAD OF INSERT ON abandons
BEGIN
    SELECT RAISE(ABORT, 'turnstile: admission moved')
    WHERE NOT EXISTS (SELECT 1 FROM admissions
                      WHERE conversation_id = NEW.conversation_id
                        AND revision = NEW.expected_revision
                        AND active_request_id = NEW.request_id);
    UPDATE runs SET status = 'abandoned', ended_at = COALESCE(ended_at, NEW.now)
    WHERE run_id = (SELECT run_id FROM admissions WHERE conversation_id = NEW.conversation_id)
      AND status IN ('running', 'failed');
    UPDATE admissions
    SET active_request_id = NULL, input_sha256 = NULL, run_id = NULL, agent_fingerprint = NULL,
        input_tokens = 0, output_tokens = 0, cache_read_tokens = 0, cache_write_tokens = 0,
        summary_passes = 0, summary_from_seq = NULL, summary_through_seq = NULL,
        summary_version = NULL, summary_prompt_sha256 = NULL,
        revision = revision + 1, updated_at = NEW.now
    WHERE conversation_id = NEW.conversation_id AND revision = NEW.expected_revision
      AND active_request_id = NEW.request_id;
    UPDATE requests SET status = 'abandoned', completed_at = NEW.now
    WHERE request_id = NEW.request_id;
END;

-- A conversation and its idle admission, created unless they exist. The
-- statement returns the conversation as stored (its namespace may differ).
CREATE VIEW conversation_opens (id, namespace, now)
AS SELECT NULL, NULL, NULL WHERE 0;

CREATE TRIGGER conversation_open INSTEAD OF INSERT ON conversation_opens
BEGIN
    INSERT INTO conversations (id, namespace, version, created_at)
    VALUES (NEW.id, NEW.namespace, 0, NEW.now)
    ON CONFLICT (id) DO NOTHING;
    INSERT INTO admissions (conversation_id, revision, updated_at)
    VALUES (NEW.id, 0, NEW.now)
    ON CONFLICT (conversation_id) DO NOTHING;
END;
