-- A conversation and its idle admission, created unless they exist. The
-- statement that inserts into the view returns the conversation as stored
-- (its namespace may differ from the one asked for). A deleted
-- conversation's id is refused by the `conversation_not_deleted` trigger of
-- the schema (`turnstile: deleted`). A new conversation's key is one more
-- than the largest any conversation, transcript or event row holds (each
-- an index seek), so no row keyed by it can be taken for the new
-- conversation's, not even one a deletion with foreign keys off left
-- behind.
CREATE VIEW conversation_opens (id, namespace, now)
AS SELECT NULL, NULL, NULL WHERE 0;

CREATE TRIGGER conversation_open INSTEAD OF INSERT ON conversation_opens
BEGIN
    INSERT INTO conversations (id, namespace, version, created_at, key)
    VALUES (NEW.id, NEW.namespace, 0, NEW.now,
        max((SELECT COALESCE(MAX(key), 0) FROM conversations),
            (SELECT COALESCE(MAX(conversation_key), 0) FROM transcript),
            (SELECT COALESCE(MAX(conversation_key), 0) FROM events)) + 1)
    ON CONFLICT (id) DO NOTHING;
    INSERT INTO admissions (conversation_id, revision, updated_at)
    VALUES (NEW.id, 0, NEW.now)
    ON CONFLICT (conversation_id) DO NOTHING;
END;
