-- Indexes for the operations commands (`ls`, `prune`, `doctor`) and for the
-- foreign-key cascades `prune --include-transcripts` relies on. Every index
-- costs storage per row of its table (its columns plus the table's key), so
-- there is one only where a listing or a cascade would otherwise scan a
-- large table once per row.

-- Requests of a conversation, newest first (`ls requests --conversation`),
-- and the cascade from a deleted conversation to its requests.
-- About 40 bytes per request.
CREATE INDEX requests_by_conversation ON requests (conversation_id, created_at);

-- Runs of a request: what `prune` deletes and keeps of a finished request,
-- `ls runs --conversation`, and the cascade from a deleted request to its
-- runs (without it, every deleted request scans every run).
-- About 35 bytes per run.
CREATE INDEX runs_by_request ON runs (request_id);

-- Conversations of a namespace, newest first (`ls conversations --namespace`):
-- a tenant's listing reads only that tenant's rows.
CREATE INDEX conversations_by_namespace ON conversations (namespace, created_at);

-- Held admissions only (a partial index: an idle conversation costs nothing),
-- for `ls --stuck` and `doctor`. Queries must repeat the `WHERE` clause to
-- use it.
CREATE INDEX admissions_held ON admissions (updated_at) WHERE active_request_id IS NOT NULL;
