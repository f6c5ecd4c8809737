-- The claim logs its own `admitted` event, in its statement
-- (`steps/claim.rs`): the event is numbered by the admission's update that
-- makes the claim, where the trigger updated that row a second time (and
-- checked its foreign key again) and ran a function per event. Only the
-- claim inserts requests, so nothing else logged through this trigger.
DROP TRIGGER event_admitted ON requests;
DROP FUNCTION event_admitted();
