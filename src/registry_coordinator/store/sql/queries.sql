-- Named queries of Registry Coordinator, loaded by database.py at import and looked up
-- by name only. Each starts with a `-- name:` line, then a one-line description (and,
-- after a bare `--` line, as much more as it needs); it takes psycopg named parameters,
-- %(name)s. The description stays in the text sent, as a comment.

-- name: backend_pid
-- The PostgreSQL session this statement runs in (store.poolers: is it the same each time?).
SELECT pg_backend_pid() AS pid;

-- name: server_version
-- The server's version, as a number to compare (170000 is 17.0) and as text.
SELECT current_setting('server_version_num')::integer AS version,
       current_setting('server_version') AS text;

-- name: create_migrations_table
-- The table that records each applied migration with its file's SHA-256.
CREATE TABLE IF NOT EXISTS coordinator_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    checksum    text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- name: migrations_table_exists
-- Whether a migration was ever applied to this database (its table exists).
SELECT to_regclass('coordinator_migrations') IS NOT NULL AS present;

-- name: applied_migrations
-- The migrations applied to this database, in version order.
SELECT version, name, checksum FROM coordinator_migrations ORDER BY version;

-- name: record_migration
-- Record a migration as applied, with its file's checksum.
INSERT INTO coordinator_migrations (version, name, checksum)
VALUES (%(version)s, %(name)s, %(checksum)s);

-- name: lock_migrations
-- Make concurrent migrates wait for each other, until this transaction ends.
SELECT pg_advisory_xact_lock(7261150001);

-- name: store_definition
-- Keep a pinned definition's artifact by its digest (once: a digest names its bytes).
INSERT INTO definitions (digest, workflow_id, version, artifact)
VALUES (%(digest)s, %(workflow_id)s, %(version)s, %(artifact)s)
ON CONFLICT (digest) DO NOTHING;

-- name: definition_artifact
-- The artifact a definition was packaged as, by its digest.
SELECT artifact FROM definitions WHERE digest = %(digest)s;

-- name: admit_run
-- A new run, due at once, unless admission is held or the caller already used the key.
--
-- The admission row is locked (shared) by the statement that inserts the run: a hold
-- (which updates that row) and a start serialize, so a start that commits after a hold
-- has seen it. A run sealed under its subject's key (%(subject_key)s) is admitted only while
-- that key is live, shared-locked as erasure locks it (lock_subject_data_key): stale_keys
-- names it otherwise. The terms its search fields give are kept beside it (run_search).
-- Returns admission as it stood, and the run admitted, if one was, with its status as
-- run_status shows it. (admit_runs does the same for many starts.)
WITH gate AS MATERIALIZED (
    SELECT held, reason, actor, data_key AS reason_key FROM admission FOR SHARE
), workflow_gate AS MATERIALIZED (  -- its workflow's starts held (schema 27), shared as gate
    SELECT held FROM workflow_holds WHERE workflow_id = %(workflow_id)s FOR SHARE
), subject AS MATERIALIZED (
    SELECT id FROM data_keys WHERE id = %(subject_key)s AND erased_at IS NULL FOR KEY SHARE
), admitted AS (
    INSERT INTO runs (id, digest, workflow_id, caller, start_key, start_digest, input,
                      data_key, state, step, seq, due_at, admitted_at, deadline_at,
                      updated_at, traceparent, concurrency_key)
    SELECT %(id)s, %(digest)s, %(workflow_id)s, %(caller)s, %(start_key)s, %(start_digest)s,
           %(input)s, %(data_key)s, 'running', %(step)s, 1, now(), now(),
           now() + %(deadline)s, now(), %(traceparent)s, %(concurrency_key)s
    WHERE NOT EXISTS (SELECT FROM gate WHERE held)
      AND NOT EXISTS (SELECT FROM workflow_gate WHERE held)
      AND (%(subject_key)s::bigint IS NULL OR EXISTS (SELECT FROM subject))
      AND NOT EXISTS (SELECT FROM archived_runs  -- a key is remembered past archiving
                      WHERE caller = %(caller)s AND start_key = %(start_key)s)
    -- The caller's key in use (runs_by_start_keys then finds the run), or a run of the
    -- concurrency key live (live_runs_of_keys names it).
    ON CONFLICT DO NOTHING
    RETURNING id, workflow_id, digest, caller, state, step, seq, attempt, timer_at, outcome,
              output, data_key, failure_code, hold_code, detail, admitted_at, deadline_at,
              updated_at, ended_at
), evented AS (
    INSERT INTO run_events (run_id, seq, at, kind, step, actor, detail)
    SELECT id, 1, admitted_at, 'admitted', step, %(caller)s, %(detail)s FROM admitted
    RETURNING run_id, hash, detail ->> 'version' AS version
), searched AS (  -- the terms it is found by (run_search)
    INSERT INTO run_search (term, run_id)
    SELECT term, id FROM admitted, unnest(%(search_terms)s::text[]) AS term
)
SELECT gate.held, gate.reason, gate.actor, gate.reason_key,
       ARRAY(SELECT %(workflow_id)s::text FROM workflow_gate WHERE held) AS held_workflows,
       ARRAY(SELECT %(subject_key)s::bigint WHERE %(subject_key)s IS NOT NULL
             EXCEPT SELECT id FROM subject) AS stale_keys,
       (SELECT pg_notify('coordinator_wake', 'admitted') FROM evented) AS notified,
       r.id, r.workflow_id, e.version, r.digest, r.caller, r.state, r.step, r.seq, r.attempt,
       r.timer_at, r.outcome, r.output, r.data_key, r.failure_code, r.hold_code, r.detail,
       r.admitted_at, r.deadline_at, r.updated_at, r.ended_at,
       NULL::integer AS late_attempt, NULL::integer AS late_status,  -- a new run holds no
       NULL::timestamptz AS late_at,                                 -- late answer
       encode(e.hash, 'hex') AS head
FROM gate
LEFT JOIN (admitted r JOIN evented e ON e.run_id = r.id) ON true;

-- name: admit_runs
-- A batch's new runs, due at once, unless admission is held or a start's key is used.
--
-- As admit_run, for many starts in one statement that locks the admission row (shared).
-- Inserted in key order: batches sharing keys wait for one another, never deadlock. A
-- row per run admitted, its status as run_status shows it, with admission as it stood;
-- none admitted, one row of admission alone. A start sealed under its subject's key
-- (subject_keys, NULL for the shared %(data_key)s) is admitted only while that key is live.
WITH gate AS MATERIALIZED (
    SELECT held, reason, actor, data_key AS reason_key FROM admission FOR SHARE
), workflow_gates AS MATERIALIZED (  -- their workflows' starts held (schema 27), in order
    SELECT workflow_id, held FROM workflow_holds
    WHERE workflow_id = ANY (%(workflow_ids)s::text[]) ORDER BY workflow_id FOR SHARE
), subjects AS MATERIALIZED (
    SELECT id FROM data_keys WHERE id = ANY (%(subject_keys)s::bigint[]) AND erased_at IS NULL
    ORDER BY id FOR KEY SHARE
), admitted AS (
    INSERT INTO runs (id, digest, workflow_id, caller, start_key, start_digest, input,
                      data_key, state, step, seq, due_at, admitted_at, deadline_at,
                      updated_at, traceparent, concurrency_key)
    SELECT s.id, s.digest, s.workflow_id, %(caller)s, s.start_key,
           s.start_digest, s.input, coalesce(s.subject_key, %(data_key)s), 'running', s.step,
           1, now(), now(), now() + s.deadline, now(), s.traceparent, s.concurrency_key
    FROM unnest(%(ids)s::uuid[], %(digests)s::text[], %(workflow_ids)s::text[],
                %(start_keys)s::text[], %(start_digests)s::text[], %(inputs)s::jsonb[],
                %(steps)s::text[], %(deadlines)s::interval[], %(traceparents)s::text[],
                %(subject_keys)s::bigint[], %(concurrency_keys)s::text[])
         AS s (id, digest, workflow_id, start_key, start_digest, input, step, deadline,
               traceparent, subject_key, concurrency_key)
    WHERE NOT EXISTS (SELECT FROM gate WHERE held)
      AND s.workflow_id NOT IN (SELECT workflow_id FROM workflow_gates WHERE held)
      AND (s.subject_key IS NULL OR s.subject_key IN (SELECT id FROM subjects))
      AND NOT EXISTS (SELECT FROM archived_runs a  -- a key is remembered past archiving
                      WHERE a.caller = %(caller)s AND a.start_key = s.start_key)
    ORDER BY s.start_key
    ON CONFLICT DO NOTHING  -- as admit_run: a key in use, or a concurrency key's run live
    RETURNING id, workflow_id, digest, caller, state, step, seq, attempt, timer_at, outcome,
              output, data_key, failure_code, hold_code, detail, admitted_at, deadline_at,
              updated_at, ended_at, start_key
), evented AS (
    INSERT INTO run_events (run_id, seq, at, kind, step, actor, detail)
    SELECT r.id, 1, r.admitted_at, 'admitted', r.step, %(caller)s,
           jsonb_build_object('workflow', r.workflow_id, 'version', d.version,
                              'digest', r.digest)
    FROM admitted r JOIN definitions d ON d.digest = r.digest
    RETURNING run_id, hash, detail ->> 'version' AS version
), searched AS (  -- the terms each run admitted is found by, given beside its id
    INSERT INTO run_search (term, run_id)
    SELECT s.term, s.id
    FROM unnest(%(search_ids)s::uuid[], %(search_terms)s::text[]) AS s (id, term)
    WHERE s.id IN (SELECT id FROM admitted)
)
SELECT gate.held, gate.reason, gate.actor, gate.reason_key,
       ARRAY(SELECT workflow_id FROM workflow_gates WHERE held) AS held_workflows,
       ARRAY(SELECT k FROM unnest(%(subject_keys)s::bigint[]) k WHERE k IS NOT NULL
             EXCEPT SELECT id FROM subjects) AS stale_keys,
       (SELECT pg_notify('coordinator_wake', 'admitted') WHERE EXISTS (SELECT FROM evented))
           AS notified,
       r.start_key, r.id, r.workflow_id, e.version, r.digest, r.caller, r.state, r.step, r.seq,
       r.attempt, r.timer_at, r.outcome, r.output, r.data_key, r.failure_code, r.hold_code,
       r.detail, r.admitted_at, r.deadline_at, r.updated_at, r.ended_at,
       NULL::integer AS late_attempt, NULL::integer AS late_status,  -- a new run holds no
       NULL::timestamptz AS late_at,                                 -- late answer
       encode(e.hash, 'hex') AS head
FROM gate
LEFT JOIN (admitted r JOIN evented e ON e.run_id = r.id) ON true;

-- name: live_runs_of_keys
-- The live runs of these workflows' concurrency keys, which a start of one was refused for.
SELECT workflow_id, concurrency_key, id FROM runs
WHERE (workflow_id, concurrency_key) IN (
    SELECT * FROM unnest(%(workflow_ids)s::text[], %(concurrency_keys)s::text[]))
  AND ended_at IS NULL;

-- name: runs_by_start_keys
-- The runs a caller's Idempotency-Keys started, live or archived, and the start each stands for.
--
-- A live run comes with its status as run_status shows it; an archived one with where it
-- went (archived_at, bundle, sha256: null for a live run), as archived_run shows it.
-- Retention moves a run from runs to archived_runs in one transaction, so a key names
-- at most one of the two.
SELECT r.start_key, r.start_digest, r.id, r.workflow_id, d.version, r.digest, r.caller,
       r.state, r.step, r.seq, r.attempt, r.timer_at, r.outcome, r.output, r.data_key,
       r.failure_code, r.hold_code, r.detail, r.admitted_at, r.deadline_at, r.updated_at,
       r.ended_at, late.attempt AS late_attempt, late.late_status, late.late_at,
       encode(head.hash, 'hex') AS head,
       NULL::timestamptz AS archived_at, NULL::text AS bundle, NULL::text AS sha256
FROM runs r JOIN definitions d ON d.digest = r.digest
LEFT JOIN run_events head ON head.run_id = r.id AND head.seq = r.seq
LEFT JOIN LATERAL (  -- as run_status: a held call's latest late answer
    SELECT e.attempt, e.late_status, e.late_at FROM executions e
    WHERE r.state = 'held' AND e.run_id = r.id AND e.step = r.step AND e.late_at IS NOT NULL
    ORDER BY e.attempt DESC LIMIT 1
) late ON true
WHERE r.caller = %(caller)s AND r.start_key = ANY (%(start_keys)s::text[])
UNION ALL
SELECT a.start_key, a.start_digest, a.id, a.workflow_id, NULL, a.digest, a.caller, a.state,
       NULL, a.seq, NULL, NULL, a.outcome, NULL, NULL, NULL, NULL, NULL, a.admitted_at, NULL,
       NULL, a.ended_at, NULL, NULL, NULL, encode(a.head, 'hex'), a.archived_at, a.bundle, a.sha256
FROM archived_runs a
WHERE a.caller = %(caller)s AND a.start_key = ANY (%(start_keys)s::text[]);

-- name: run_status
-- One run as its status shows it, with a held call's late answer, if one came.
SELECT r.id, r.workflow_id, d.version, r.digest, r.caller, r.state, r.step, r.seq, r.attempt,
       r.timer_at, r.outcome, r.output, r.data_key, r.failure_code, r.hold_code, r.detail,
       r.admitted_at, r.deadline_at, r.updated_at, r.ended_at,
       late.attempt AS late_attempt, late.late_status, late.late_at,
       encode(head.hash, 'hex') AS head
FROM runs r JOIN definitions d ON d.digest = r.digest
LEFT JOIN run_events head ON head.run_id = r.id AND head.seq = r.seq  -- the chain's head
LEFT JOIN LATERAL (  -- a held call's latest answer that came back after its claim was lost
    SELECT e.attempt, e.late_status, e.late_at FROM executions e
    WHERE r.state = 'held' AND e.run_id = r.id AND e.step = r.step AND e.late_at IS NOT NULL
    ORDER BY e.attempt DESC LIMIT 1
) late ON true
WHERE r.id = %(id)s;

-- name: run_history
-- A run's history events in order, each with its hash and its run's data key (NULL: in clear).
--
-- sealed_from: the first event written sealed, for a run sealed after it was written.
SELECT e.seq, e.at, e.kind, e.step, e.actor, e.detail, encode(e.hash, 'hex') AS hash, r.data_key,
       r.sealed_from
FROM run_events e JOIN runs r ON r.id = e.run_id
WHERE e.run_id = %(id)s ORDER BY e.seq;

-- name: claim_run
-- Claim the earliest due run that nobody holds.
--
-- Take the earliest due run nobody holds, and hold it until the lease runs out:
-- due_at becomes the lease's expiry, so a crashed holder's run falls due again.
UPDATE runs r
SET due_at = clock_timestamp() + %(lease)s, lease_owner = %(owner)s,
    lease_token = gen_random_uuid()
FROM (
    SELECT id FROM runs
    WHERE due_at <= clock_timestamp() AND ended_at IS NULL
    ORDER BY due_at
    LIMIT 1
    FOR UPDATE SKIP LOCKED
) due
WHERE r.id = due.id
RETURNING r.id, r.workflow_id, r.digest, r.input, r.data_key, r.state, r.step, r.seq,
          r.attempt, r.checks, r.timer_at, r.outputs, r.completed, r.admitted_at, r.deadline_at,
          r.lease_owner, r.lease_token, r.dispatched_at, r.traceparent, clock_timestamp() AS now;

-- name: next_due
-- How long until work falls due: for any worker, and for the timer.
--
-- Seconds until the earliest due run, and until the earliest wait-until the timer
-- wakes itself (due_sleepers; negative when overdue, NULL when there is none).
SELECT (SELECT EXTRACT(EPOCH FROM (min(due_at) - clock_timestamp()))::float8
        FROM runs WHERE due_at IS NOT NULL) AS seconds,
       (SELECT EXTRACT(EPOCH FROM (min(timer_at) - clock_timestamp()))::float8
        FROM runs
        WHERE wakes_to IS NOT NULL AND state = 'waiting' AND lease_token IS NULL
          AND NOT cancel_requested AND deadline_at > greatest(timer_at, clock_timestamp())
       ) AS sleeper_seconds;

-- name: due_sleepers
-- Lock due wait-untils for the timer to take on, many at once.
--
-- The timer service's batches: wait-untils whose instant has come, oldest first, at
-- most %(limit)s, locked for the transaction that takes them on (advance_sleepers)
-- rather than leased, so a crash before it commits leaves them asleep and due. Runs a
-- worker holds are skipped (it wakes them itself), as are runs past their deadline (a
-- worker expires them) and runs an operator asked to cancel. Each comes as claim_run
-- returns a run, and `now` is one instant for all of them.
WITH clock AS (
    SELECT clock_timestamp() AS now
)
SELECT r.id, r.workflow_id, r.digest, r.input, r.data_key, r.state, r.step, r.seq, r.attempt,
       r.checks, r.timer_at, r.outputs, r.completed, r.admitted_at, r.deadline_at,
       %(owner)s::text AS lease_owner, r.lease_token, r.dispatched_at, r.traceparent, clock.now
FROM runs r, clock
WHERE r.wakes_to IS NOT NULL AND r.timer_at <= clock.now AND r.state = 'waiting'
  AND r.lease_token IS NULL AND NOT r.cancel_requested AND r.deadline_at > clock.now
ORDER BY r.timer_at
LIMIT %(limit)s
FOR UPDATE OF r SKIP LOCKED;

-- name: advance_sleepers
-- Commit many woken runs' transitions and their history events in one statement.
--
-- The `transition` statement for many runs at once, each a record of `runs` and its
-- events records of `events` (a finished run's output boxed: [output]), as the
-- timer's batches write them (statements.batch): each run's step and the steps after
-- it that need nothing from outside, one event each, the run left due at once for any
-- worker (or ended, or asleep at its next wait-until) and leased to nobody. Fenced on
-- what the runs were when due_sleepers locked them (at `seq`, at their step, held by
-- nobody, no cancellation asked), which the lock keeps so: a run another statement
-- moved would be written nothing. The events go in run and seq order (each is chained
-- to the one before it, schema 9), all at the same instant.
WITH planned AS (
    SELECT *
    FROM jsonb_to_recordset(%(runs)s::jsonb)
        AS p (id uuid, seq int, count int, event_step text, state text, step text,
              attempt int, timer_at timestamptz, wakes_to text, due_at timestamptz,
              outputs jsonb, completed jsonb, outcome text, output jsonb, failure_code text,
              hold_code text, detail text, ends boolean)
), moved AS (
    UPDATE runs r
    SET state = p.state, step = p.step, seq = r.seq + p.count, attempt = p.attempt,
        timer_at = p.timer_at, wakes_to = p.wakes_to, due_at = p.due_at,
        lease_owner = NULL, lease_token = NULL,
        outputs = r.outputs || p.outputs, completed = r.completed || p.completed,
        outcome = p.outcome, output = p.output -> 0, failure_code = p.failure_code,
        hold_code = p.hold_code, detail = p.detail,
        updated_at = greatest(%(now)s, r.updated_at),
        ended_at = CASE WHEN p.ends THEN greatest(%(now)s, r.updated_at) END,
        dispatched_at = NULL, cancel_requested = false, defects = 0, checks = 0
    FROM planned p
    WHERE r.id = p.id AND r.seq = p.seq AND r.step = p.event_step AND r.lease_token IS NULL
      AND NOT r.cancel_requested
    RETURNING r.id, p.seq AS before, r.updated_at AS at
), unwaited AS (
    DELETE FROM waits WHERE run_id IN (SELECT id FROM moved)
)
INSERT INTO run_events (run_id, seq, at, kind, step, actor, detail)
SELECT m.id, m.before + e.n, m.at, e.kind, e.step, %(actor)s, e.detail
FROM jsonb_to_recordset(%(events)s::jsonb) AS e (run uuid, n int, kind text, step text,
                                                 detail jsonb)
JOIN moved m ON m.id = e.run
ORDER BY m.id, e.n
RETURNING run_id;

-- name: leave_to_workers
-- Wait-untils the timer could not take on: a worker wakes each of them itself.
--
-- Without `wakes_to` a due wait-until is not the timer's (due_sleepers) but the
-- workers': claimed like any due run, its definition loaded and its step taken by
-- store.commit, which records a defect and holds the run if need be.
UPDATE runs SET wakes_to = NULL
WHERE id = ANY (%(ids)s::uuid[]) AND state = 'waiting';

-- name: transition
-- Commit a run's transitions and their history events, fenced on its claim.
--
-- Commit a run's transitions and their history events (one each, in order: a step
-- and the steps after it that need nothing from outside), only while this claim still
-- holds the run (its lease token) at the step it decided them for. Every transition
-- either moves the run to another step or gives up the claim (the graph is acyclic),
-- so one claim applies a step's transition once: a statement sent again after an
-- outage hid whether it committed writes nothing the second time. A holder whose lease
-- ran out, or whose run an operator cancelled, writes nothing either. When the first
-- transition settles a call, the call's outcome is recorded by the same statement —
-- unless an operator asked to cancel meanwhile (%(honour_cancel)s): then nothing is
-- written and the holder commits the cancellation instead. Leaving a wait-for drops
-- its wait. Events are never dated before the run's last one (a delivery or an
-- operator may have written one since the holder decided), so `at` grows with `seq`.
-- A `result-read` event (the read that completes a wait-for) is given its `via` here:
-- `delivery` if a webhook delivered the result the run waited for, else `poll`.
WITH moved AS (
    UPDATE runs
    SET state = %(state)s, step = %(step)s, seq = seq + cardinality(%(kinds)s::text[]),
        attempt = %(attempt)s, checks = %(checks)s,
        timer_at = %(timer_at)s, wakes_to = %(wakes_to)s, due_at = %(due_at)s,
        lease_owner = %(lease_owner)s, lease_token = %(lease_token)s,
        outputs = outputs || %(outputs)s, completed = completed || %(completed)s,
        outcome = %(outcome)s, output = %(output)s, failure_code = %(failure_code)s,
        hold_code = %(hold_code)s, detail = %(detail)s,
        updated_at = greatest(%(now)s, updated_at),
        ended_at = CASE WHEN %(ends)s THEN greatest(%(now)s, updated_at) END,
        dispatched_at = NULL, cancel_requested = false, defects = 0
    WHERE id = %(id)s AND lease_token = %(token)s AND step = %(event_step)s
      AND NOT (cancel_requested AND %(honour_cancel)s)
    RETURNING id, seq, updated_at AS at
), unwaited AS (
    DELETE FROM waits WHERE %(leaves_wait)s AND run_id IN (SELECT id FROM moved)
), settled AS (
    UPDATE executions
    SET settled_at = %(now)s, status = %(call_status)s, response = %(call_response)s,
        outcome = %(call_outcome)s
    WHERE %(call_outcome)s::text IS NOT NULL AND run_id IN (SELECT id FROM moved)
      AND step = %(event_step)s AND settled_at IS NULL
), delivered AS (  -- the wait as it was: whether a webhook delivered its result and key
    SELECT EXISTS (
        SELECT 1 FROM waits w
        JOIN deliveries d ON d.connection = w.connection AND d.result = w.result
                         AND d.key = w.key
        WHERE w.run_id = %(id)s
    ) AS yes
    WHERE 'result-read' = ANY (%(kinds)s::text[])
)
INSERT INTO run_events (run_id, seq, at, kind, step, actor, detail)
SELECT m.id, m.seq - cardinality(%(kinds)s::text[]) + e.n, m.at, e.kind, e.step,
       %(actor)s,
       CASE WHEN e.kind = 'result-read'
            THEN e.detail || jsonb_build_object('delivered', (SELECT yes FROM delivered))
            ELSE e.detail END
FROM moved m,
     unnest(%(kinds)s::text[], %(event_steps)s::text[], %(events)s::jsonb[])
         WITH ORDINALITY AS e (kind, step, detail, n)
ORDER BY e.n  -- in seq order: each event is chained to the one before it (schema 9)
RETURNING seq;

-- name: unmoved
-- Why a settling holder's transition wrote nothing.
--
-- Why a settling holder's transition wrote nothing: an operator asked to cancel while
-- its claim stands (holding, cancel_requested); its own earlier sending of the same
-- statement committed (the call's execution holds the outcome and status it was
-- recording); or its claim is gone.
SELECT r.lease_token IS NOT DISTINCT FROM %(token)s AS holding, r.cancel_requested,
       e.outcome, e.status
FROM runs r
LEFT JOIN executions e ON e.run_id = r.id AND e.step = %(step)s AND e.attempt = %(attempt)s
WHERE r.id = %(id)s;

-- name: release_run
-- Give a claimed run back without a transition (nothing was due yet).
UPDATE runs SET due_at = %(due_at)s, lease_owner = NULL, lease_token = NULL
WHERE id = %(id)s AND lease_token = %(token)s;

-- name: lock_result_key
-- Take a result key's lock before a run begins to wait for that result.
--
-- Taken first by the transaction in which a run begins to wait, as a delivery takes it
-- (the function lock_result_key, schema 6), so neither misses the other.
SELECT lock_result_key(%(connection)s, %(result)s, %(key)s);

-- name: register_wait
-- Register a run's wait; due at once if its result was delivered already.
--
-- A run begins to wait (in the transaction that holds lock_result_key): its wait is
-- registered, and if its result was delivered already (even before the wait existed),
-- it is due at once to read it.
WITH registered AS (
    INSERT INTO waits (run_id, step, connection, result, key, since, timeout_at)
    VALUES (%(id)s, %(step)s, %(connection)s, %(result)s, %(key)s, %(now)s, %(timeout_at)s)
    RETURNING run_id
)
UPDATE runs SET due_at = now()
WHERE id IN (SELECT run_id FROM registered) AND EXISTS (
    SELECT 1 FROM deliveries
    WHERE connection = %(connection)s AND result = %(result)s AND key = %(key)s
)
RETURNING due_at;

-- name: take_over_claims
-- Make the claims this holder's dead predecessor left due now.
--
-- At startup: the claims a previous process of this holder (the same host and port)
-- still had when it died fall due at once, instead of when their leases run out. Not
-- while any session of another process of this holder is connected: that process may
-- be alive, and its claims are left to their leases. Either way every write stays
-- fenced by the claim's lease token. A run taken over has been due since its last
-- transition: it goes to the front of the queue, not behind the work that came due
-- while it was held.
UPDATE runs SET due_at = least(updated_at, clock_timestamp())
WHERE lease_owner = %(owner)s AND lease_token IS NOT NULL
  AND NOT EXISTS (
      SELECT 1 FROM pg_stat_activity
      WHERE starts_with(application_name, %(family)s) AND application_name <> %(session)s);

-- name: extend_leases
-- Extend the leases of the claims this process is still working on.
--
-- The lease keeper: this process is still working on these claims (their calls are
-- queued or in flight). A process that dies, or a task that gives up on a claim,
-- stops extending it, and the run falls due when the lease runs out.
UPDATE runs SET due_at = clock_timestamp() + %(lease)s
WHERE lease_token = ANY(%(tokens)s::uuid[]);

-- name: sealed_request
-- The request a call step sealed on its first sending; every later one is identical.
--
-- The bytes are the first sending's; the address and binding the latest's (an operator's
-- rebinding moves them, schema 15), with `rebind` when the next sending is to go to the
-- connection's address as it is now. `uncertain`: whether a sending of it so far may have
-- reached the product without an answer that says what became of it (lost, interrupted,
-- or answered with anything but 401, 403, 429 or 503, which say the product did not act on
-- it): a refusal of the next sending is then no evidence that the command never took effect.
SELECT %(id)s::uuid AS id, %(step)s::text AS step, first.method, latest.url, first.body,
       first.idempotency_key, first.headers, first.prepared, latest.binding, r.rebind, r.data_key,
       EXISTS (SELECT 1 FROM executions e
               WHERE e.run_id = %(id)s AND e.step = %(step)s AND e.dispatched_at IS NOT NULL
                 AND e.outcome IS DISTINCT FROM 'not-sent'
                 AND (e.status IS NULL OR e.status NOT IN (401, 403, 429, 503)))
           AS uncertain
FROM (SELECT * FROM executions WHERE run_id = %(id)s AND step = %(step)s
      ORDER BY attempt LIMIT 1) first,
     (SELECT url, binding FROM executions WHERE run_id = %(id)s AND step = %(step)s
      ORDER BY attempt DESC LIMIT 1) latest,
     (SELECT rebind, data_key FROM runs WHERE id = %(id)s) r;

-- name: dispatch_call
-- Seal the request and mark it dispatched, before a byte is sent.
--
-- Fenced on the claim and on the sending it seals (the attempt before it, not yet
-- dispatched): the same statement sent again after an outage hid whether it committed
-- writes nothing the second time, even if the first commits late.
WITH moved AS (
    UPDATE runs
    SET seq = seq + 1, attempt = attempt + 1, dispatched_at = %(now)s, updated_at = %(now)s,
        rebind = false
    WHERE id = %(id)s AND lease_token = %(token)s AND attempt = %(attempt)s
      AND dispatched_at IS NULL AND NOT cancel_requested
    RETURNING id, seq, attempt
), sealed AS (
    INSERT INTO executions (run_id, step, attempt, method, url, body, idempotency_key,
                            headers, prepared, binding, sealed_at, dispatched_at)
    SELECT id, %(step)s, attempt, %(method)s, %(url)s, %(body)s, %(key)s, %(headers)s,
           %(prepared)s, %(binding)s, %(now)s, %(now)s
    FROM moved
)
INSERT INTO run_events (run_id, seq, at, kind, step, actor, detail)
SELECT id, seq, %(now)s, 'call-dispatched', %(step)s, %(actor)s,
       jsonb_build_object('attempt', attempt, 'method', %(method)s::text,
                         'url', %(event_url)s::text)
FROM moved
RETURNING seq;

-- name: sealing
-- Where a holder's sealing stands, when an outage hid whether it committed.
SELECT lease_token IS NOT DISTINCT FROM %(token)s AS holding, attempt,
       dispatched_at IS NOT NULL AS dispatched
FROM runs WHERE id = %(id)s;

-- name: set_admission
-- Hold or release admission, and record the change in admission's history.
--
-- Its reason is sealed under %(data_key)s, the shared key, with custody.
WITH changed AS (
    INSERT INTO admission (held, reason, actor, at, data_key)
    VALUES (%(held)s, %(reason)s, %(actor)s, now(), %(data_key)s)
    ON CONFLICT (singleton) DO UPDATE
    SET held = excluded.held, reason = excluded.reason, actor = excluded.actor, at = excluded.at,
        data_key = excluded.data_key
    RETURNING held, reason, actor, at, data_key
)
INSERT INTO admission_events (at, held, reason, actor, data_key)
SELECT at, held, reason, actor, data_key FROM changed;

-- name: operator_run
-- A run as an operator action needs it, locked against the engine for the action.
SELECT id, digest, state, step, seq, attempt, dispatched_at, hold_code, data_key
FROM runs WHERE id = %(id)s FOR UPDATE;

-- name: operator_note
-- Record an operator's action that leaves the run where it is.
--
-- An operator's action that leaves the run where it is (a cancellation waiting for
-- a call in flight, a reconciliation without a receipt): only its history event.
-- Operators' events, like every event, are never dated before the run's last one.
WITH moved AS (
    UPDATE runs SET seq = seq + 1, cancel_requested = cancel_requested OR %(cancel)s,
                    updated_at = greatest(now(), updated_at)
    WHERE id = %(id)s AND seq = %(seq)s
    RETURNING id, seq, step, updated_at AS at
)
INSERT INTO run_events (run_id, seq, at, kind, step, actor, detail)
SELECT id, seq, at, %(kind)s, step, %(actor)s, %(event)s FROM moved
RETURNING seq;

-- name: operator_cancel
-- Cancel a run at the seq the operator read: it ends, and any wait it had is dropped.
WITH moved AS (
    UPDATE runs
    SET state = 'cancelled', seq = seq + 1, due_at = NULL, timer_at = NULL, wakes_to = NULL,
        lease_owner = NULL, lease_token = NULL, hold_code = NULL, detail = %(detail)s,
        updated_at = greatest(now(), updated_at), ended_at = greatest(now(), updated_at)
    WHERE id = %(id)s AND seq = %(seq)s
    RETURNING id, seq, step, updated_at AS at
), unwaited AS (
    DELETE FROM waits WHERE run_id IN (SELECT id FROM moved)
)
INSERT INTO run_events (run_id, seq, at, kind, step, actor, detail)
SELECT id, seq, at, 'cancelled', step, %(actor)s, %(event)s FROM moved
RETURNING seq;

-- name: operator_resume
-- retry-same: a held run takes its step again, at once.
--
-- retry-same: the held run is due at once to take its step again: a call resends its
-- sealed request, if it has one; a run held while waiting for a result (its wait is
-- still registered) waits again, and reads the result at once.
WITH moved AS (
    UPDATE runs
    SET state = CASE WHEN EXISTS (SELECT 1 FROM waits WHERE run_id = %(id)s)
                     THEN 'waiting' ELSE 'running' END,
        seq = seq + 1, due_at = now(), hold_code = NULL, detail = NULL, defects = 0,
        rebind = %(rebind)s, updated_at = greatest(now(), updated_at)
    WHERE id = %(id)s AND seq = %(seq)s AND state = 'held'
    RETURNING id, seq, step, updated_at AS at
)
INSERT INTO run_events (run_id, seq, at, kind, step, actor, detail)
SELECT id, seq, at, 'retry-same', step, %(actor)s, %(event)s FROM moved
RETURNING seq;

-- name: operator_complete
-- reconcile: a held call's step completes with the product's evidence.
--
-- reconcile: the product's own evidence (its receipt, or an answer that came back
-- late) confirms the call; the step completes with it.
WITH moved AS (
    UPDATE runs
    SET state = 'running', seq = seq + 1, step = %(next)s, attempt = 0, due_at = now(),
        hold_code = NULL, detail = NULL, dispatched_at = NULL, defects = 0,
        updated_at = greatest(now(), updated_at),
        outputs = outputs || %(outputs)s,
        completed = completed || jsonb_build_object(step, rfc3339(greatest(now(), updated_at)))
    WHERE id = %(id)s AND seq = %(seq)s AND state = 'held'
    RETURNING id, seq, updated_at AS at
)
INSERT INTO run_events (run_id, seq, at, kind, step, actor, detail)
SELECT id, seq, at, 'reconciled', %(step)s, %(actor)s, %(event)s FROM moved
RETURNING seq;

-- name: record_delivery
-- Keep a webhook delivery once and wake the runs waiting for it.
--
-- Keep a webhook delivery once per event id and wake the runs waiting for it: the
-- function record_delivery (schema 6) says how, and why it is a function.
SELECT recorded, woke FROM record_delivery(
    %(connection)s, %(event_id)s, %(result)s, %(key)s, %(payload)s);

-- name: feed_cursor
-- Where a connection's result feed has been read up to (no row: from its start).
SELECT cursor FROM feed_cursors WHERE connection = %(connection)s;

-- name: move_feed
-- Move a connection's feed cursor on, unless another follower moved it meanwhile.
--
-- Compare and set: the cursor moves from the one this follower read the page from
-- (%(was)s; NULL for the feed's start) to the next; a follower that lost the race to
-- another process writes nothing (the entries they both read are recorded once).
INSERT INTO feed_cursors AS f (connection, cursor, read_at)
VALUES (%(connection)s, %(cursor)s, clock_timestamp())
ON CONFLICT (connection) DO UPDATE SET cursor = EXCLUDED.cursor, read_at = EXCLUDED.read_at
WHERE f.cursor IS NOT DISTINCT FROM %(was)s
RETURNING connection;

-- name: release_wait
-- Give back a waiting run whose result was not final, noting what its read found if that changed.
--
-- Give a waiting run back after reading a result that was not final: due again at
-- its next poll, timeout or deadline — or at once if a delivery was recorded since
-- it was claimed (its seq moved), which the read may not have seen. Evaluated on the
-- row as it stands once a delivery's transaction has let go of it. What the read
-- found (%(polled)s; NULL when the run is given back unread) becomes a result-polled
-- event only if it differs from the last one this wait recorded (none since its
-- waiting event): a wait polling for weeks records each change of answer, not each
-- poll (its `url` aside, the same each poll but sealed afresh in a sealed run). The
-- event is dated as a transition's is, never before the run's last one. A
-- read counts in `attempt`, which a wait's read schedule backs off by.
WITH last AS (  -- the wait's latest recorded poll, or the event it began waiting with
    SELECT kind, detail FROM run_events
    WHERE run_id = %(id)s AND kind IN ('waiting', 'result-polled')
    ORDER BY seq DESC
    LIMIT 1
), noted AS (
    SELECT %(polled)s::jsonb IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM last
        WHERE kind = 'result-polled' AND detail - 'url' = %(polled)s::jsonb - 'url'
    ) AS yes
), moved AS (
    UPDATE runs r
    SET lease_owner = NULL, lease_token = NULL,
        due_at = CASE WHEN r.seq <> %(seq)s THEN now() ELSE %(due_at)s END,
        seq = r.seq + CASE WHEN n.yes THEN 1 ELSE 0 END,
        attempt = r.attempt + CASE WHEN %(polled)s::jsonb IS NOT NULL THEN 1 ELSE 0 END,
        updated_at = CASE WHEN n.yes THEN greatest(%(now)s, r.updated_at)
                          ELSE r.updated_at END
    FROM noted n
    WHERE r.id = %(id)s AND r.lease_token = %(token)s
    RETURNING r.id, r.seq, r.step, r.updated_at AS at, r.due_at, n.yes
), evented AS (
    INSERT INTO run_events (run_id, seq, at, kind, step, actor, detail)
    SELECT id, seq, at, 'result-polled', step, %(actor)s, %(polled)s::jsonb
    FROM moved WHERE yes
)
SELECT due_at FROM moved;

-- name: record_defect
-- Let go of a run after a defect of Coordinator's own: tried again later, or held.
--
-- An unexpected error of Coordinator's own while this claim held the run: let go of
-- it, due again after %(backoff)s doubled for each defect before — or, at the
-- %(limit)s-th in a row, or when a call may have left (its outcome is not guessed),
-- hold it with %(code)s. A held run's open sending is settled as a defect, so an
-- operator's retry-same resends it rather than finding it interrupted again; its
-- history says so (call-lost: no answer was recorded) before the hold.
WITH judged AS (
    SELECT id, step, dispatched_at IS NOT NULL AS dispatched,
           dispatched_at IS NOT NULL OR defects + 1 >= %(limit)s AS holds
    FROM runs WHERE id = %(id)s AND lease_token = %(token)s
    FOR UPDATE
), moved AS (
    UPDATE runs r
    SET defects = r.defects + 1, lease_owner = NULL, lease_token = NULL,
        state = CASE WHEN j.holds THEN 'held' ELSE r.state END,
        hold_code = CASE WHEN j.holds THEN %(code)s ELSE r.hold_code END,
        detail = CASE WHEN j.holds THEN %(detail)s ELSE r.detail END,
        due_at = CASE WHEN j.holds THEN NULL
                      ELSE clock_timestamp() + %(backoff)s::interval * power(2, r.defects) END,
        seq = r.seq + CASE WHEN j.holds THEN 1 + j.dispatched::integer ELSE 0 END,
        dispatched_at = CASE WHEN j.holds THEN NULL ELSE r.dispatched_at END,
        updated_at = CASE WHEN j.holds THEN greatest(clock_timestamp(), r.updated_at)
                          ELSE r.updated_at END
    FROM judged j
    WHERE r.id = j.id
    RETURNING r.id, r.seq, r.step, r.attempt, r.state, r.defects, r.updated_at AS at, j.holds,
              j.dispatched
), settled AS (
    UPDATE executions e SET settled_at = m.at, outcome = 'defect'
    FROM moved m
    WHERE m.holds AND e.run_id = m.id AND e.step = m.step AND e.settled_at IS NULL
), evented AS (
    INSERT INTO run_events (run_id, seq, at, kind, step, actor, detail)
    SELECT m.id, m.seq - e.back, m.at, e.kind, m.step, %(actor)s, e.detail
    FROM moved m, LATERAL (VALUES
        (1, 'call-lost', jsonb_build_object(
                'attempt', m.attempt,
                'detail', 'Coordinator failed before recording what came back')),
        (0, 'held', jsonb_build_object('code', %(code)s::text, 'detail', %(detail)s::text))
    ) AS e (back, kind, detail)
    WHERE m.holds AND (e.kind = 'held' OR m.dispatched)
    ORDER BY e.back DESC  -- in seq order: each event is chained to the one before it
)
SELECT state, defects FROM moved;

-- name: keep_late_answer
-- Keep an answer that came back after the claim that sent its request was lost.
--
-- An answer that came back after the claim that sent its request was lost: kept once
-- on that sending's execution, and noted in the run's history, as the product's
-- evidence (shown with the hold; reconcile uses a 2xx one).
WITH kept AS (
    UPDATE executions
    SET late_status = %(status)s, late_response = %(response)s, late_at = clock_timestamp()
    WHERE run_id = %(id)s AND step = %(step)s AND attempt = %(attempt)s AND late_at IS NULL
      AND outcome IS DISTINCT FROM 'response'
    RETURNING run_id, step, attempt, late_at
), moved AS (
    UPDATE runs r SET seq = r.seq + 1, updated_at = greatest(k.late_at, r.updated_at)
    FROM kept k
    WHERE r.id = k.run_id
    RETURNING r.id, r.seq, r.updated_at AS at, k.step, k.attempt
)
INSERT INTO run_events (run_id, seq, at, kind, step, actor, detail)
SELECT id, seq, at, 'late-answer', step, %(actor)s,
       jsonb_build_object('attempt', attempt, 'status', %(status)s::integer)
FROM moved
RETURNING seq;

-- name: late_answer
-- The latest answer that came back late with a 2xx status for a call step, for reconcile.
SELECT run_id AS id, step, attempt, late_status, late_response,
       (SELECT data_key FROM runs WHERE id = %(id)s) AS data_key
FROM executions
WHERE run_id = %(id)s AND step = %(step)s AND late_status BETWEEN 200 AND 299
ORDER BY attempt DESC LIMIT 1;

-- name: list_runs
-- One page of runs, newest first, of those a caller may see.
--
-- One page of runs, newest first, after the cursor (admitted_at, id): a caller's own
-- (all callers' when caller is NULL), of the workflows its policies cover (all when
-- readable is NULL), then as the filters ask, each NULL when not asked: the state, a held
-- run's hold code, the workflow and its version, who started the run (started_by, unlike
-- caller, is a filter and not a limit), admitted in [since, until), %(contains)s, a LIKE
-- pattern (its user's text escaped by the store) matched against the start key or the
-- input's text, %(terms)s, the search fields' terms (run_search) a run must have every one of,
-- and %(connection)s, a connection a run's step calls.
SELECT r.id, r.workflow_id, d.version, r.digest, r.caller, r.state, r.step, r.seq, r.attempt,
       r.timer_at, r.outcome, r.output, r.data_key, r.failure_code, r.hold_code, r.detail,
       r.admitted_at, r.deadline_at, r.updated_at, r.ended_at,
       late.attempt AS late_attempt, late.late_status, late.late_at,
       encode(head.hash, 'hex') AS head
FROM runs r JOIN definitions d ON d.digest = r.digest
LEFT JOIN run_events head ON head.run_id = r.id AND head.seq = r.seq  -- the chain's head
LEFT JOIN LATERAL (  -- a held call's latest answer that came back after its claim was lost
    SELECT e.attempt, e.late_status, e.late_at FROM executions e
    WHERE r.state = 'held' AND e.run_id = r.id AND e.step = r.step AND e.late_at IS NOT NULL
    ORDER BY e.attempt DESC LIMIT 1
) late ON true
WHERE (%(caller)s::text IS NULL OR r.caller = %(caller)s)
  AND (%(readable)s::text[] IS NULL OR r.workflow_id = ANY (%(readable)s::text[]))
  AND (r.admitted_at, r.id) < (%(after_at)s, %(after_id)s)
  AND (%(state)s::text IS NULL OR r.state = %(state)s)
  AND (%(hold_code)s::text IS NULL OR r.hold_code = %(hold_code)s)
  AND (%(workflow)s::text IS NULL OR r.workflow_id = %(workflow)s)
  AND (%(version)s::text IS NULL OR d.version = %(version)s)
  AND (%(started_by)s::text IS NULL OR r.caller = %(started_by)s)
  AND (%(since)s::timestamptz IS NULL OR r.admitted_at >= %(since)s)
  AND (%(until)s::timestamptz IS NULL OR r.admitted_at < %(until)s)
  AND (%(contains)s::text IS NULL
       OR r.start_key ILIKE %(contains)s
       OR (r.data_key IS NULL AND r.input::text ILIKE %(contains)s))
  AND (%(connection)s::text IS NULL  -- at a call over the connection: a pinned one's step,
       OR (r.digest, r.step) IN (   -- or where its step's sending went
           SELECT * FROM unnest(%(at_digests)s::text[], %(at_steps)s::text[]))
       OR EXISTS (SELECT FROM executions x WHERE x.run_id = r.id AND x.step = r.step
                  AND x.binding ->> 'connection' = %(connection)s))
  AND (%(terms)s::text[] IS NULL OR r.id IN (  -- every one of its search terms (distinct)
       SELECT s.run_id FROM run_search s WHERE s.term = ANY (%(terms)s::text[])
       GROUP BY s.run_id HAVING count(*) = cardinality(%(terms)s::text[])))
ORDER BY r.admitted_at DESC, r.id DESC
LIMIT %(limit)s;

-- name: active_runs_by_state
-- How many runs are in flight in each state, for the metrics.
SELECT state, count(*) AS runs FROM runs WHERE ended_at IS NULL GROUP BY state;

-- name: held_longest
-- How long the run held longest has been held, in seconds (0 when none is), for the metrics.
--
-- Since its latest hold event: a late answer or an operator's note changes a held run's
-- updated_at, not how long it has waited for someone. runs_active finds the held runs;
-- each one's hold is the first 'held' found reading its events back from the latest.
SELECT coalesce(EXTRACT(EPOCH FROM clock_timestamp() - min(h.at)), 0)::float8 AS seconds
FROM runs r
CROSS JOIN LATERAL (
    SELECT e.at FROM run_events e
    WHERE e.run_id = r.id AND e.kind = 'held'
    ORDER BY e.seq DESC
    LIMIT 1
) h
WHERE r.state = 'held' AND r.ended_at IS NULL;

-- name: console_held_runs
-- A page of the held runs a caller may see, oldest held first, each with its latest sending.
--
-- Visible as in list_runs (caller and readable NULL: no limit). Beside a held call's
-- late answer, the latest execution of the run's current step: the request it sealed
-- and what became of it, all NULL when the step never sealed one. "Held first" is by
-- the run's last change (a late answer is one). ended_at IS NULL, always true of a held
-- run, lets the planner use runs_active.
SELECT r.id, r.workflow_id, d.version, r.digest, r.caller, r.state, r.step, r.seq, r.attempt,
       r.timer_at, r.outcome, r.output, r.data_key, r.failure_code, r.hold_code, r.detail,
       r.admitted_at, r.deadline_at, r.updated_at, r.ended_at,
       late.attempt AS late_attempt, late.late_status, late.late_at,
       sent.attempt AS exec_attempt, sent.method, sent.url, sent.idempotency_key,
       sent.sealed_at, sent.dispatched_at, sent.settled_at, sent.status AS exec_status,
       sent.outcome AS exec_outcome, sent.response, encode(head.hash, 'hex') AS head
FROM runs r JOIN definitions d ON d.digest = r.digest
LEFT JOIN run_events head ON head.run_id = r.id AND head.seq = r.seq  -- the chain's head
LEFT JOIN LATERAL (  -- the call's latest answer that came back after its claim was lost
    SELECT e.attempt, e.late_status, e.late_at FROM executions e
    WHERE e.run_id = r.id AND e.step = r.step AND e.late_at IS NOT NULL
    ORDER BY e.attempt DESC LIMIT 1
) late ON true
LEFT JOIN LATERAL (  -- the step's latest sending
    SELECT e.attempt, e.method, e.url, e.idempotency_key, e.sealed_at, e.dispatched_at,
           e.settled_at, e.status, e.outcome, e.response
    FROM executions e
    WHERE e.run_id = r.id AND e.step = r.step
    ORDER BY e.attempt DESC LIMIT 1
) sent ON true
WHERE r.state = 'held' AND r.ended_at IS NULL
  AND (%(caller)s::text IS NULL OR r.caller = %(caller)s)
  AND (%(readable)s::text[] IS NULL OR r.workflow_id = ANY (%(readable)s::text[]))
  AND (r.updated_at, r.id) > (%(after_at)s, %(after_id)s)
ORDER BY r.updated_at, r.id
LIMIT %(limit)s;

-- name: console_held_groups
-- The held runs a caller may see, counted by workflow, step and hold code, most first.
--
-- Visible as in list_runs; each group's oldest and newest by the runs' last change, as
-- console_held_runs orders them.
SELECT r.workflow_id, r.step, r.hold_code, count(*) AS runs,
       min(r.updated_at) AS oldest, max(r.updated_at) AS newest
FROM runs r
WHERE r.state = 'held' AND r.ended_at IS NULL
  AND (%(caller)s::text IS NULL OR r.caller = %(caller)s)
  AND (%(readable)s::text[] IS NULL OR r.workflow_id = ANY (%(readable)s::text[]))
GROUP BY r.workflow_id, r.step, r.hold_code
ORDER BY runs DESC, oldest, r.workflow_id, r.step;

-- name: console_live_counts
-- How many runs a caller may see are in each state that has not ended (runs_active's predicate).
SELECT r.state, count(*) AS runs FROM runs r
WHERE r.ended_at IS NULL
  AND (%(caller)s::text IS NULL OR r.caller = %(caller)s)
  AND (%(readable)s::text[] IS NULL OR r.workflow_id = ANY (%(readable)s::text[]))
GROUP BY r.state;

-- name: console_held_count
-- How many held runs a caller may see (visible as in list_runs; runs_active's predicate).
SELECT count(*) AS held FROM runs r
WHERE r.state = 'held' AND r.ended_at IS NULL
  AND (%(caller)s::text IS NULL OR r.caller = %(caller)s)
  AND (%(readable)s::text[] IS NULL OR r.workflow_id = ANY (%(readable)s::text[]));

-- name: console_run_detail
-- What a run's page shows besides its status: its input, start key, steps' outputs and instants.
SELECT id, input, data_key, start_key, completed, outputs FROM runs WHERE id = %(id)s;

-- name: console_executions
-- Every sending of a run's calls, in the order they were sealed: what was sent, what came back.
SELECT run_id AS id, step, attempt, method, url, body, idempotency_key, sealed_at,
       dispatched_at, settled_at, status, outcome, response, late_status, late_at,
       (SELECT data_key FROM runs WHERE id = %(id)s) AS data_key
FROM executions WHERE run_id = %(id)s
ORDER BY sealed_at, step, attempt;

-- name: console_run_counts
-- How many runs each definition has in each state, ended runs too (a scan of all runs).
SELECT digest, state, count(*) AS runs FROM runs GROUP BY digest, state;

-- name: add_workflow_holds
-- A row for each pinned workflow's starts to be held by, not held, made before a service serves.
INSERT INTO workflow_holds (workflow_id)
SELECT unnest(%(workflow_ids)s::text[])
ON CONFLICT (workflow_id) DO NOTHING;

-- name: set_workflow_hold
-- Hold or release one workflow's starts, and record the change in admission's history.
--
-- Its reason is sealed under %(data_key)s, the shared key, with custody.
WITH changed AS (
    INSERT INTO workflow_holds (workflow_id, held, reason, actor, at, data_key)
    VALUES (%(workflow_id)s, %(held)s, %(reason)s, %(actor)s, now(), %(data_key)s)
    ON CONFLICT (workflow_id) DO UPDATE
    SET held = excluded.held, reason = excluded.reason, actor = excluded.actor,
        at = excluded.at, data_key = excluded.data_key
    RETURNING workflow_id, held, reason, actor, at, data_key
)
INSERT INTO admission_events (at, held, reason, actor, data_key, workflow_id)
SELECT at, held, reason, actor, data_key, workflow_id FROM changed;

-- name: held_workflows
-- The workflows whose starts are held: by whom, since when and why (sealed under reason_key).
SELECT workflow_id, reason, actor, at, data_key AS reason_key FROM workflow_holds
WHERE held AND (%(workflow_ids)s::text[] IS NULL OR workflow_id = ANY (%(workflow_ids)s::text[]))
ORDER BY workflow_id;

-- name: console_admission
-- Whether admission is held, why, by whom and since when.
SELECT held, reason, actor, at, data_key AS reason_key FROM admission;

-- name: console_admission_events
-- The latest holds and releases of admission, every start's or one workflow's, newest first.
SELECT at, held, reason, actor, data_key AS reason_key, workflow_id FROM admission_events
ORDER BY at DESC LIMIT %(limit)s;

-- name: console_begin_login
-- Keep a console sign-in until its browser comes back, and purge the expired ones.
WITH purged AS (
    DELETE FROM console_logins WHERE expires_at <= now()
)
INSERT INTO console_logins (login_hash, state, nonce, verifier, return_to, expires_at)
VALUES (%(login_hash)s, %(state)s, %(nonce)s, %(verifier)s, %(return_to)s,
        now() + %(lifetime)s);

-- name: console_take_login
-- Take a console sign-in once: it is deleted, and returned only if it has not expired.
WITH taken AS (
    DELETE FROM console_logins WHERE login_hash = %(login_hash)s
    RETURNING state, nonce, verifier, return_to, expires_at
)
SELECT state, nonce, verifier, return_to, expires_at FROM taken WHERE expires_at > now();

-- name: console_open_session
-- Keep a signed-in console session, and purge the expired ones.
WITH purged AS (
    DELETE FROM console_sessions WHERE expires_at <= now()
)
INSERT INTO console_sessions (session_hash, access_token, csrf, subject, expires_at)
VALUES (%(session_hash)s, %(access_token)s, %(csrf)s, %(subject)s, %(expires_at)s);

-- name: console_live_session
-- A console session by its cookie's hash, unless it has expired.
SELECT access_token, csrf, subject, expires_at, created_at FROM console_sessions
WHERE session_hash = %(session_hash)s AND expires_at > now();

-- name: console_close_session
-- End a console session (signing out).
DELETE FROM console_sessions WHERE session_hash = %(session_hash)s;

-- name: audit_runs
-- A batch of runs whose histories to verify, in id order after %(after)s, with their last seq.
SELECT id, seq FROM runs
WHERE id > %(after)s AND (%(run)s::uuid IS NULL OR id = %(run)s)
  AND (%(since)s::timestamptz IS NULL OR updated_at >= %(since)s)
ORDER BY id
LIMIT %(limit)s;

-- name: audit_events
-- The history events of some runs, in order, as the hash chain covers them.
SELECT run_id::text AS run, seq, rfc3339(at) AS at, kind, step, actor, detail::text AS detail,
       hash
FROM run_events WHERE run_id = ANY (%(runs)s::uuid[])
ORDER BY run_id, seq;

-- name: audit_last_checkpoint
-- The latest checkpoint, as its statement is rebuilt from it.
SELECT number, rfc3339(at) AS at, previous, root, leaves, key, signature
FROM audit_checkpoints ORDER BY number DESC LIMIT 1;

-- name: audit_changed_heads
-- The heads of runs whose seq is past their latest checkpointed one, in run id order.
--
-- Of the runs updated since %(since)s (by runs_by_update; NULL: every run), or of
-- %(runs)s only (NULL: any). With the instant of this snapshot, for the checkpoint.
-- A run whose signed head is its end has nothing more to sign: a history that grew past
-- it was written by someone else, and signing it would vouch for what audit verify refuses.
SELECT r.id::text AS run, r.seq, e.hash, rfc3339(now()) AS now
FROM runs r
JOIN run_events e ON e.run_id = r.id AND e.seq = r.seq
LEFT JOIN LATERAL (
    SELECT l.seq, s.kind FROM audit_leaves l
    JOIN run_events s ON s.run_id = l.run_id AND s.seq = l.seq
    WHERE l.run_id = r.id ORDER BY l.checkpoint DESC LIMIT 1
) signed ON true
WHERE (%(since)s::timestamptz IS NULL OR r.updated_at >= %(since)s)
  AND (%(runs)s::uuid[] IS NULL OR r.id = ANY (%(runs)s::uuid[]))
  AND r.seq > coalesce(signed.seq, 0)
  AND coalesce(signed.kind NOT IN ('finished', 'failed', 'expired', 'cancelled'), true)
ORDER BY r.id
LIMIT %(limit)s;

-- name: audit_insert_checkpoint
-- Record a signed checkpoint and its leaves in their order, unless its number is taken.
WITH made AS (
    INSERT INTO audit_checkpoints (number, at, previous, root, leaves, key, signature)
    VALUES (%(number)s, %(at)s::timestamptz, %(previous)s, %(root)s, %(leaves)s, %(key)s,
            %(signature)s)
    ON CONFLICT (number) DO NOTHING
    RETURNING number
), leaves AS (
    INSERT INTO audit_leaves (checkpoint, position, run_id, seq, head)
    SELECT made.number, l.position - 1, l.run, l.seq, l.head
    FROM made, unnest(%(runs)s::uuid[], %(seqs)s::integer[], %(heads)s::bytea[])
         WITH ORDINALITY AS l (run, seq, head, position)
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM made) AS made, (SELECT count(*) FROM leaves) AS leaves;

-- name: audit_run_leaves
-- The heads checkpoints signed for some runs, by run and checkpoint.
SELECT run_id::text AS run, checkpoint, seq, head
FROM audit_leaves WHERE run_id = ANY (%(runs)s::uuid[])
ORDER BY run_id, checkpoint;

-- name: audit_checkpoints_after
-- A batch of checkpoints in number order after %(after)s.
SELECT number, rfc3339(at) AS at, previous, root, leaves, key, signature
FROM audit_checkpoints WHERE number > %(after)s
ORDER BY number LIMIT %(limit)s;

-- name: audit_checkpoint
-- One checkpoint by number.
SELECT number, rfc3339(at) AS at, previous, root, leaves, key, signature
FROM audit_checkpoints WHERE number = %(number)s;

-- name: audit_checkpoint_leaves
-- One checkpoint's leaves, in the order its tree was made.
SELECT position, run_id::text AS run, seq, head FROM audit_leaves
WHERE checkpoint = %(number)s ORDER BY position;

-- name: audit_lost_runs
-- Runs a checkpoint signed that are neither in the hot tables nor archived: removed.
--
-- Of every run, or of %(run)s only.
SELECT l.run_id::text AS run, max(l.seq) AS seq, max(l.checkpoint) AS checkpoint
FROM audit_leaves l
WHERE (%(run)s::uuid IS NULL OR l.run_id = %(run)s)
  AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = l.run_id)
  AND NOT EXISTS (SELECT 1 FROM archived_runs a WHERE a.id = l.run_id)
GROUP BY l.run_id ORDER BY l.run_id;

-- name: audit_export_run
-- What a run's bundle needs besides its events: its seq and its workflow artifact.
SELECT r.id::text AS run, r.seq, d.artifact
FROM runs r JOIN definitions d ON d.digest = r.digest
WHERE r.id = %(run)s;

-- name: audit_run_record
-- What a run's decisions were made on, for an auditor's bundle: its values and deadline.
SELECT id, data_key, seq, input, outputs, output, deadline_at FROM runs WHERE id = %(run)s;

-- name: audit_run_proof
-- The latest checkpoint that signed a run's head: which leaf, of which seq.
SELECT checkpoint, position, seq FROM audit_leaves
WHERE run_id = %(run)s ORDER BY checkpoint DESC LIMIT 1;

-- name: archived_run
-- Where an archived run went.
SELECT id, digest, workflow_id, caller, start_key, state, outcome, seq,
       encode(head, 'hex') AS head, admitted_at, ended_at, archived_at, bundle, sha256
FROM archived_runs WHERE id = %(run)s;

-- name: retention_due
-- Ended runs past the retention age, oldest end first, with what their bundle is named by.
SELECT id, seq, ended_at FROM runs
WHERE ended_at IS NOT NULL AND ended_at < now() - %(after)s::interval
ORDER BY ended_at, id
LIMIT %(limit)s;

-- name: retention_lock
-- Become the one process archiving now, until this transaction ends, unless another is.
--
-- A transaction's lock, not a session's: behind a pooler in transaction mode a session's
-- lock would stay with a server session that other clients are then given. The transaction
-- sits idle while the batch is written on other connections, so it turns the database's
-- idle_in_transaction_session_timeout off for itself alone (set_config's `true`: local to
-- this transaction): a role's short timeout must not end the lock under a batch and let a
-- second archiver write the same bundle beside it.
SELECT pg_try_advisory_xact_lock(hashtext('registry-coordinator.retention')) AS locked
 WHERE set_config('idle_in_transaction_session_timeout', '0', true) IS NOT NULL;

-- name: retention_hold_starts
-- Hold new rows out of runs until this transaction ends (hold_new_runs, schema 10).
--
-- A start retried while its run leaves then finds it in archived_runs. Updates of runs
-- wait too, so the transaction is kept to one small batch.
SELECT hold_new_runs();

-- name: retention_record
-- Record runs as archived to their verified bundles, if they are still as exported.
INSERT INTO archived_runs (id, digest, workflow_id, caller, start_key, start_digest, state,
                           outcome, seq, head, admitted_at, ended_at, archived_at, bundle,
                           sha256, data_key)
SELECT r.id, r.digest, r.workflow_id, r.caller, r.start_key, r.start_digest, r.state,
       r.outcome, r.seq,
       e.hash, r.admitted_at, r.ended_at, now(), a.bundle, a.sha256, r.data_key
FROM unnest(%(runs)s::uuid[], %(seqs)s::integer[], %(bundles)s::text[], %(sha256s)s::text[])
     AS a (id, seq, bundle, sha256)
JOIN runs r ON r.id = a.id AND r.seq = a.seq AND r.ended_at IS NOT NULL
JOIN run_events e ON e.run_id = r.id AND e.seq = r.seq
ON CONFLICT (id) DO NOTHING  -- recorded by a pass that did not get to remove it
RETURNING id;

-- name: retention_remove
-- Remove archived runs from the hot tables: their history, calls, waits and the run.
--
-- With the schema owner's rights (remove_archived, schema 14), only for runs archived_runs
-- records: the runtime role has no DELETE of its own on history.
SELECT remove_archived(%(runs)s::uuid[]) AS removed;

-- name: list_archived
-- One page of archived runs, newest first, of those a caller may see (as list_runs).
SELECT id, workflow_id, digest, caller, state, outcome, admitted_at, ended_at, archived_at,
       encode(head, 'hex') AS head, bundle, sha256
FROM archived_runs
WHERE (%(caller)s::text IS NULL OR caller = %(caller)s)
  AND (%(readable)s::text[] IS NULL OR workflow_id = ANY (%(readable)s::text[]))
  AND (admitted_at, id) < (%(after_at)s, %(after_id)s)
  AND (%(state)s::text IS NULL OR state = %(state)s)
  AND (%(workflow)s::text IS NULL OR workflow_id = %(workflow)s)
ORDER BY admitted_at DESC, id DESC
LIMIT %(limit)s;

-- name: audit_archived
-- A batch of archived runs in id order after %(after)s, with the latest head signed for each.
--
-- Of every archived run, or of %(run)s only.
SELECT a.id::text AS run, a.seq, a.head, a.bundle, a.sha256,
       l.seq AS signed_seq, l.head AS signed_head, l.checkpoint
FROM archived_runs a
LEFT JOIN LATERAL (
    SELECT seq, head, checkpoint FROM audit_leaves
    WHERE run_id = a.id ORDER BY checkpoint DESC LIMIT 1
) l ON true
WHERE a.id > %(after)s AND (%(run)s::uuid IS NULL OR a.id = %(run)s)
ORDER BY a.id
LIMIT %(limit)s;

-- name: data_keys_by_version
-- How many data keys each KEK version wraps, with one of them (the lowest id) to unwrap.
SELECT DISTINCT ON (kek) id, kek, wrapped, count(*) OVER (PARTITION BY kek) AS count
FROM data_keys WHERE kek IS NOT NULL ORDER BY kek, id;

-- name: shared_data_key
-- The installation's shared data key, wrapped.
SELECT id, kek, wrapped FROM data_keys WHERE subject IS NULL;

-- name: data_keys_by_id
-- The data keys of these ids, wrapped (kek and wrapped NULL: erased).
SELECT id, kek, wrapped FROM data_keys WHERE id = ANY (%(ids)s::bigint[]);

-- name: data_keys_erased
-- Which of these data keys were erased.
SELECT id FROM data_keys WHERE id = ANY (%(ids)s::bigint[]) AND erased_at IS NOT NULL;

-- name: data_keys_counted
-- How many data keys are under KEK %(kek)s, erased, and under another version.
SELECT count(*) FILTER (WHERE kek = %(kek)s) AS already,
       count(*) FILTER (WHERE kek IS NULL) AS erased,
       count(*) FILTER (WHERE kek <> %(kek)s) AS due
FROM data_keys;

-- name: data_keys_to_rewrap
-- A page of data keys, in id order after %(after)s, wrapped under another version than %(kek)s.
SELECT id, kek, wrapped FROM data_keys
WHERE id > %(after)s AND kek <> %(kek)s ORDER BY id LIMIT 200;

-- name: subject_data_key
-- The live data key of a subject (by its keyed hash), wrapped.
SELECT id, kek, wrapped FROM data_keys WHERE subject = %(subject)s AND erased_at IS NULL;

-- name: make_subject_data_key
-- A subject's data key, unless another start made its live one first.
INSERT INTO data_keys (id, subject, kek, wrapped)
VALUES (%(id)s, %(subject)s, %(kek)s, %(wrapped)s)
ON CONFLICT (subject) WHERE erased_at IS NULL DO NOTHING;

-- name: lock_subject_data_key
-- A subject's live data key, locked against the starts that would seal under it.
--
-- FOR UPDATE conflicts with the key share each start takes on it (admit_run's keyed CTE),
-- so a start waits for the erasure, then finds the key erased and makes a new one.
SELECT id FROM data_keys WHERE subject = %(subject)s AND erased_at IS NULL FOR UPDATE;

-- name: live_runs_of_data_key
-- A few of the runs sealed under a data key that have not ended.
SELECT id FROM runs WHERE data_key = %(key)s AND ended_at IS NULL ORDER BY admitted_at LIMIT 5;

-- name: erase_data_key
-- A subject's data key destroyed, keeping who, when and why; every process is told.
--
-- Every value sealed under it, in the database and in bundles, is unreadable for good,
-- the payloads of the deliveries its runs waited for are forgotten (schema 18), and its
-- runs' search terms (schema 24).
WITH erased AS (
    UPDATE data_keys
    SET kek = NULL, wrapped = NULL, erased_at = now(), erased_by = %(actor)s,
        erase_reason = %(reason)s
    WHERE id = %(key)s AND erased_at IS NULL
    RETURNING id, erased_at
), unfound AS (  -- its runs are found by no search field
    DELETE FROM run_search s USING runs r, erased e
    WHERE s.run_id = r.id AND r.data_key = e.id
)
SELECT e.id, e.erased_at, pg_notify('coordinator_wake', 'erased:' || e.id) AS notified,
       forget_deliveries(e.id) AS deliveries,  -- the webhook payloads its runs waited for
       (SELECT count(*) FROM runs WHERE data_key = e.id)
       + (SELECT count(*) FROM archived_runs WHERE data_key = e.id) AS runs
FROM erased e;

-- name: subject_erasures
-- A subject's erased data keys, newest first: when, by whom and why (sealed).
SELECT id, erased_at, erased_by, erase_reason FROM data_keys
WHERE subject = %(subject)s AND erased_at IS NOT NULL ORDER BY erased_at DESC;

-- name: erased_events
-- Each erased data key: who erased it, when and why, and how many runs and events it sealed.
--
-- Events are counted in the histories still in the database; runs archived too.
SELECT k.id, k.erased_at, k.erased_by, k.erase_reason,
       (SELECT count(*) FROM runs r JOIN run_events e ON e.run_id = r.id
        WHERE r.data_key = k.id) AS events,
       (SELECT count(*) FROM runs WHERE data_key = k.id)
       + (SELECT count(*) FROM archived_runs WHERE data_key = k.id) AS runs
FROM data_keys k WHERE k.erased_at IS NOT NULL ORDER BY k.erased_at, k.id;

-- name: make_shared_data_key
-- The installation's shared data key, unless another process made it first.
INSERT INTO data_keys (id, kek, wrapped) VALUES (%(id)s, %(kek)s, %(wrapped)s)
ON CONFLICT DO NOTHING;

-- name: rewrap_data_key
-- A data key wrapped again under the active KEK, if still under the version it was read under.
UPDATE data_keys SET kek = %(kek)s, wrapped = %(wrapped)s WHERE id = %(id)s AND kek = %(was)s;

-- name: timeline
-- The database's installation and how far its timeline has come.
SELECT installation, epoch FROM timeline;

-- name: advance_timeline
-- Move the timeline on, before requests sealed until now are sent (engine/high_water.py).
UPDATE timeline SET epoch = epoch + 1 RETURNING installation, epoch;

-- name: lock_timeline
-- The timeline, locked until the transaction ends: one process at a time judges a mark.
SELECT installation, epoch FROM timeline FOR UPDATE;

-- name: open_restore
-- The recovery still open, if the database was recognised as restored and not reviewed.
SELECT number, detected_at, database_epoch, mark_epoch, newest_change, held,
       (SELECT count(*) FROM runs WHERE state = 'held' AND hold_code = 'restored-review')
           AS still_held
FROM restores WHERE ended_at IS NULL ORDER BY number DESC LIMIT 1;

-- name: hold_restored
-- Hold every run a restored database may have forgotten the progress of, for review.
--
-- A database restored from a backup has each run where the backup found it, and may have
-- lost what the run did since: requests sent, answers recorded, steps taken. Every
-- unfinished run is held (restored-review) but one asleep at a wait-until whose instant
-- is still to come, which nothing can have moved. A run that had a call in flight has
-- that sending settled as lost first (its history says so), so that an operator's
-- retry-same resends it rather than finding it interrupted; a run already held keeps its
-- earlier code in the hold's event. Claims are dropped: no process holds them any more.
WITH judged AS (
    SELECT id, dispatched_at IS NOT NULL AS dispatched,
           CASE WHEN state = 'held' THEN hold_code END AS was_held
    FROM runs
    WHERE state IN ('running', 'waiting', 'held')
      AND NOT (state = 'waiting' AND wakes_to IS NOT NULL AND timer_at > clock_timestamp())
    FOR UPDATE
), moved AS (
    UPDATE runs r
    SET state = 'held', hold_code = 'restored-review', detail = %(detail)s, due_at = NULL,
        lease_owner = NULL, lease_token = NULL, dispatched_at = NULL, defects = 0,
        checks = 0, seq = r.seq + 1 + j.dispatched::integer,
        updated_at = greatest(clock_timestamp(), r.updated_at)
    FROM judged j
    WHERE r.id = j.id
    RETURNING r.id, r.seq, r.step, r.attempt, r.updated_at AS at, j.dispatched, j.was_held
), settled AS (
    UPDATE executions e SET settled_at = m.at, outcome = 'lost'
    FROM moved m
    WHERE m.dispatched AND e.run_id = m.id AND e.step = m.step AND e.settled_at IS NULL
), evented AS (
    INSERT INTO run_events (run_id, seq, at, kind, step, actor, detail)
    SELECT m.id, m.seq - e.back, m.at, e.kind, m.step, %(actor)s, e.detail
    FROM moved m, LATERAL (VALUES
        (1, 'call-lost', jsonb_build_object(
                'attempt', m.attempt,
                'detail', 'the database was restored from a backup taken while it was in flight')),
        (0, 'held', jsonb_build_object('code', 'restored-review', 'detail', %(detail)s::text)
                    || CASE WHEN m.was_held IS NULL THEN '{}'::jsonb
                            ELSE jsonb_build_object('wasHeld', m.was_held) END)
    ) AS e (back, kind, detail)
    WHERE e.kind = 'held' OR m.dispatched
    ORDER BY m.id, e.back DESC  -- in seq order: each event is chained to the one before it
)
SELECT count(*) AS held FROM moved;

-- name: record_restore
-- Record a restored database as recognised, and bring its timeline up to the mark.
--
-- In the transaction that held its runs (hold_restored), under lock_timeline: the next
-- advance goes past the mark, so the mark and the database agree again, and the recovery
-- stays open until an operator ends it (end_restore).
WITH restore AS (
    INSERT INTO restores (detected_at, database_epoch, mark_epoch, newest_change, held)
    SELECT clock_timestamp(), epoch, %(mark)s, %(newest)s, %(held)s FROM timeline
    RETURNING number, detected_at, database_epoch, mark_epoch, newest_change, held
)
UPDATE timeline SET epoch = %(mark)s
FROM restore
RETURNING restore.number, restore.detected_at, restore.database_epoch, restore.mark_epoch,
          restore.newest_change, restore.held, restore.held AS still_held;

-- name: newest_change
-- When the database's newest transition was committed: about when its backup was taken.
SELECT max(updated_at) AS at FROM runs;

-- name: end_restore
-- An operator ends the open recovery, with who and why: the service may go on.
UPDATE restores SET ended_at = clock_timestamp(), ended_by = %(actor)s, reason = %(reason)s
WHERE ended_at IS NULL
RETURNING number;

-- name: current_role
-- The role this session runs as.
SELECT current_user AS role;

-- name: role_standing
-- Whether this session's role owns the schema (or is a superuser), and may create in it.
SELECT current_user AS role,
       pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = 'runs'::regclass),
                   'USAGE')
           OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) AS owner,
       has_schema_privilege(current_user, 'public', 'CREATE') AS creates;

-- name: table_privilege
-- Whether this session's role holds a privilege on one of the schema's tables.
SELECT has_table_privilege(current_user, %(table)s, %(privilege)s) AS granted;

-- name: changed_bindings
-- Unfinished runs whose current step's latest sending went over a binding unlike today's.
--
-- %(current)s maps each configured connection's name to its binding now
-- (ConnectionConfig.binding); a sending before schema 15 has none and is not judged. The
-- oldest %(limit)s, with the binding each was sealed under (its address is the run's data).
SELECT r.id, r.state, r.step, e.binding
FROM runs r
JOIN LATERAL (
    SELECT binding FROM executions x
    WHERE x.run_id = r.id AND x.step = r.step
    ORDER BY attempt DESC LIMIT 1
) e ON true
WHERE r.state IN ('running', 'waiting', 'held') AND e.binding IS NOT NULL
  AND e.binding IS DISTINCT FROM (%(current)s::jsonb -> (e.binding ->> 'connection'))
ORDER BY r.updated_at
LIMIT %(limit)s;

-- name: subject_keys
-- Every data key a subject's runs were sealed under, live or erased, oldest first.
SELECT id, made_at, erased_at, erased_by FROM data_keys
WHERE subject = %(subject)s ORDER BY made_at, id;

-- name: subject_runs
-- The runs in the database sealed under these data keys, oldest first, their data opened.
SELECT id, workflow_id, digest, state, step, outcome, failure_code, hold_code, detail,
       admitted_at, ended_at, input, output, data_key
FROM runs WHERE data_key = ANY (%(keys)s::bigint[]) ORDER BY admitted_at, id;

-- name: subject_archived_runs
-- The archived runs sealed under these data keys, oldest first, with their bundles.
SELECT id, workflow_id, digest, state, outcome, admitted_at, ended_at, archived_at, bundle,
       sha256, data_key
FROM archived_runs WHERE data_key = ANY (%(keys)s::bigint[]) ORDER BY admitted_at, id;

-- name: subject_sendings
-- Every request the runs sealed under these data keys sent, what came back, in order.
SELECT e.run_id AS id, e.step, e.attempt, e.method, e.url, e.idempotency_key, e.sealed_at,
       e.dispatched_at, e.settled_at, e.status, e.outcome, e.response, e.late_status,
       e.late_response, e.late_at, r.data_key
FROM executions e JOIN runs r ON r.id = e.run_id
WHERE r.data_key = ANY (%(keys)s::bigint[])
ORDER BY r.admitted_at, e.run_id, e.sealed_at, e.attempt;

-- name: clear_ended_runs
-- A page of ended runs written before custody (values in clear), in id order.
SELECT id FROM runs
WHERE data_key IS NULL AND ended_at IS NOT NULL AND id > %(after)s
ORDER BY id LIMIT 100;

-- name: clear_runs_counted
-- How many runs written before custody have ended (to seal) and have not (sealed later).
SELECT count(*) FILTER (WHERE ended_at IS NOT NULL) AS ended,
       count(*) FILTER (WHERE ended_at IS NULL) AS live
FROM runs WHERE data_key IS NULL;

-- name: lock_clear_run
-- An ended run written before custody, locked to be sealed, with its values.
SELECT id, data_key, input, outputs, output FROM runs
WHERE id = %(id)s AND data_key IS NULL AND ended_at IS NOT NULL FOR UPDATE;

-- name: clear_sendings
-- The sendings of a run written before custody, as they were written (in clear).
SELECT run_id AS id, NULL::bigint AS data_key, step, attempt, url, headers, body, response,
       late_response
FROM executions WHERE run_id = %(id)s;

-- name: seal_clear_run
-- A run written before custody: its values sealed under the shared key from now on.
--
-- Its events stay as written: sealed_from is past its last one.
UPDATE runs
SET input = %(input)s, outputs = %(outputs)s, output = %(output)s, data_key = %(data_key)s,
    sealed_from = seq + 1
WHERE id = %(id)s AND data_key IS NULL;

-- name: seal_clear_sending
-- One sending of a run written before custody, sealed where seal_clear_run seals the run.
UPDATE executions
SET url = %(url)s, headers = %(headers)s, body = %(body)s, response = %(response)s,
    late_response = %(late_response)s
WHERE run_id = %(id)s AND step = %(step)s AND attempt = %(attempt)s;

-- name: pause_connection
-- Pause a connection (again, with a new reason, if it is), and record the change.
--
-- Its reason is sealed under %(data_key)s, the shared key, with custody. Every process
-- is told on the wake channel, and reads the pauses again.
WITH changed AS (
    INSERT INTO connection_pauses (connection, paused_at, actor, reason, data_key)
    VALUES (%(connection)s, now(), %(actor)s, %(reason)s, %(data_key)s)
    ON CONFLICT (connection) DO UPDATE
    SET paused_at = excluded.paused_at, actor = excluded.actor, reason = excluded.reason,
        data_key = excluded.data_key
    RETURNING connection, paused_at, actor, reason, data_key
), logged AS (
    INSERT INTO connection_pause_events (connection, at, paused, actor, reason, data_key)
    SELECT connection, paused_at, true, actor, reason, data_key FROM changed
)
SELECT paused_at, pg_notify('coordinator_wake', 'connections') AS notified FROM changed;

-- name: unpause_connection
-- Lift a connection's pause, recording the change; the pause as it stood, if there was one.
--
-- Taken before resume_parked_runs, in its transaction: the delete waits for any run being
-- parked under the pause (park_run shares its row), so that run is parked when the next
-- statement looks.
WITH gone AS (
    DELETE FROM connection_pauses WHERE connection = %(connection)s
    RETURNING connection, paused_at, actor
), logged AS (
    INSERT INTO connection_pause_events (connection, at, paused, actor, reason, data_key)
    SELECT connection, now(), false, %(actor)s, %(reason)s, %(data_key)s FROM gone
)
SELECT paused_at, actor, pg_notify('coordinator_wake', 'connections') AS notified FROM gone;

-- name: resume_parked_runs
-- Make every run parked for a connection's pause due at once.
UPDATE runs SET paused_for = NULL, due_at = now()
WHERE paused_for = %(connection)s AND ended_at IS NULL;

-- name: connection_pauses
-- The connections paused now, with who paused each, when and why (sealed under reason_key).
SELECT connection, paused_at, actor, reason, data_key AS reason_key FROM connection_pauses
ORDER BY connection;

-- name: park_run
-- Give a claimed run back parked for its connection's pause, if the pause still stands.
--
-- Due at its deadline, so that it still expires; the pause's row is shared, so a resume
-- waits for this and then finds the run parked (unpause_connection).
WITH paused AS MATERIALIZED (
    SELECT connection FROM connection_pauses WHERE connection = %(connection)s FOR SHARE
)
UPDATE runs SET paused_for = %(connection)s, due_at = deadline_at,
                lease_owner = NULL, lease_token = NULL
WHERE id = %(id)s AND lease_token = %(token)s AND dispatched_at IS NULL
  AND EXISTS (SELECT FROM paused)
RETURNING id;

-- name: create_bulk_job
-- A bulk job previewed: its action, sealed filter and rate, waiting to be started.
WITH made AS (
    INSERT INTO bulk_jobs (id, action, filter, state, per_second, created_at, created_by,
                           filter_key, updated_at)
    VALUES (%(id)s, %(action)s, %(filter)s, 'previewed', %(per_second)s, now(), %(actor)s,
            %(data_key)s, now())
    RETURNING id, created_at
), logged AS (
    INSERT INTO bulk_job_events (job_id, at, kind, actor)
    SELECT id, created_at, 'previewed', %(actor)s FROM made
)
SELECT id FROM made;

-- name: add_bulk_job_runs
-- The runs a previewed job found, in the order it takes them, each with its seq then.
INSERT INTO bulk_job_runs (job_id, position, run_id, seq)
SELECT %(job)s, p.position, p.run_id, p.seq
FROM unnest(%(positions)s::integer[], %(runs)s::uuid[], %(seqs)s::integer[])
     AS p (position, run_id, seq);

-- name: bulk_jobs
-- Bulk jobs (the one of %(id)s, or the latest), each with its runs counted by how they settled.
SELECT j.id, j.action, j.filter, j.filter_key, j.state, j.per_second, j.created_at,
       j.created_by, j.started_by, j.reason, j.reason_key, j.updated_at,
       c.total, c.pending, c.acted, c.unconfirmed, c.changed, c.refused
FROM bulk_jobs j
CROSS JOIN LATERAL (
    SELECT count(*) AS total,
           count(*) FILTER (WHERE outcome IS NULL) AS pending,
           count(*) FILTER (WHERE outcome = 'acted') AS acted,
           count(*) FILTER (WHERE outcome = 'unconfirmed') AS unconfirmed,
           count(*) FILTER (WHERE outcome = 'changed') AS changed,
           count(*) FILTER (WHERE outcome = 'refused') AS refused
    FROM bulk_job_runs WHERE job_id = j.id
) c
WHERE %(id)s::uuid IS NULL OR j.id = %(id)s
ORDER BY j.created_at DESC, j.id DESC
LIMIT %(limit)s;

-- name: bulk_job_settled
-- A job's runs settled other than acted, or all of them, in the order it took them.
SELECT run_id, seq, outcome, code, settled_at FROM bulk_job_runs
WHERE job_id = %(job)s AND outcome IS NOT NULL AND (%(all)s OR outcome <> 'acted')
ORDER BY position LIMIT %(limit)s;

-- name: change_bulk_job
-- A job moved to a state from one of those it may leave, the change recorded with its reason.
--
-- Started: who started it, and the reason each run's history is given. A job moved out
-- of running loses its lease, so the process taking it stops before its next run.
WITH changed AS (
    UPDATE bulk_jobs
    SET state = %(state)s, updated_at = now(),
        started_by = CASE WHEN %(state)s = 'running' AND started_by IS NULL
                          THEN %(actor)s ELSE started_by END,
        reason = CASE WHEN %(state)s = 'running' AND reason IS NULL
                      THEN %(reason)s ELSE reason END,
        reason_key = CASE WHEN %(state)s = 'running' AND reason IS NULL
                          THEN %(data_key)s ELSE reason_key END,
        lease_until = CASE WHEN %(state)s = 'running' THEN lease_until END,
        leased_by = CASE WHEN %(state)s = 'running' THEN leased_by END
    WHERE id = %(id)s AND state = ANY (%(from)s::text[])
    RETURNING id, updated_at
), logged AS (
    INSERT INTO bulk_job_events (job_id, at, kind, actor, reason, data_key)
    SELECT id, updated_at, %(kind)s, %(actor)s, %(reason)s, %(data_key)s FROM changed
)
SELECT id, pg_notify('coordinator_wake', 'bulk') AS notified FROM changed;

-- name: claim_bulk_job
-- A running job no process holds (its lease ran out, or it was this holder's), leased here.
--
-- A holder's name is one live process's (store.Holder): a job leased to it was left by
-- the process before this one, killed, and is taken again at once.
UPDATE bulk_jobs SET lease_until = now() + %(lease)s, leased_by = %(owner)s
WHERE id = (
    SELECT id FROM bulk_jobs
    WHERE state = 'running'
      AND (lease_until IS NULL OR lease_until < now() OR leased_by = %(owner)s)
    ORDER BY created_at LIMIT 1
    FOR UPDATE SKIP LOCKED
)
RETURNING id;

-- name: renew_bulk_job
-- This process's lease on a running job renewed; nothing if the job left running or was taken.
UPDATE bulk_jobs SET lease_until = now() + %(lease)s
WHERE id = %(id)s AND state = 'running' AND leased_by = %(owner)s AND lease_until >= now()
RETURNING id;

-- name: pending_bulk_runs
-- The next runs a job has not settled, in its order.
SELECT run_id, seq FROM bulk_job_runs
WHERE job_id = %(job)s AND outcome IS NULL ORDER BY position LIMIT %(limit)s;

-- name: settle_bulk_run
-- A job's run settled (acted, unconfirmed, changed or refused, with the refusal's code), once.
UPDATE bulk_job_runs SET outcome = %(outcome)s, code = %(code)s, settled_at = now()
WHERE job_id = %(job)s AND run_id = %(run)s AND outcome IS NULL
RETURNING run_id;

-- name: finish_bulk_job
-- A running job whose every run is settled is done, recorded as the service's change.
WITH done AS (
    UPDATE bulk_jobs SET state = 'done', updated_at = now(), lease_until = NULL,
                         leased_by = NULL
    WHERE id = %(id)s AND state = 'running'
      AND NOT EXISTS (SELECT FROM bulk_job_runs WHERE job_id = %(id)s AND outcome IS NULL)
    RETURNING id, updated_at
), logged AS (
    INSERT INTO bulk_job_events (job_id, at, kind, actor)
    SELECT id, updated_at, 'done', %(actor)s FROM done
)
SELECT id FROM done;

-- name: bulk_job_events
-- A job's changes, oldest first: what, when, by whom and why (sealed under reason_key).
SELECT kind, at, actor, reason, data_key AS reason_key FROM bulk_job_events
WHERE job_id = %(job)s ORDER BY at;

-- name: request_approval
-- An action kept pending a second operator's approval, unless one is pending for the run.
INSERT INTO approvals (id, run_id, seq, action, said, said_key, requested_by, requested_at,
                       state)
VALUES (%(id)s, %(run)s, %(seq)s, %(action)s, %(said)s, %(said_key)s, %(actor)s, now(),
        'pending')
ON CONFLICT DO NOTHING
RETURNING id;

-- name: approval_by_id
-- One approval asked for: the action, who asked, when and why, and how it was decided.
SELECT id, run_id, seq, action, said, said_key, requested_by, requested_at, state,
       decided_by, decided_at, decision, decision_key
FROM approvals WHERE id = %(id)s;

-- name: pending_approvals
-- The approvals still to decide, the oldest asked first.
SELECT id, run_id, seq, action, said, said_key, requested_by, requested_at, state,
       decided_by, decided_at, decision, decision_key
FROM approvals WHERE state = 'pending' ORDER BY requested_at, id LIMIT %(limit)s;

-- name: decide_approval
-- A pending approval decided (approved, rejected, or stale: the run changed), with who and why.
UPDATE approvals
SET state = %(state)s, decided_by = %(actor)s, decided_at = now(), decision = %(decision)s,
    decision_key = %(decision_key)s
WHERE id = %(id)s AND state = 'pending'
RETURNING id;

-- name: pending_approval_of_run
-- The action on a run that waits for a second operator's approval, if one does.
SELECT id, run_id, seq, action, said, said_key, requested_by, requested_at, state,
       decided_by, decided_at, decision, decision_key
FROM approvals WHERE run_id = %(run)s AND state = 'pending';
