-- The durable steps leave the migrations. Each step (a view whose
-- `INSTEAD OF` trigger is the step) now lives in one file of its own under
-- `src/steps/`, and the store installs the whole step set when it opens a
-- database whose recorded step set is older than its own (`steps/mod.rs`).
-- From here on, migrations change tables, indexes and the invariant
-- triggers only; no migration restates a step.
--
-- Dropping a view drops its trigger. Every row stays as it is.

DROP VIEW turn_write_batches;
DROP VIEW claim_batches;
DROP VIEW commit_batches;
DROP VIEW tool_result_batches;
DROP VIEW turn_writes;
DROP VIEW claims;
DROP VIEW recovery_claims;
DROP VIEW commits;
DROP VIEW abandons;
DROP VIEW conversation_opens;

-- The version of the step set the database holds (0: none installed). A
-- build installs its own over an older one, and refuses to write to a
-- database whose step set is newer than its own.
CREATE TABLE step_set (
    version  INTEGER NOT NULL
);
INSERT INTO step_set (version) VALUES (0);
