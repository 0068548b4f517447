"""Engine: runs in PostgreSQL and the services that move them.

The store and its named queries, migrations, the timer service, workers, the LISTEN/NOTIFY
listener, per-connection call pools, service identities, configuration, metrics and logs.
Built on `semantics` and `authoring`; knows nothing of HTTP requests from callers.
"""
