-- A request's `admitted` event and the event that settles it (`committed`
-- or `abandoned`) are kept in the request's row, not in `events`: the
-- claim and the settling step write the row anyway, and an `events` row
-- was one more b-tree page for each of them to write. PostgreSQL's
-- migration 0028 makes the same change.
--
-- The claim numbers its event in the admission's update it makes anyway
-- and stores the number, the input's transcript entry and the run (when
-- its id is not the request's) in the row; the commit and the abandon
-- number theirs the same way. The log's read (`src/event_log.rs`) unites
-- `events` with these columns. Within a conversation one request holds
-- the admission at a time, so a request's events lie between its
-- `admitted_event` and its `settled_event`, and the one request whose
-- settling event follows a number is the last one admitted at or before
-- it: the index below finds both.
--
-- Requests claimed before this migration keep their `admitted` row in
-- `events` and a NULL `admitted_event`; the trigger below still logs
-- their settling event there.
ALTER TABLE requests ADD COLUMN admitted_event INTEGER;
ALTER TABLE requests ADD COLUMN admitted_entry INTEGER;
ALTER TABLE requests ADD COLUMN admitted_run_id BLOB;
ALTER TABLE requests ADD COLUMN settled_event INTEGER;

-- In the order the conversation admitted them (NULL, first, for those
-- claimed before this migration, in the order of their creation).
DROP INDEX requests_by_conversation;
CREATE INDEX requests_by_conversation ON requests (conversation_id, admitted_event, created_at);

DROP TRIGGER event_admitted;
DROP TRIGGER event_settled;

CREATE TRIGGER event_settled AFTER UPDATE OF state ON requests
WHEN NEW.state <> OLD.state AND NEW.state IN (1, 2) AND NEW.admitted_event IS NULL
BEGIN
    INSERT INTO events (conversation_key, seq, kind, request_id, run_id, at)
    SELECT c.key, a.event_seq + 1, IIF(NEW.state = 1, 7, 8), NEW.request_id,
        IIF(NEW.state = 1, NEW.committed_by, NULL), COALESCE(NEW.completed_at, 0)
    FROM admissions a JOIN conversations c ON c.id = a.conversation_id
    WHERE a.conversation_id = NEW.conversation_id;
END;
