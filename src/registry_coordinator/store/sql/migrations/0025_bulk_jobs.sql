-- Registry Coordinator schema, version 25: bulk actions on runs chosen by a filter.
--
-- An operator previews a job: the runs its filter finds are kept in ``bulk_job_runs``,
-- each with the ``seq`` it had then, and the job waits to be started. Started, one
-- process at a time (a lease) takes its runs in order at the job's rate; each action is
-- taken under the run's lock only if the run's seq is still the one previewed, and the
-- run's row here is settled in the same transaction as the action's write, so a kill
-- anywhere neither repeats an action nor skips a run. A run whose seq moved is settled
-- ``changed`` and left alone. Who previewed, started, paused, resumed or cancelled it,
-- when and why is kept in ``bulk_job_events``, append-only; reasons and the filter are
-- sealed under the shared key, as a pause's reason is.
CREATE TABLE bulk_jobs (
    id          uuid PRIMARY KEY,
    action      text NOT NULL,
    filter      jsonb NOT NULL,
    filter_key  bigint REFERENCES data_keys (id),
    state       text NOT NULL,
    per_second  integer NOT NULL,
    created_at  timestamptz NOT NULL,
    created_by  text NOT NULL,
    started_by  text,
    reason      jsonb,
    reason_key  bigint REFERENCES data_keys (id),
    updated_at  timestamptz NOT NULL,
    lease_until timestamptz,
    leased_by   text
);
CREATE INDEX bulk_jobs_running ON bulk_jobs (created_at) WHERE state = 'running';
CREATE TABLE bulk_job_runs (
    job_id     uuid NOT NULL REFERENCES bulk_jobs (id),
    position   integer NOT NULL,
    run_id     uuid NOT NULL,  -- no reference: the run may be archived after the job
    seq        integer NOT NULL,
    outcome    text,
    code       text,
    settled_at timestamptz,
    PRIMARY KEY (job_id, position),
    UNIQUE (job_id, run_id)
);
CREATE INDEX bulk_job_runs_pending ON bulk_job_runs (job_id, position) WHERE outcome IS NULL;
CREATE TABLE bulk_job_events (
    job_id   uuid NOT NULL REFERENCES bulk_jobs (id),
    at       timestamptz NOT NULL,
    kind     text NOT NULL,
    actor    text NOT NULL,
    reason   jsonb,
    data_key bigint REFERENCES data_keys (id)
);
CREATE INDEX bulk_job_events_by_job ON bulk_job_events (job_id, at);
CREATE TRIGGER bulk_job_events_append_only
    BEFORE UPDATE OR DELETE ON bulk_job_events
    FOR EACH ROW EXECUTE FUNCTION refuse_change();
