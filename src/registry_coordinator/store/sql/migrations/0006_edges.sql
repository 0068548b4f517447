-- Registry Coordinator schema, version 6: defects counted per run, answers that
-- arrive after their claim was lost, and deliveries that never miss a wait.

-- Unexpected errors of Coordinator's own at the run's current step, one after another
-- (a definition this build cannot load, an exception, a statement the database
-- refused): after a few the run is held (definition-unusable, engine-defect) instead
-- of being tried again forever. Every transition sets it back to 0.
ALTER TABLE runs ADD COLUMN defects integer NOT NULL DEFAULT 0;

-- An answer to a sending that came back after the claim that sent it was lost (its
-- lease ran out during a database outage and another holder took the run over, which
-- held it as interrupted): kept as the product's evidence, shown with the hold and
-- used by reconcile. The execution's own status and response stay what its settling
-- holder recorded.
ALTER TABLE executions ADD COLUMN late_status integer;
ALTER TABLE executions ADD COLUMN late_response bytea;
ALTER TABLE executions ADD COLUMN late_at timestamptz;

-- The lock a result key's deliveries and the runs beginning to wait for it share, held
-- to the end of the transaction. Whichever comes second looks for the other with a
-- snapshot taken after the lock was had (READ COMMITTED gives every later statement a
-- new one), so a delivery and a wait never both miss each other.
CREATE FUNCTION lock_result_key(connection text, result text, key text) RETURNS void
LANGUAGE sql VOLATILE
RETURN pg_advisory_xact_lock(hashtextextended(connection || '/' || result || '/' || key, 0));

-- A webhook delivery: kept once per event id, waking the runs waiting for it. One
-- function, so that it stays one statement for the service (its latency is a webhook's
-- wake-up latency) and still looks for waiting runs only after it has the key's lock:
-- each statement of a function sees what committed before it began. A run no worker
-- holds falls due at once; for one a worker holds (reading its result), the new seq
-- tells release_wait a delivery came meanwhile. Only a run still waiting at the step
-- of its wait is touched — rechecked on the row as it stands once its lock is had, so
-- a run that finished meanwhile is never woken again.
CREATE FUNCTION record_delivery(
    p_connection text, p_event_id text, p_result text, p_key text, p_payload jsonb
) RETURNS TABLE (recorded boolean, woke integer)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM lock_result_key(p_connection, p_result, p_key);
    RETURN QUERY
    WITH kept AS (
        INSERT INTO deliveries (connection, event_id, result, key, payload)
        VALUES (p_connection, p_event_id, p_result, p_key, p_payload)
        ON CONFLICT (connection, event_id) DO NOTHING
        RETURNING deliveries.connection, deliveries.result, deliveries.key
    ), waiting AS (
        SELECT w.run_id, w.step FROM waits w JOIN kept k
        ON w.connection = k.connection AND w.result = k.result AND w.key = k.key
    ), woken AS (
        UPDATE runs r
        SET due_at = CASE WHEN r.lease_token IS NULL THEN now() ELSE r.due_at END,
            seq = r.seq + 1, updated_at = greatest(now(), r.updated_at)
        FROM waiting w
        WHERE r.id = w.run_id AND r.state = 'waiting' AND r.step = w.step
        RETURNING r.id, r.seq, r.step, r.updated_at AS at
    ), noted AS (
        INSERT INTO run_events (run_id, seq, at, kind, step, actor, detail)
        SELECT woken.id, woken.seq, woken.at, 'result-delivered', woken.step,
               'webhook:' || p_connection,
               jsonb_build_object('eventId', p_event_id, 'result', p_result, 'key', p_key)
        FROM woken
    )
    SELECT EXISTS (SELECT 1 FROM kept), (SELECT count(*) FROM woken)::integer;
    PERFORM pg_notify('coordinator_wake', 'delivery');
END;
$$;
