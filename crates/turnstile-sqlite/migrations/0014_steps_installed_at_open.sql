-- The durable steps leave the migrations. Each step (a view whose
-- `INSTEAD OF` trigger is the step) now lives in one file of its own under
-- `src/steps/`, and the store installs the whole step set when it opens a
-- database whose recorded step set is older than its own (`steps/mod.rs`):
-- the views the migrations before this one created are replaced there, in
-- the same transaction that creates their successors, so no moment passes
-- without them. From here on, migrations change tables, indexes and the
-- invariant triggers only; no migration restates a step, and every view of
-- the schema is a step.

-- The version of the step set the database holds (0: none installed). A
-- build installs its own over an older one, and refuses to write to a
-- database whose step set is newer than its own. One row.
CREATE TABLE step_set (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    version  INTEGER NOT NULL
);
INSERT INTO step_set (id, version) VALUES (1, 0);
