-- Registry Coordinator schema, version 1: definitions, runs, their history, call
-- executions and waits. Applied by `coordinator migrate`; recorded in
-- coordinator_migrations with this file's checksum.

-- Immutable workflow definitions by digest. A run references the definition it
-- was admitted under. Definitions are never changed or deleted by Coordinator; a
-- trigger refuses both (an operator pruning unused definitions disables it knowingly).
CREATE TABLE definitions (
    digest       text PRIMARY KEY CHECK (digest ~ '^sha256:[0-9a-f]{64}$'),
    workflow_id  text NOT NULL,
    version      text NOT NULL,
    artifact     bytea NOT NULL,
    stored_at    timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % is not allowed', TG_TABLE_NAME, TG_OP;
END;
$$;
CREATE TRIGGER definitions_immutable BEFORE UPDATE OR DELETE ON definitions
    FOR EACH ROW EXECUTE FUNCTION refuse_change();

CREATE TABLE runs (
    id             uuid PRIMARY KEY,
    digest         text NOT NULL REFERENCES definitions (digest),
    workflow_id    text NOT NULL,
    caller         text NOT NULL,
    start_key      text NOT NULL,            -- the caller's Idempotency-Key
    input_digest   text NOT NULL,            -- sha256 of the canonical input, to refuse key reuse
    input          jsonb NOT NULL,
    state          text NOT NULL CHECK (state IN
                     ('running', 'waiting', 'held', 'finished', 'failed', 'expired', 'cancelled')),
    step           text NOT NULL,            -- the step the run is at, or ended at
    seq            integer NOT NULL,         -- transitions committed = the last history event's seq
    attempt        integer NOT NULL DEFAULT 0,  -- sendings of the current call step
    timer_at       timestamptz,              -- the step's own instant: wait-until, timeout, retry
    due_at         timestamptz,              -- when a worker must next look at the run; NULL: never
    lease_owner    text,                     -- the worker holding the run; due_at is then its expiry
    outputs        jsonb NOT NULL DEFAULT '{}',  -- step id -> output (calls and wait-fors)
    completed      jsonb NOT NULL DEFAULT '{}',  -- step id -> RFC 3339 instant it completed
    outcome        text,
    output         jsonb,
    failure_code   text,
    hold_code      text,
    detail         text,                     -- the failure's or hold's explanation
    admitted_at    timestamptz NOT NULL,
    deadline_at    timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL,
    ended_at       timestamptz,
    UNIQUE (caller, start_key),
    CHECK ((state IN ('finished', 'failed', 'expired', 'cancelled')) = (ended_at IS NOT NULL))
);

-- Claiming due work and the timer's next instant are both range scans of this
-- partial index: waiting-forever and ended runs are not in it at all.
CREATE INDEX runs_due ON runs (due_at) WHERE due_at IS NOT NULL;
-- Listing a caller's runs, newest first, and definitions still in use.
CREATE INDEX runs_by_caller ON runs (caller, admitted_at DESC, id DESC);
CREATE INDEX runs_by_digest ON runs (digest);

-- The append-only history of each run: one event per committed transition.
CREATE TABLE run_events (
    run_id   uuid NOT NULL REFERENCES runs (id),
    seq      integer NOT NULL,
    at       timestamptz NOT NULL,
    kind     text NOT NULL,
    step     text NOT NULL,
    actor    text NOT NULL,                  -- 'coordinator', or the operator who acted
    detail   jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (run_id, seq)
);

CREATE TRIGGER run_events_append_only BEFORE UPDATE OR DELETE ON run_events
    FOR EACH ROW EXECUTE FUNCTION refuse_change();

-- Each sending of a call step: the sealed request (identical on every attempt),
-- when it was dispatched, and what came back.
CREATE TABLE executions (
    run_id           uuid NOT NULL REFERENCES runs (id),
    step             text NOT NULL,
    attempt          integer NOT NULL,
    method           text NOT NULL,
    url              text NOT NULL,
    body             bytea,
    idempotency_key  text,
    sealed_at        timestamptz NOT NULL,
    dispatched_at    timestamptz,
    settled_at       timestamptz,
    status           integer,
    response         bytea,
    outcome          text,
    PRIMARY KEY (run_id, step, attempt)
);

-- The wait-for a run is parked in, keyed for matching an arriving result.
CREATE TABLE waits (
    run_id       uuid PRIMARY KEY REFERENCES runs (id),
    step         text NOT NULL,
    connection   text NOT NULL,
    result       text NOT NULL,
    key          text NOT NULL,
    since        timestamptz NOT NULL,
    timeout_at   timestamptz
);
CREATE INDEX waits_by_key ON waits (connection, result, key);
