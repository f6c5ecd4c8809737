-- An admission's claim and release update its row in place (a HOT update,
-- when its page has room): no index of `admissions` names a column they
-- change. As SQLite's 0026 for the index of held admissions.
--
-- The index of held admissions by the request that holds them (0007) is
-- gone: every claim and release changed its key, so each wrote a new
-- tuple and a new entry into every index of the table. What it served
-- finds its admission another way: a request's admission through the
-- request's conversation, and the held admissions that `ls --stuck` and
-- `doctor` list by reading every admission, one row a conversation, as
-- the operators' commands can afford.
DROP INDEX admissions_held;

-- The leased admissions, without naming the holder: every change of owner
-- drops the lease (`lease_follows_owner`, 0005), so an admission with a
-- lease is held, and the index's predicate need not say it.
DROP INDEX admissions_leased;
CREATE INDEX admissions_leased ON admissions (lease_expires_at)
    WHERE lease_expires_at IS NOT NULL;
