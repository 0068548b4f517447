-- Registry Coordinator schema, version 3: result deliveries (webhooks).

-- Every accepted webhook delivery, once per (connection, event id). A delivery is a
-- wake-up: the run reads the authoritative result from the product. Deliveries that
-- arrive before their run waits are kept and matched when it does.
CREATE TABLE deliveries (
    connection   text NOT NULL,
    event_id     text NOT NULL,
    result       text NOT NULL,
    key          text NOT NULL,
    payload      jsonb,
    received_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (connection, event_id)
);
CREATE INDEX deliveries_by_key ON deliveries (connection, result, key, received_at);
CREATE TRIGGER deliveries_append_only BEFORE UPDATE OR DELETE ON deliveries
    FOR EACH ROW EXECUTE FUNCTION refuse_change();
