-- Registry Coordinator schema, version 18: an erased subject's webhook payloads forgotten.
--
-- A delivery names no run when it comes (it may come before its run waits, or for none),
-- so its payload is sealed under the shared key, which is never erased. When a subject's
-- key is erased, the payloads of the deliveries its runs waited for — by connection,
-- result and key, as each run's ``waiting`` events name them — are set to NULL: the row,
-- its event id and when it came stay, so a delivery sent again is still known as one.
-- deliveries stays append-only otherwise: the one change its trigger lets through sets a
-- payload to NULL and nothing else.
CREATE FUNCTION deliveries_forget_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.payload IS NULL
       AND (NEW.connection, NEW.event_id, NEW.result, NEW.key, NEW.received_at)
           IS NOT DISTINCT FROM (OLD.connection, OLD.event_id, OLD.result, OLD.key, OLD.received_at)
    THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'deliveries is append-only: % is not allowed (only a payload may be forgotten)', TG_OP;
END;
$$;
DROP TRIGGER deliveries_append_only ON deliveries;
CREATE TRIGGER deliveries_append_only BEFORE UPDATE OR DELETE ON deliveries
    FOR EACH ROW EXECUTE FUNCTION deliveries_forget_only();

-- The runtime role has no UPDATE on deliveries: this runs with the schema owner's rights
-- and forgets only payloads the runs of one data key waited for. A wait-for's event names
-- its result as <connection>.<result>.
CREATE FUNCTION forget_deliveries(data_key bigint) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    WITH waited AS (
        SELECT DISTINCT split_part(e.detail->>'result', '.', 1) AS connection,
               substr(e.detail->>'result', strpos(e.detail->>'result', '.') + 1) AS result,
               e.detail->>'key' AS key
        FROM runs r JOIN run_events e ON e.run_id = r.id
        WHERE r.data_key = forget_deliveries.data_key AND e.kind = 'waiting'
          AND e.detail ? 'key'
    ), forgotten AS (
        UPDATE deliveries d SET payload = NULL
        FROM waited w
        WHERE d.connection = w.connection AND d.result = w.result AND d.key = w.key
          AND d.payload IS NOT NULL
        RETURNING 1
    )
    SELECT count(*)::integer FROM forgotten;
$$;
REVOKE ALL ON FUNCTION forget_deliveries(bigint) FROM PUBLIC;
