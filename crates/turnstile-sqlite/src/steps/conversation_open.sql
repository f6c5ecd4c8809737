-- A conversation and its idle admission, created unless they exist. The
-- statement that inserts into the view returns the conversation as stored
-- (its namespace may differ from the one asked for). A deleted
-- conversation's id is refused by the `conversation_not_deleted` trigger of
-- the schema (`turnstile: deleted`). A new conversation's key is one more
-- than the largest (`conversations_by_key` answers in one seek).
CREATE VIEW conversation_opens (id, namespace, now)
AS SELECT NULL, NULL, NULL WHERE 0;

CREATE TRIGGER conversation_open INSTEAD OF INSERT ON conversation_opens
BEGIN
    INSERT INTO conversations (id, namespace, version, created_at, key)
    VALUES (NEW.id, NEW.namespace, 0, NEW.now,
        (SELECT COALESCE(MAX(key), 0) + 1 FROM conversations))
    ON CONFLICT (id) DO NOTHING;
    INSERT INTO admissions (conversation_id, revision, updated_at)
    VALUES (NEW.id, 0, NEW.now)
    ON CONFLICT (conversation_id) DO NOTHING;
END;
