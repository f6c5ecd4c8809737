-- A request's `admitted` event and the event that settles it (`committed`
-- or `abandoned`) are kept in the request's row, not in `events`: the
-- claim and the settling step write that row anyway, and an `events` row
-- was one more heap tuple and index entry for each of them. As SQLite's
-- 0025.
--
-- The steps number these events in the admission's update they make
-- anyway, as before (0026), and store the number in the request's row,
-- with the input's transcript entry and the run (when its id is not the
-- request's) for `admitted`. The log's read (`src/event_log.rs`) unites
-- `events` with these columns. Within a conversation one request holds
-- the admission at a time, so a request's events lie between its
-- `admitted_event` and its `settled_event`, and the one request whose
-- settling event follows a number is the last one admitted at or before
-- it: the index below finds both.
--
-- Requests claimed before this migration keep their `admitted` row in
-- `events` and a NULL `admitted_event`; the commit and the abandon log
-- their settling event there too. The columns are added without a
-- default: no table is rewritten.
ALTER TABLE requests
    ADD COLUMN admitted_event bigint,
    ADD COLUMN admitted_entry bigint,
    ADD COLUMN admitted_run_id uuid,
    ADD COLUMN settled_event bigint;

-- In the order the conversation admitted them (NULL, last, for those
-- claimed before this migration, in the order of their creation).
DROP INDEX requests_by_conversation;
CREATE INDEX requests_by_conversation ON requests (conversation_id, admitted_event, created_at);
