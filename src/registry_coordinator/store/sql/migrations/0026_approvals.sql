-- Registry Coordinator schema, version 26: a second pair of eyes on a mutation in doubt.
--
-- Over a connection configured ``fourEyes``, a retry-same or a cancel of a run held
-- because nobody knows whether its mutation took effect is kept here, pending, instead of
-- taken: it takes effect when a second operator approves it, and only while the run is
-- as it was when it was asked for (its ``seq``); the approval is decided in the
-- transaction of the action's own write. At most one is pending per run. Both people,
-- when, and both reasons (sealed under the shared key) are kept, and the run's history
-- names both.
CREATE TABLE approvals (
    id           uuid PRIMARY KEY,
    run_id       uuid NOT NULL,  -- no reference: the run may be archived after
    seq          integer NOT NULL,
    action       text NOT NULL,
    said         jsonb NOT NULL,
    said_key     bigint REFERENCES data_keys (id),
    requested_by text NOT NULL,
    requested_at timestamptz NOT NULL,
    state        text NOT NULL,
    decided_by   text,
    decided_at   timestamptz,
    decision     jsonb,
    decision_key bigint REFERENCES data_keys (id)
);
CREATE UNIQUE INDEX approvals_one_pending ON approvals (run_id) WHERE state = 'pending';
CREATE INDEX approvals_by_time ON approvals (requested_at);
