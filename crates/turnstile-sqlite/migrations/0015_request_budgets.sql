-- A request's budget (turn, tool-call and token limits) is stored with its
-- claim, as its deadline is, so every later run of it honours the same
-- limits. A JSON object of the limits set (`max_turns`, `max_tool_calls`,
-- `max_tokens`); NULL for none. A continuing run that changes the budget
-- records the change (`{"from": …, "to": …}`) in `runs.budget_change`.
ALTER TABLE requests ADD COLUMN budget TEXT;
ALTER TABLE runs ADD COLUMN budget_change TEXT;
