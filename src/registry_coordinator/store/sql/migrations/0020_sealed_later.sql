-- Registry Coordinator schema, version 20: runs written before custody, sealed later.
--
-- ``coordinator keys seal`` seals the values of runs that ended before custody was
-- configured (their input, outputs, output and sendings) under the shared key. Their
-- history's events stay as they were written: the chain and the signed checkpoints cover
-- them as they are, and a sealed history would be another one. ``sealed_from`` is the seq
-- of such a run's first event written sealed (past its end: none); NULL for a run whose
-- every event was written as its data_key says.
ALTER TABLE runs ADD COLUMN sealed_from integer;
