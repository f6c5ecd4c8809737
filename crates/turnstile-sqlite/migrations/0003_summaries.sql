-- Summary compaction (DESIGN §6). Before a request's first turn, committed
-- transcript entries that fell out of the context window are summarized in
-- batches by a summary agent. A summary is one row: the transcript is never
-- rewritten, and no transcript row is copied.

-- One row per summary pass. Row `n` of a conversation covers the entries
-- `from_seq..=through_seq` and extends the row before it (its `from_seq` is
-- that row's `through_seq + 1`), so the row with the highest `through_seq`
-- summarizes everything up to it. The unique key makes a pass whose commit
-- was acknowledged too late recognizable: it is found, not inserted twice.
CREATE TABLE summaries (
    id                  INTEGER PRIMARY KEY,
    conversation_id     BLOB NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    from_seq            INTEGER NOT NULL,
    through_seq         INTEGER NOT NULL,
    content             TEXT NOT NULL,
    -- The conversation version (committed requests) the pass read.
    made_from_version   INTEGER NOT NULL,
    -- The request whose pass made it (not a foreign key: a summary belongs to
    -- the conversation and outlives the request), and what the pass cost.
    request_id          BLOB NOT NULL,
    input_tokens        INTEGER NOT NULL,
    output_tokens       INTEGER NOT NULL,
    cache_read_tokens   INTEGER NOT NULL,
    cache_write_tokens  INTEGER NOT NULL,
    created_at          INTEGER NOT NULL,
    UNIQUE (conversation_id, through_seq)
);

-- Summary progress of the active request, reset by every claim, commit and
-- abandon: the passes it committed (the pass limit counts them, so a recovery
-- never grants fresh passes) and the pass in flight, recorded before the
-- summary model is called: its input range, the conversation version it read
-- and the SHA-256 of the prompt it sent.
ALTER TABLE admissions ADD COLUMN summary_passes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE admissions ADD COLUMN summary_from_seq INTEGER;
ALTER TABLE admissions ADD COLUMN summary_through_seq INTEGER;
ALTER TABLE admissions ADD COLUMN summary_version INTEGER;
ALTER TABLE admissions ADD COLUMN summary_prompt_sha256 BLOB;
