-- Fewer admission updates per request. Every step that writes a checkpoint
-- already updates its admission (the claim, the commit) or can do so in the
-- same statement (a turn write), so each now sets the admission's usage
-- itself, as the PostgreSQL steps do, and the trigger that copied every
-- checkpoint's usage to the admission (0004) goes: a one-turn request
-- updated its admission four times, and now twice. A recovery's copy of the
-- latest checkpoint carries the usage the admission already holds.
DROP TRIGGER checkpoint_reaches_admission;
