"""Engine: the services that move runs.

Workers that claim runs and take their steps, per-connection call pools and what a call
needs before it is sent (BReg action preparation, service identities and task grants,
destinations judged and pinned), result reads and the Casework feed, the timer service
and its batches of sleepers, and the LISTEN/NOTIFY listener. Built on `store`,
`observability` and `config`; knows nothing of HTTP requests from callers.
"""
