-- Registry Coordinator schema, version 7: a start's key names one request, and starts
-- and admission holds serialize.

-- A caller's Idempotency-Key stands for one start request: the digest now covers the
-- workflow, the version as the caller asked for it (null when it named none) and the
-- input. A run admitted before this version kept a digest of its input alone, so a
-- start retried across the upgrade with the same key is refused (409 run.key-reused,
-- naming the original run); it never starts a second run.
ALTER TABLE runs RENAME COLUMN input_digest TO start_digest;

-- Admission always has its row, so that every start can lock it (shared) in the
-- statement that admits the run, and a hold (which updates it) waits for the starts in
-- flight, and they for it: no start is admitted after a hold has been answered.
INSERT INTO admission (held, reason, actor, at)
VALUES (false, 'never held', 'coordinator', now())
ON CONFLICT (singleton) DO NOTHING;
