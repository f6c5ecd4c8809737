-- Messages may hold content parts (reasoning with its signature, provider
-- metadata): stored in a message's `meta` as `parts` (its text column then
-- empty) and `provider_metadata`, so no table changes. This migration
-- marks a database that may hold them: a turnstile from before it refuses
-- the database (schema too new) instead of reading such a message as empty
-- text and sending the model an answer without its reasoning.
SELECT 1;
