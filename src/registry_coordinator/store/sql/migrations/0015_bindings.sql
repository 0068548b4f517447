-- Registry Coordinator schema, version 15: what a sealed request is bound to.
--
-- Each sending keeps the binding of the connection it went over (its address, the
-- identity it was sent as, the connection-bound parameters: ConnectionConfig.binding),
-- so that runs holding requests sealed under a connection edited since are seen; NULL for
-- sendings before this version, which are not judged.
ALTER TABLE executions ADD COLUMN binding jsonb;
-- An operator's retry-same that said to send the sealed request to the connection's
-- address as it is now, not the one it was sealed to: the next sending does, once.
ALTER TABLE runs ADD COLUMN rebind boolean NOT NULL DEFAULT false;
