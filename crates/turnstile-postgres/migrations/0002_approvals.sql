-- Human approval of tool calls, wall-clock deadlines kept with their
-- request, and the agent a run continued its request with. Keys lead with
-- `conversation_id`, as in 0001 (docs/scale-out.md).

-- One row per tool call a run stopped to ask about: awaiting -> approved |
-- rejected, with the decision's time. What runs is what this table says
-- was approved, never what a client sends back. A row stays after its turn
-- ends: it is the record of who was asked and what was decided.
--
-- Keyed by the call's journal row (`tool_calls`, by position: a call id is
-- model text of any length), which it references: an approval is always of
-- a journaled call, and goes with it (and with its request).
CREATE TABLE approvals (
    conversation_id   uuid NOT NULL,
    request_id        uuid NOT NULL,
    turn              bigint NOT NULL,
    position          bigint NOT NULL,
    -- The run that stopped to ask.
    run_id            uuid NOT NULL,
    status            text NOT NULL CHECK (status IN ('awaiting', 'approved', 'rejected')),
    -- Why it was rejected (the approver's text, given to the model).
    reason            bytea,
    requested_at      bigint NOT NULL,
    decided_at        bigint,
    -- The decision, by the token of the call that made it, and the
    -- admission's revision it produced: a retried decision whose first
    -- attempt committed unacknowledged knows its own.
    decided_by        uuid,
    decided_revision  bigint,
    PRIMARY KEY (conversation_id, request_id, turn, position),
    FOREIGN KEY (conversation_id, request_id, turn, position) REFERENCES tool_calls
        ON DELETE CASCADE
);

-- Awaiting calls only (a partial index: a decided call costs nothing), for
-- the store-wide listing of what waits (`turnstile approvals`).
CREATE INDEX approvals_awaiting ON approvals (requested_at) WHERE status = 'awaiting';

-- A wall-clock deadline given with the request (Unix milliseconds): every
-- run of it, in any process, stops there.
ALTER TABLE requests ADD COLUMN deadline_at bigint;

-- Set only on a run that continued its request with another agent: its
-- fingerprint, and the one the request was held with before.
ALTER TABLE runs ADD COLUMN agent_fingerprint text, ADD COLUMN replaced_fingerprint text;
