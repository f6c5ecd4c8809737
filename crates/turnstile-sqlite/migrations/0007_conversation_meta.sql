-- Conversation metadata: an optional title and owner and a small JSON
-- object, changed by a compare-and-swap on `meta_version`, apart from the
-- admission's revision (labelling never fences a run). Bounds are checked
-- by turnstile before any write (turnstile_core::store::meta).
ALTER TABLE conversations ADD COLUMN title TEXT;
ALTER TABLE conversations ADD COLUMN owner TEXT;
-- A JSON object, compact.
ALTER TABLE conversations ADD COLUMN metadata TEXT NOT NULL DEFAULT '{}';
-- +1 per change; 0 until the first.
ALTER TABLE conversations ADD COLUMN meta_version INTEGER NOT NULL DEFAULT 0;
-- Unix milliseconds of the last change; NULL until the first.
ALTER TABLE conversations ADD COLUMN meta_updated_at INTEGER;

-- Listings walk conversations newest first by (created_at, id), the keyset
-- of their cursor, and stop at the page's end; the owner, metadata and
-- time filters are applied on the way (unindexed: a selective filter on a
-- large store reads more rows). The namespace has its own index (0002).
CREATE INDEX conversations_newest ON conversations (created_at, id);
