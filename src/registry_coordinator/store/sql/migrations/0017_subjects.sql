-- Registry Coordinator schema, version 17: data subjects' keys, and their erasure
-- (docs/custody.md, "Data subjects and erasure").
--
-- A subject has at most one live key; an erased key keeps its subject's keyed hash, so
-- that what became of a subject can still be said (when, by whom, why), and a new start
-- for that subject gets a new key. The shared key (subject NULL) is never erased.
ALTER TABLE data_keys DROP CONSTRAINT data_keys_subject_key;
CREATE UNIQUE INDEX data_keys_by_subject ON data_keys (subject) WHERE erased_at IS NULL;
ALTER TABLE data_keys
    ADD COLUMN erased_by    text,
    ADD COLUMN erase_reason jsonb,  -- sealed under the shared key: a reason may name someone
    ADD CONSTRAINT data_keys_erased_by CHECK ((erased_at IS NULL) = (erased_by IS NULL)),
    ADD CONSTRAINT data_keys_erase_reason CHECK ((erased_at IS NULL) = (erase_reason IS NULL)),
    ADD CONSTRAINT data_keys_shared_kept CHECK (subject IS NOT NULL OR erased_at IS NULL);

-- The runs sealed under a key, found when it is erased (none may be live) and for its
-- subject's report. Most rows name the shared key: deduplicated, the index stays small.
CREATE INDEX runs_by_data_key ON runs (data_key);

-- An archived run keeps the key its bundle's sealed values are under.
ALTER TABLE archived_runs ADD COLUMN data_key bigint REFERENCES data_keys (id);
CREATE INDEX archived_runs_by_data_key ON archived_runs (data_key) WHERE data_key IS NOT NULL;
