-- No index of held admissions by the request that holds them (0012): its
-- entry was written at every claim and removed at every release, a page
-- of its own for each of the two steps a request has. What it served
-- finds its admission another way: a request's admission through the
-- request's conversation (`requests` is keyed by the request id), and the
-- held admissions that `ls --stuck` and `doctor` list by reading every
-- admission, one row a conversation, as the operators' commands can
-- afford. PostgreSQL's migration 0029 makes the same change.
DROP INDEX admissions_held;
