-- Registry Coordinator schema, version 13: the database's timeline, so that a database
-- restored from a backup is recognised before a request it forgot is sent again.
--
-- `epoch` grows by one each time the service is about to send requests it has sealed:
-- the advance begins after their sealings committed, and is copied to the high-water
-- mark, a file outside the database, before any of them leaves. A database whose epoch
-- is behind its mark lost transitions the products may have seen (engine/high_water.py).
-- `installation` names the database across dumps and restores, so that a mark is never
-- held against another database.
CREATE TABLE timeline (
    one           boolean PRIMARY KEY DEFAULT true CHECK (one),
    installation  uuid NOT NULL DEFAULT gen_random_uuid(),
    epoch         bigint NOT NULL DEFAULT 0
);
INSERT INTO timeline DEFAULT VALUES;

-- Each time a restored database was recognised: where its timeline and the mark stood,
-- the newest transition it still had, how many runs were held for review, and who ended
-- the recovery, when and why. While one is open the service serves operators only.
CREATE TABLE restores (
    number          integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    detected_at     timestamptz NOT NULL,
    database_epoch  bigint NOT NULL,
    mark_epoch      bigint NOT NULL,
    newest_change   timestamptz,
    held            integer NOT NULL,
    ended_at        timestamptz,
    ended_by        text,
    reason          text,
    CHECK ((ended_at IS NULL) = (ended_by IS NULL))
);
