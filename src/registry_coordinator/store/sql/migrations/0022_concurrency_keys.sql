-- Registry Coordinator schema, version 22: at most one live run per concurrency key.
--
-- A workflow may declare ``concurrency: {key: EXPR}`` over the input: a run is admitted
-- only while no run of the same workflow and key is live. The key is kept as the start
-- digest is (keyed HMAC-SHA-256 under custody, so a dump cannot confirm a guessed id),
-- and a partial unique index holds the rule in the statement that admits the run: two
-- starts of one key racing each other, in one batch or in two processes, admit one.
-- A run leaves the index as it ends (``ended_at`` set), held runs being live.
ALTER TABLE runs ADD COLUMN concurrency_key text;
CREATE UNIQUE INDEX runs_one_live_per_key ON runs (workflow_id, concurrency_key)
    WHERE concurrency_key IS NOT NULL AND ended_at IS NULL;
