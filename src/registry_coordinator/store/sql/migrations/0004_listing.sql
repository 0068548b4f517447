-- Registry Coordinator schema, version 4: listing runs for operators, and counting
-- the runs in flight for metrics, without scanning ended runs.

CREATE INDEX runs_by_admission ON runs (admitted_at DESC, id DESC);
CREATE INDEX runs_active ON runs (state) WHERE ended_at IS NULL;
