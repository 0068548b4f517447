-- Registry Coordinator schema, version 10: signed checkpoints over run heads, and the
-- archive of ended runs.
--
-- A checkpoint is the root of a Merkle tree over the heads (run, seq, hash) of the runs
-- that changed since the checkpoint before it, in a statement signed with Ed25519
-- (semantics/checkpoints.py computes and checks both). Its leaves stay after their run
-- is archived: they are what the signed root is recomputed from.

CREATE TABLE audit_checkpoints (
    number     bigint PRIMARY KEY CHECK (number > 0),
    at         timestamptz NOT NULL,
    previous   text CHECK (previous ~ '^[0-9a-f]{64}$'),  -- checkpoint number - 1's digest
    root       bytea NOT NULL,
    leaves     integer NOT NULL CHECK (leaves > 0),
    key        text NOT NULL,                             -- the signer's public key, hex
    signature  bytea NOT NULL,
    CHECK ((number = 1) = (previous IS NULL))
);

CREATE TABLE audit_leaves (
    checkpoint  bigint NOT NULL REFERENCES audit_checkpoints (number),
    position    integer NOT NULL,
    run_id      uuid NOT NULL,     -- no reference: an archived run's leaves stay
    seq         integer NOT NULL,
    head        bytea NOT NULL,
    PRIMARY KEY (checkpoint, position)
);
-- A run's latest checkpointed seq, and the leaves an export proves a run by.
CREATE INDEX audit_leaves_by_run ON audit_leaves (run_id, checkpoint DESC);

CREATE TRIGGER audit_checkpoints_append_only BEFORE UPDATE OR DELETE ON audit_checkpoints
    FOR EACH ROW EXECUTE FUNCTION refuse_change();
CREATE TRIGGER audit_leaves_append_only BEFORE UPDATE OR DELETE ON audit_leaves
    FOR EACH ROW EXECUTE FUNCTION refuse_change();

-- Ended runs moved out of the hot tables, and the bundle each went to (its path under
-- the archive directory, and the SHA-256 of its bytes as verified before the move).
CREATE TABLE archived_runs (
    id           uuid PRIMARY KEY,
    digest       text NOT NULL,
    workflow_id  text NOT NULL,
    caller       text NOT NULL,
    start_key    text NOT NULL,
    start_digest text NOT NULL,   -- the start its key stands for: a retried start finds it
    state        text NOT NULL,
    outcome      text,
    seq          integer NOT NULL,
    head         bytea NOT NULL,
    admitted_at  timestamptz NOT NULL,
    ended_at     timestamptz NOT NULL,
    archived_at  timestamptz NOT NULL,
    bundle       text NOT NULL,
    sha256       text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    UNIQUE (caller, start_key)
);
-- The archived listing, newest first, as the runs listing's runs_by_admission.
CREATE INDEX archived_runs_by_admission ON archived_runs (admitted_at DESC, id DESC);
CREATE TRIGGER archived_runs_append_only BEFORE UPDATE OR DELETE ON archived_runs
    FOR EACH ROW EXECUTE FUNCTION refuse_change();

-- Runs by their last change: the checkpointer looks only at runs changed since its last
-- look, so waiting runs cost it nothing.
CREATE INDEX runs_by_update ON runs (updated_at);

-- Ended runs oldest first, for retention; ended_at is written once, so this costs no
-- transition anything.
CREATE INDEX runs_ended ON runs (ended_at) WHERE ended_at IS NOT NULL;

-- Hold new rows out of runs until the calling transaction ends (writes of existing rows
-- wait too). SHARE mode conflicts with the ROW EXCLUSIVE lock an INSERT takes before its
-- snapshot, so a start retried while its run is archived takes its snapshot after the run
-- is in archived_runs. A function, so that the statement that calls it can be prepared.
CREATE FUNCTION hold_new_runs() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    LOCK TABLE runs IN SHARE MODE;
END;
$$;

-- A history stays append-only, with one way out: its run was archived, in the same
-- transaction, to a bundle that was verified first.
CREATE FUNCTION history_leaves() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND EXISTS (SELECT 1 FROM archived_runs WHERE id = OLD.run_id) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '% is append-only: % is not allowed', TG_TABLE_NAME, TG_OP;
END;
$$;
DROP TRIGGER run_events_append_only ON run_events;
CREATE TRIGGER run_events_append_only BEFORE UPDATE OR DELETE ON run_events
    FOR EACH ROW EXECUTE FUNCTION history_leaves();
