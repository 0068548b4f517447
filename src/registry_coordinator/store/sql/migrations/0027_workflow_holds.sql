-- Registry Coordinator schema, version 27: new starts held for one workflow.
--
-- As admission holds every start, an operator may hold the starts of one workflow (its
-- product's maintenance, a fault found in it): ``workflow_holds`` has a row for every
-- workflow a service pinned, made before it serves, which the statement admitting a run
-- of that workflow shares and a hold updates, so a hold and a start serialize as they do
-- for admission. Runs admitted go on. Each change is kept in ``admission_events`` with the
-- workflow it holds (NULL: every start), its reason sealed as admission's is.
CREATE TABLE workflow_holds (
    workflow_id text PRIMARY KEY,
    held        boolean NOT NULL DEFAULT false,
    reason      text,
    actor       text,
    at          timestamptz,
    data_key    bigint REFERENCES data_keys (id)
);
ALTER TABLE admission_events ADD COLUMN workflow_id text;
