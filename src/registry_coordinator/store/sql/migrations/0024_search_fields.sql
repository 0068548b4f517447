-- Registry Coordinator schema, version 24: runs found by their business fields.
--
-- A workflow may declare ``search: {NAME: EXPR, ...}`` over the input; each field a run's
-- input gives is kept as one term, a digest of its name and value (keyed HMAC-SHA-256
-- under custody, as the start digest, so a dump cannot confirm a guessed id), written by
-- the statement that admits the run and never changed. A listing matches terms exactly
-- through the primary key. A table of its own, not a column of ``runs``: a transition
-- updates no index of it. A run's terms leave with it (``remove_archived``) and with its
-- subject's key (``erase_data_key``): an erased run is found by no field.
CREATE TABLE run_search (
    term   text NOT NULL,
    run_id uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    PRIMARY KEY (term, run_id)
);
CREATE INDEX run_search_by_run ON run_search (run_id);
