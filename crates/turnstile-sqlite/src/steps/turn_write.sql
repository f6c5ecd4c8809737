-- The writes of a run's owner during its turns: a turn's write-ahead, the
-- model's answer with its journaled tool calls, a turn's end with the next
-- turn's write-ahead, a run's failure. Each part is optional (NULL: none).
--
-- A checkpoint row as JSON: {"turn", "phase", "input", "output",
-- "cache_read", "cache_write", "tool_calls", "reports", "messages"}; a
-- verification report: {"seq", "turn", "passed", "detail"}; a message: the
-- store's message JSON (role and content become columns, the rest `meta`).
CREATE VIEW turn_writes (
    conversation_id, request_id, run_id, revision, now,
    -- checkpoint rows to save (a row of the same turn is replaced whole)
    checkpoints,
    -- verification reports new in those checkpoints' turns
    reports,
    -- the turn the messages, calls and journal compaction belong to
    turn,
    -- messages appended as the request's `first_seq`.. (its input is 0)
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
    -- Fence.
    SELECT RAISE(ABORT, 'turnstile: fenced')
    WHERE NOT EXISTS (SELECT 1 FROM admissions
                      WHERE conversation_id = NEW.conversation_id AND revision = NEW.revision
                        AND run_id = NEW.run_id AND active_request_id = NEW.request_id);
    -- A turn that ends is logged: kind 9, checkpoint saved
    -- (`migrations/0024_checkpoint_saved_events.sql`), when this write
    -- turns the turn's written-ahead checkpoint `ready`, as PostgreSQL's
    -- trigger does; read before the writes below change it.
    INSERT INTO events (conversation_key, seq, kind, request_id, run_id, turn, at)
    SELECT c.key, a.event_seq + 1, 9, NEW.request_id, NULLIF(NEW.run_id, NEW.request_id),
        ended.turn, NEW.now
    FROM admissions a JOIN conversations c ON c.id = a.conversation_id,
        (SELECT value ->> '$.turn' AS turn FROM json_each(NEW.checkpoints)
         WHERE value ->> '$.phase' = 'ready' ORDER BY turn DESC LIMIT 1) AS ended
    WHERE a.conversation_id = NEW.conversation_id
      AND EXISTS (SELECT 1 FROM all_checkpoints
                  WHERE run_id = NEW.run_id AND turn = ended.turn AND phase <> 'ready');
    -- Write. A folded run (`claim.sql`) keeps its latest turn's checkpoint in
    -- the request's row and the earlier turns' in `first_run_checkpoints`; a
    -- run of its own keeps them all in `loop_checkpoints`. The row's
    -- checkpoint moves first when this write brings a later turn.
    INSERT OR REPLACE INTO first_run_checkpoints (request_id, turn, phase, input_tokens,
        output_tokens, cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count,
        message_count, created_at)
    SELECT request_id, turn, phase, input_tokens, output_tokens, cache_read_tokens,
        cache_write_tokens, tool_calls_count, reports_count, message_count, checkpoint_at
    FROM requests
    WHERE request_id = NEW.request_id AND NEW.run_id = NEW.request_id AND phase IS NOT NULL
      AND turn < (SELECT MAX(value ->> '$.turn') FROM json_each(NEW.checkpoints));
    INSERT OR REPLACE INTO first_run_checkpoints (request_id, turn, phase, input_tokens,
        output_tokens, cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count,
        message_count, created_at)
    SELECT NEW.request_id, value ->> '$.turn', value ->> '$.phase', value ->> '$.input',
        value ->> '$.output', value ->> '$.cache_read', value ->> '$.cache_write',
        value ->> '$.tool_calls', value ->> '$.reports', value ->> '$.messages', NEW.now
    FROM json_each(NEW.checkpoints)
    WHERE NEW.run_id = NEW.request_id
      AND value ->> '$.turn' < (SELECT MAX(turn) FROM (
              SELECT turn FROM requests WHERE request_id = NEW.request_id AND phase IS NOT NULL
              UNION ALL
              SELECT value ->> '$.turn' AS turn FROM json_each(NEW.checkpoints)))
    ORDER BY key;
    INSERT OR REPLACE INTO loop_checkpoints (run_id, turn, phase, input_tokens, output_tokens,
        cache_read_tokens, cache_write_tokens, tool_calls_count, reports_count, message_count,
        created_at)
    SELECT NEW.run_id, value ->> '$.turn', value ->> '$.phase', value ->> '$.input',
        value ->> '$.output', value ->> '$.cache_read', value ->> '$.cache_write',
        value ->> '$.tool_calls', value ->> '$.reports', value ->> '$.messages', NEW.now
    FROM json_each(NEW.checkpoints)
    WHERE NEW.run_id <> NEW.request_id
    ORDER BY key;
    UPDATE requests
    SET turn = latest.value ->> '$.turn',
        checkpoint_phase = COALESCE((SELECT code FROM checkpoint_phases
                                     WHERE word = latest.value ->> '$.phase'), -1),
        input_tokens = latest.value ->> '$.input', output_tokens = latest.value ->> '$.output',
        cache_read_tokens = latest.value ->> '$.cache_read',
        cache_write_tokens = latest.value ->> '$.cache_write',
        tool_calls_count = latest.value ->> '$.tool_calls',
        reports_count = latest.value ->> '$.reports',
        message_count = latest.value ->> '$.messages', checkpoint_early_at = NEW.now
    FROM (SELECT value FROM json_each(NEW.checkpoints)
          ORDER BY value ->> '$.turn' DESC, key DESC LIMIT 1) AS latest
    WHERE request_id = NEW.request_id AND NEW.run_id = NEW.request_id
      AND (phase IS NULL OR turn <= latest.value ->> '$.turn');
    -- The admission takes the last checkpoint's usage, and the time: a write
    -- without a checkpoint is activity all the same.
    UPDATE admissions
    SET input_tokens = COALESCE(NEW.checkpoints ->> '$[#-1].input', input_tokens),
        output_tokens = COALESCE(NEW.checkpoints ->> '$[#-1].output', output_tokens),
        cache_read_tokens = COALESCE(NEW.checkpoints ->> '$[#-1].cache_read', cache_read_tokens),
        cache_write_tokens = COALESCE(NEW.checkpoints ->> '$[#-1].cache_write',
                                      cache_write_tokens),
        updated_at = NEW.now
    WHERE conversation_id = NEW.conversation_id;
    INSERT INTO verification_reports (request_id, seq, turn, passed, detail)
    SELECT NEW.request_id, value ->> '$.seq', value ->> '$.turn', value ->> '$.passed',
        value ->> '$.detail'
    FROM json_each(NEW.reports) WHERE true
    ON CONFLICT (request_id, seq) DO NOTHING;
    -- The request's messages follow the conversation's committed entries.
    INSERT INTO transcript (conversation_key, seq, request_id, role, content, meta)
    SELECT c.key, c.transcript_length + NEW.first_seq + m.key, NEW.request_id,
        m.value ->> '$.role', m.value ->> '$.content',
        NULLIF(json_remove(m.value, '$.role', '$.content'), '{}')
    FROM conversations c, json_each(NEW.messages) m
    WHERE c.id = NEW.conversation_id
    ORDER BY m.key;
    INSERT INTO tool_calls (request_id, turn, call_id, position, run_id, name, arguments,
        status, created_at)
    SELECT NEW.request_id, NEW.turn, value ->> '$.id', key, NEW.run_id, value ->> '$.name',
        value ->> '$.arguments', 'requested', NEW.now
    FROM json_each(NEW.calls);
    UPDATE tool_calls SET arguments = NULL, result = NULL, result_parts = NULL
    WHERE NEW.compact AND request_id = NEW.request_id AND turn = NEW.turn;
    UPDATE runs SET status = 'failed', error = NEW.failure, ended_at = NEW.now
    WHERE NEW.failure IS NOT NULL AND run_id = NEW.run_id;
    UPDATE requests
    SET run_state = 2 /* failed */, run_error = NEW.failure, run_ended_early_at = NEW.now
    WHERE NEW.failure IS NOT NULL AND request_id = NEW.request_id
      AND NEW.run_id = NEW.request_id;
END;

-- The turn writes of one group transaction as one statement (as claims
-- are: `claim.sql`).
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
