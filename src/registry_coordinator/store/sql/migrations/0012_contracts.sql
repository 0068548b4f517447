-- Registry Coordinator schema, version 12: the Registry Stack products' published contracts.
--
-- A call's connection-bound headers (such as Casework's profile) are sealed with its
-- request, as its method, URL, body and key are, so that a resend sends what was sent.
ALTER TABLE executions ADD COLUMN headers jsonb;
-- A prepared command's authority (a BReg action's registry revision and contract
-- fingerprint, read before it was sealed), which a resend is checked against first.
ALTER TABLE executions ADD COLUMN prepared jsonb;
-- How often the product has been asked what became of the current call since its
-- outcome became unknown (its receipt, or the identical request), before the run is
-- held. Every transition but the asking resets it, as it resets `defects`.
ALTER TABLE runs ADD COLUMN checks smallint NOT NULL DEFAULT 0;
-- How far each connection's result feed has been read: the cursor after the last
-- entry recorded as a delivery (NULL: from the feed's start). One row a connection.
CREATE TABLE feed_cursors (
    connection  text PRIMARY KEY,
    cursor      text,
    read_at     timestamptz NOT NULL
);
