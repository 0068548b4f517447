-- Registry Coordinator schema, version 23: a connection paused for its product's
-- maintenance.
--
-- While a connection is paused, no call is sent over it: a run that comes to a call step
-- of it is parked (``paused_for`` names the connection, due at its deadline, so it still
-- expires), nothing is held, and resuming makes every parked run due at once. Who paused
-- and resumed, when and why is kept in ``connection_pause_events``, append-only, the
-- reason sealed under the shared key as admission's is. A change notifies every process.
CREATE TABLE connection_pauses (
    connection text PRIMARY KEY,
    paused_at  timestamptz NOT NULL,
    actor      text NOT NULL,
    reason     jsonb NOT NULL,
    data_key   bigint REFERENCES data_keys (id)
);
CREATE TABLE connection_pause_events (
    connection text NOT NULL,
    at         timestamptz NOT NULL,
    paused     boolean NOT NULL,
    actor      text NOT NULL,
    reason     jsonb NOT NULL,
    data_key   bigint REFERENCES data_keys (id)
);
CREATE INDEX connection_pause_events_by_time ON connection_pause_events (at);
CREATE TRIGGER connection_pause_events_append_only
    BEFORE UPDATE OR DELETE ON connection_pause_events
    FOR EACH ROW EXECUTE FUNCTION refuse_change();
ALTER TABLE runs ADD COLUMN paused_for text;
CREATE INDEX runs_paused_for ON runs (paused_for) WHERE paused_for IS NOT NULL;
