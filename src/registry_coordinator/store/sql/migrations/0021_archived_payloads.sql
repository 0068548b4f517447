-- Registry Coordinator schema, version 21: an archived run's webhook payloads forgotten.
--
-- A delivery's payload is sealed under the shared key, which is never erased, and an
-- erasure forgets the payloads its subject's runs waited for by their ``waiting`` events
-- (schema 18). An archived run's events have left for its bundle, so an erasure after
-- the archiving could no longer find them. The payload is never read once kept (a wake
-- reads its result from the product; the delivery's row, not its payload, says it
-- came), so the archiving forgets it in the transaction that removes the run: the
-- payloads of the deliveries its runs waited for, unless a run still waits for the same
-- result and key. The row, its event id and when it came stay.
CREATE FUNCTION waited_for(runs uuid[])
RETURNS TABLE (connection text, result text, key text)
LANGUAGE sql STABLE SET search_path = pg_catalog, public AS $$
    -- A wait-for's event names its result as <connection>.<result>.
    SELECT DISTINCT split_part(e.detail->>'result', '.', 1),
           substr(e.detail->>'result', strpos(e.detail->>'result', '.') + 1),
           e.detail->>'key'
    FROM run_events e
    WHERE e.run_id = ANY (runs) AND e.kind = 'waiting' AND e.detail ? 'key';
$$;
REVOKE ALL ON FUNCTION waited_for(uuid[]) FROM PUBLIC;

CREATE OR REPLACE FUNCTION forget_deliveries(data_key bigint) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    WITH forgotten AS (
        UPDATE deliveries d SET payload = NULL
        FROM waited_for(ARRAY(SELECT id FROM runs r
                              WHERE r.data_key = forget_deliveries.data_key)) w
        WHERE d.connection = w.connection AND d.result = w.result AND d.key = w.key
          AND d.payload IS NOT NULL
        RETURNING 1
    )
    SELECT count(*)::integer FROM forgotten;
$$;

CREATE OR REPLACE FUNCTION remove_archived(runs uuid[]) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    WITH gone AS (
        SELECT id FROM archived_runs WHERE id = ANY (runs)
    ), forgotten AS (  -- read before the history goes: a statement sees one snapshot
        UPDATE deliveries d SET payload = NULL
        FROM waited_for(ARRAY(SELECT id FROM gone)) w
        WHERE d.connection = w.connection AND d.result = w.result AND d.key = w.key
          AND d.payload IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM waits s
                          WHERE s.connection = w.connection AND s.result = w.result
                            AND s.key = w.key AND s.run_id <> ALL (runs))
    ), history AS (
        DELETE FROM run_events WHERE run_id IN (SELECT id FROM gone) RETURNING 1
    ), calls AS (
        DELETE FROM executions WHERE run_id IN (SELECT id FROM gone) RETURNING 1
    ), parked AS (
        DELETE FROM waits WHERE run_id IN (SELECT id FROM gone) RETURNING 1
    ), removed AS (
        DELETE FROM runs WHERE id IN (SELECT id FROM gone) RETURNING 1
    )
    SELECT count(*)::integer FROM removed;
$$;
