-- Registry Coordinator schema, version 19: the reasons admission was held or released for,
-- sealed.
--
-- An operator's reason may name a person ("held while J. Smith's complaint is looked
-- into"): like a run's reasons, it is sealed under the installation's shared key, and
-- ``data_key`` names the key (NULL: written in clear, before custody or without it).
ALTER TABLE admission ADD COLUMN data_key bigint REFERENCES data_keys (id);
ALTER TABLE admission_events ADD COLUMN data_key bigint REFERENCES data_keys (id);
