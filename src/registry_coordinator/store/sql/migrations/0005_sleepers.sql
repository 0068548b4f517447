-- Registry Coordinator schema, version 5: the timer service wakes wait-untils whose
-- instant has come in batches, one statement for many runs, instead of one worker
-- transaction each — so thousands falling due in the same second are on time.

-- A run sleeping at a wait-until: the step it goes on to when the instant comes
-- (computed by the engine from the definition when the run began to sleep). NULL
-- for every other run, and for runs that began to sleep under schema version 4,
-- which workers wake one at a time as before.
ALTER TABLE runs ADD COLUMN wakes_to text;

-- The timer's next instant and its batches are range scans of this partial index:
-- only sleeping runs are in it.
CREATE INDEX runs_sleeping ON runs (timer_at) WHERE wakes_to IS NOT NULL;

-- An instant as the engine writes it in `completed` (expressions.format_instant):
-- RFC 3339 in UTC with a Z, fractional seconds only when present, without trailing
-- zeros. Statements that complete a step themselves use it.
CREATE FUNCTION rfc3339(at timestamptz) RETURNS text
LANGUAGE sql STABLE STRICT PARALLEL SAFE
RETURN to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS')
    || CASE WHEN to_char(at AT TIME ZONE 'UTC', 'US') = '000000' THEN ''
            ELSE '.' || rtrim(to_char(at AT TIME ZONE 'UTC', 'US'), '0') END
    || 'Z';
