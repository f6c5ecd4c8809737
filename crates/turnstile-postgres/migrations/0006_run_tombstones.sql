-- Run ids of deleted conversations (issue 17): a lookup of one (`resume_run`
-- included) answers that its conversation was deleted, not that the run is
-- unknown. The delete writes them in its transaction. Prune is not
-- deletion and leaves none: a pruned run id is unknown. Conversations
-- deleted before this migration left no run tombstones.
CREATE TABLE deleted_runs (
    conversation_id  uuid NOT NULL,
    run_id           uuid NOT NULL,
    PRIMARY KEY (conversation_id, run_id)
);

-- Runs are looked up by run id alone, as `runs_by_run_id` serves `runs`.
CREATE INDEX deleted_runs_by_run_id ON deleted_runs (run_id);
