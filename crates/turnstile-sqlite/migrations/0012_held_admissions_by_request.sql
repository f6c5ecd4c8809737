-- Held admissions, keyed by the request that holds them (issue 14).
--
-- Every turn step refreshes its admission's activity time (`updated_at`:
-- the checkpoint and tool-result triggers of 0004), so an index keyed by
-- that time moved its entry at every step: one more WAL page per step. The
-- request id holds still while the admission is held, so this entry is
-- written at the claim and removed at the release only. `ls --stuck`
-- sorts the held admissions by activity itself (they are few), and
-- `recovery_usage`, which finds an admission by its request id, now finds
-- it through this index instead of walking every held admission.
-- A query uses it when its `WHERE` implies the index's
-- (`active_request_id IS NOT NULL`, or `active_request_id = ?`).
DROP INDEX admissions_held;
CREATE INDEX admissions_held ON admissions (active_request_id)
    WHERE active_request_id IS NOT NULL;
