-- Registry Coordinator schema, version 14: serve may run as a runtime role that cannot
-- delete history. The one way a history leaves the hot tables, its run archived to a
-- verified bundle in the same transaction, becomes a function that runs with the schema
-- owner's rights: the runtime role is granted no DELETE on runs, run_events or
-- executions, and the function removes only runs archived_runs records.
CREATE FUNCTION remove_archived(runs uuid[]) RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    WITH gone AS (
        SELECT id FROM archived_runs WHERE id = ANY (runs)
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
-- Only whoever may run serve's statements calls it: granted with them (store/roles.py).
REVOKE ALL ON FUNCTION remove_archived(uuid[]) FROM PUBLIC;
