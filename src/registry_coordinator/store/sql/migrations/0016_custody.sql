-- Registry Coordinator schema, version 16: data keys, and runs whose personal data is
-- sealed under one (docs/custody.md).
--
-- A data key is 32 random bytes the service made, kept here only wrapped under a
-- key-encryption key (KEK) of the configuration: `kek` is that KEK's version, `wrapped`
-- its AES-256-GCM ciphertext bound to this installation and the key's id. The KEKs never
-- enter the database. `subject` is NULL for the installation's shared key (one); a data
-- subject's own key is named by a keyed hash of the subject, never in clear. An erased
-- key keeps its row, its id and when it was erased, and loses `kek` and `wrapped`.
CREATE TABLE data_keys (
    id         bigint PRIMARY KEY CHECK (id > 0),  -- random: it is in its values' associated data
    subject    bytea UNIQUE CHECK (octet_length(subject) = 32),
    kek        integer CHECK (kek > 0),
    wrapped    bytea,
    made_at    timestamptz NOT NULL DEFAULT now(),
    erased_at  timestamptz,
    CHECK ((kek IS NULL) = (wrapped IS NULL)),
    CHECK ((wrapped IS NULL) = (erased_at IS NOT NULL))
);
CREATE UNIQUE INDEX data_keys_shared ON data_keys ((true)) WHERE subject IS NULL;

-- The data key a run's input, step outputs and output are sealed under: each is then a
-- JSON string holding the sealed value in base64, bound to the run, its purpose and step.
-- NULL for runs admitted without custody, whose values are as they were given.
ALTER TABLE runs ADD COLUMN data_key bigint REFERENCES data_keys (id);
