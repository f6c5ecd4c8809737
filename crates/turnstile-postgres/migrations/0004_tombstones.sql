-- Deleted conversations (issue 17). Deleting a conversation removes every
-- row of it except its `request_ids` rows, which stay as the tombstones of
-- its request ids (a claim finds the id taken, and the store answers
-- `Deleted` because the conversation is in the table below); its own id
-- stays here. No conversation of a deleted id is ever created again: the
-- trigger below refuses it, whichever statement inserts it.

CREATE TABLE deleted_conversations (
    conversation_id  uuid PRIMARY KEY,
    namespace        text NOT NULL,
    deleted_at       bigint NOT NULL,
    -- The delete call that made it, by the token of that call, and the rows
    -- it deleted (the figures of its report, in their order): a retried
    -- delete whose first attempt committed unacknowledged answers as that
    -- attempt did.
    deleted_by       uuid NOT NULL,
    counts           bigint[] NOT NULL
);

-- After the row is in (not before): an insert that waited for a delete of
-- the same id to commit checks, with a fresh snapshot, the tombstone that
-- delete left.
CREATE FUNCTION turnstile_refuse_deleted_conversation() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM deleted_conversations WHERE conversation_id = NEW.conversation_id) THEN
        RAISE EXCEPTION 'turnstile: deleted' USING ERRCODE = 'P0001';
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER conversation_not_deleted AFTER INSERT ON conversations
FOR EACH ROW EXECUTE FUNCTION turnstile_refuse_deleted_conversation();
