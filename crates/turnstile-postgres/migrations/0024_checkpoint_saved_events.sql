-- A turn's end is an event of its own: kind 9, checkpoint saved, with the
-- run that saved it and the turn that ended, as SQLite's migration 0024
-- makes it.
--
-- A turn ends when its owner's write moves the turn's checkpoint to
-- `ready` (`finish_turn`): the row was written ahead when the turn began,
-- so the end is an update. A recovery's copy of the latest checkpoint into
-- its new run is an insert, and a repeated write of an ended turn changes
-- no phase: neither is logged.
ALTER TABLE events DROP CONSTRAINT events_kind_check;
ALTER TABLE events ADD CONSTRAINT events_kind_check CHECK (kind BETWEEN 0 AND 9);

CREATE FUNCTION event_checkpoint_saved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM log_event(NEW.conversation_id, 9::smallint,
        (SELECT request_id FROM runs
         WHERE conversation_id = NEW.conversation_id AND run_id = NEW.run_id),
        NEW.run_id, NEW.turn, NULL, NULL, NEW.created_at);
    RETURN NULL;
END $$;
CREATE TRIGGER event_checkpoint_saved AFTER UPDATE OF phase ON loop_checkpoints
FOR EACH ROW WHEN (NEW.phase = 'ready' AND OLD.phase <> 'ready')
EXECUTE FUNCTION event_checkpoint_saved();
