-- Registry Coordinator schema, version 2: calls in flight, cancellation requests,
-- and the admission switch operators use during maintenance.

-- Set when a call's request is sealed and dispatched, cleared when its outcome is
-- recorded. A run found with it set after a crash had a request that may have left.
ALTER TABLE runs ADD COLUMN dispatched_at timestamptz;
-- Each claim's own token: a holder writes only while its claim stands, so a holder
-- whose lease ran out (and was claimed again, even by its own process) or whose run
-- an operator cancelled writes nothing.
ALTER TABLE runs ADD COLUMN lease_token uuid;
-- An operator asked to cancel while a call was in flight: the run is cancelled
-- once that call settles.
ALTER TABLE runs ADD COLUMN cancel_requested boolean NOT NULL DEFAULT false;

-- The claims a process is working on, for its lease keeper to extend while their
-- calls are queued or in flight.
CREATE INDEX runs_leased ON runs (lease_token) WHERE lease_token IS NOT NULL;

CREATE TABLE admission (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    held       boolean NOT NULL,
    reason     text NOT NULL,
    actor      text NOT NULL,
    at         timestamptz NOT NULL
);

-- Every hold and release of admission, for the audit trail.
CREATE TABLE admission_events (
    at      timestamptz NOT NULL,
    held    boolean NOT NULL,
    reason  text NOT NULL,
    actor   text NOT NULL
);
CREATE TRIGGER admission_events_append_only BEFORE UPDATE OR DELETE ON admission_events
    FOR EACH ROW EXECUTE FUNCTION refuse_change();
