-- Registry Coordinator schema, version 11: a run remembers the trace it was started in.
--
-- A caller that starts a run inside its own trace (W3C traceparent) sees the run's
-- steps and calls in that trace, for as long as the run lives: weeks, across restarts
-- and processes. The header is kept as the caller sent it, once checked; a run
-- started outside any trace has none, and its spans form a trace of their own.
ALTER TABLE runs ADD COLUMN traceparent text;
