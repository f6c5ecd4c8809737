-- Held admissions, keyed by the request that holds them (as SQLite's 0012).
--
-- Every turn step refreshes its admission's activity time (`updated_at`),
-- and an index on that column kept each such update from being a HOT
-- update: every step wrote a new entry into each index of `admissions`.
-- The request id holds still while the admission is held, so this entry
-- changes at the claim and the release only. `ls --stuck` sorts the held
-- admissions by activity itself (they are few). A query uses it when its
-- `WHERE` implies the index's (`active_request_id IS NOT NULL`).
DROP INDEX admissions_held;
CREATE INDEX admissions_held ON admissions (active_request_id)
    WHERE active_request_id IS NOT NULL;
