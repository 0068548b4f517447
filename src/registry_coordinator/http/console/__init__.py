"""The operator console: server-rendered pages at /console, for the people who resolve
held work (routes in :mod:`.routes`)."""
