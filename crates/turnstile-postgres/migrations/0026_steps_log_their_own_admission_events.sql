-- The steps that take or release an admission log their own event, in
-- their statement: the claim `admitted`, the commit `committed`, the
-- abandon `abandoned` (`steps/claim.rs`, `commit.rs`, `abandon.rs`). Each
-- event is numbered by the admission's update that the step makes anyway,
-- where a trigger updated that row a second time (and checked its foreign
-- key again) and ran a function per event. Only the claim inserts
-- requests, and only the commit and the abandon settle them, so nothing
-- else logged through these triggers.
DROP TRIGGER event_admitted ON requests;
DROP FUNCTION event_admitted();
DROP TRIGGER event_settled ON requests;
DROP FUNCTION event_settled();
