-- Conversation metadata: an optional title and owner and a small JSON
-- object, changed by a compare-and-swap on `meta_version`, apart from the
-- admission's revision (labelling never fences a run). Bounds, and the
-- absence of U+0000 (which neither text nor jsonb can hold), are checked by
-- turnstile before any write (turnstile_core::store::meta).
ALTER TABLE conversations
    ADD COLUMN title text,
    ADD COLUMN owner text,
    ADD COLUMN metadata jsonb NOT NULL DEFAULT '{}',
    -- +1 per change; 0 until the first.
    ADD COLUMN meta_version bigint NOT NULL DEFAULT 0,
    -- Unix milliseconds of the last change; NULL until the first.
    ADD COLUMN meta_updated_at bigint,
    -- The token of the call that made the last change: a retried change
    -- whose first attempt committed unacknowledged knows its own.
    ADD COLUMN meta_updated_by uuid;

-- Listings walk conversations newest first by (created_at, conversation_id),
-- the keyset of their cursor, and stop at the page's end; the owner,
-- metadata and time filters are applied on the way (unindexed). The
-- namespace has its own index (0001).
CREATE INDEX conversations_newest ON conversations (created_at, conversation_id);
