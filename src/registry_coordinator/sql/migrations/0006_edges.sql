-- Registry Coordinator schema, version 6: defects counted per run, and answers that
-- arrive after their claim was lost.

-- Unexpected errors of Coordinator's own at the run's current step, one after another
-- (a definition this build cannot load, an exception, a statement the database
-- refused): after a few the run is held (definition-unusable, engine-defect) instead
-- of being tried again forever. Every transition sets it back to 0.
ALTER TABLE runs ADD COLUMN defects integer NOT NULL DEFAULT 0;

-- An answer to a sending that came back after the claim that sent it was lost (its
-- lease ran out during a database outage and another holder took the run over, which
-- held it as interrupted): kept as the product's evidence, shown with the hold and
-- used by reconcile. The execution's own status and response stay what its settling
-- holder recorded.
ALTER TABLE executions ADD COLUMN late_status integer;
ALTER TABLE executions ADD COLUMN late_response bytea;
ALTER TABLE executions ADD COLUMN late_at timestamptz;
