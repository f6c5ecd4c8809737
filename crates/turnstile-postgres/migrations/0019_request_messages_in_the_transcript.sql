-- A request's messages go to the transcript as they are written (its input
-- with its claim, each turn's with that turn), after the conversation's
-- committed entries, instead of to `run_messages` first and, at the
-- commit, moved to the transcript: a one-turn request writes its input
-- once, and its commit leaves no deleted row behind for VACUUM.
--
-- `conversations.transcript_length` is where the committed entries end:
-- entries `0..transcript_length` are committed, and the rows after them
-- are the held request's messages, which no read of the transcript shows.
-- A commit appends the final answer and moves the length past it; an
-- abandon moves the held request's messages to `run_messages`, which now
-- holds only abandoned requests' messages, kept until they are pruned.
ALTER TABLE conversations ADD COLUMN transcript_length bigint NOT NULL DEFAULT 0;
UPDATE conversations c SET transcript_length = t.length
FROM (SELECT conversation_id, MAX(seq) + 1 AS length FROM transcript GROUP BY conversation_id) t
WHERE c.conversation_id = t.conversation_id;

-- `run_messages` is to hold abandoned requests' messages only; which run
-- and turn wrote each was never read, and an abandon moving a request's
-- messages from the transcript does not know it. (Before the move below:
-- its deletes queue deferred blob triggers, and a table with pending
-- trigger events cannot be altered.)
ALTER TABLE run_messages DROP COLUMN run_id, DROP COLUMN turn;

-- The held requests' messages move to the transcript (their blobs are
-- counted there before they are let go here).
INSERT INTO transcript (conversation_id, seq, request_id, role, content, meta)
SELECT m.conversation_id, c.transcript_length + m.seq, m.request_id, m.role, m.content, m.meta
FROM admissions a
JOIN conversations c ON c.conversation_id = a.conversation_id
JOIN run_messages m
    ON m.conversation_id = a.conversation_id AND m.request_id = a.active_request_id;
DELETE FROM run_messages m USING admissions a
WHERE m.conversation_id = a.conversation_id AND m.request_id = a.active_request_id;
