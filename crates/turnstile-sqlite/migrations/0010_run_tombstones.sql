-- Run ids of deleted conversations (issue 17): a lookup of one (`resume_run`
-- included) answers that its conversation was deleted, not that the run is
-- unknown. The delete writes them in its transaction. Prune is not
-- deletion and leaves none: a pruned run id is unknown. Conversations
-- deleted before this migration left no run tombstones.
CREATE TABLE deleted_runs (
    run_id           BLOB PRIMARY KEY NOT NULL,
    conversation_id  BLOB NOT NULL
) WITHOUT ROWID;
