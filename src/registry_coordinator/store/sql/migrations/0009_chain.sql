-- Registry Coordinator schema, version 9: each run's history is a hash chain.
--
-- Every event carries hash = SHA-256 of the canonical JSON of
--   {"actor", "at", "detail", "prev", "run", "seq", "step", "type"}
-- where prev is the hex hash of the run's previous event (null for its first), at is the
-- RFC 3339 instant, and canonical JSON is keys sorted by code point, no whitespace, strings
-- escaped as JSON requires and nothing more (UTF-8 otherwise), and numbers in plain decimal
-- with no trailing zeros. semantics/chain.py computes the same bytes, so a history can be
-- checked without the database. The hash is written by the statement that writes the
-- event (a trigger): no statement of the engine changes, and none takes a round trip more.

-- The canonical JSON text of a jsonb value, as semantics/chain.py writes it. Scalars are
-- written where they stand, so that a call is made only for what nests.
CREATE FUNCTION canonical_json(value jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT AS $$
BEGIN
    CASE jsonb_typeof(value)
    WHEN 'object' THEN
        RETURN '{' || coalesce((
            SELECT string_agg(to_json(key)::text || ':' || CASE jsonb_typeof(item)
                    WHEN 'string' THEN to_json(item #>> '{}')::text
                    WHEN 'number' THEN trim_scale((item #>> '{}')::numeric)::text
                    WHEN 'object' THEN canonical_json(item)
                    WHEN 'array' THEN canonical_json(item)
                    ELSE item::text END,
                ',' ORDER BY key COLLATE "C")
            FROM jsonb_each(value) AS e (key, item)), '') || '}';
    WHEN 'array' THEN
        RETURN '[' || coalesce((
            SELECT string_agg(canonical_json(item), ',' ORDER BY n)
            FROM jsonb_array_elements(value) WITH ORDINALITY AS e (item, n)), '') || ']';
    WHEN 'string' THEN
        RETURN to_json(value #>> '{}')::text;
    WHEN 'number' THEN
        RETURN trim_scale((value #>> '{}')::numeric)::text;
    ELSE  -- true, false, null
        RETURN value::text;
    END CASE;
END;
$$;

-- The hash of one event, chained to the hash of the event before it.
CREATE FUNCTION event_hash(
    prev bytea, run uuid, seq integer, at timestamptz, kind text, step text, actor text,
    detail jsonb
) RETURNS bytea
LANGUAGE sql IMMUTABLE AS $$
    -- canonical_json of {actor, at, detail, prev, run, seq, step, type}, its keys in order
    SELECT sha256(convert_to(
        '{"actor":' || to_json(actor)::text || ',"at":' || to_json(rfc3339(at))::text
        || ',"detail":' || canonical_json(detail)
        || ',"prev":' || coalesce(to_json(encode(prev, 'hex'))::text, 'null')
        || ',"run":"' || run::text || '","seq":' || seq::text
        || ',"step":' || to_json(step)::text || ',"type":' || to_json(kind)::text || '}',
        'UTF8'));
$$;

ALTER TABLE run_events ADD COLUMN hash bytea;

-- The histories written before this version, chained in order. The append-only rule is
-- lifted for this one statement, inside the migration's transaction.
ALTER TABLE run_events DISABLE TRIGGER run_events_append_only;
DO $$
DECLARE
    e record;
    previous bytea;
    current uuid;
BEGIN
    FOR e IN SELECT * FROM run_events ORDER BY run_id, seq LOOP
        IF e.run_id IS DISTINCT FROM current THEN
            previous := NULL;
            current := e.run_id;
        END IF;
        previous := event_hash(previous, e.run_id, e.seq, e.at, e.kind, e.step, e.actor,
                               e.detail);
        UPDATE run_events SET hash = previous WHERE run_id = e.run_id AND seq = e.seq;
    END LOOP;
END;
$$;
ALTER TABLE run_events ENABLE TRIGGER run_events_append_only;
ALTER TABLE run_events ALTER COLUMN hash SET NOT NULL;

-- Every event from now on: chained to its run's previous event, which the same run's
-- earlier statement (or an earlier row of the same statement) wrote. A gap is refused:
-- a history the chain cannot follow is never written.
CREATE FUNCTION chain_event() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    previous bytea;
BEGIN
    IF NEW.seq > 1 THEN
        SELECT hash INTO previous FROM run_events
        WHERE run_id = NEW.run_id AND seq = NEW.seq - 1;
        IF previous IS NULL THEN
            RAISE EXCEPTION 'run % has no event % to chain event % to',
                NEW.run_id, NEW.seq - 1, NEW.seq;
        END IF;
    END IF;
    NEW.hash := event_hash(previous, NEW.run_id, NEW.seq, NEW.at, NEW.kind, NEW.step,
                           NEW.actor, NEW.detail);
    RETURN NEW;
END;
$$;
CREATE TRIGGER run_events_chained BEFORE INSERT ON run_events
    FOR EACH ROW EXECUTE FUNCTION chain_event();
