"""Observability: how the service explains itself while it runs.

Metrics for Prometheus, structured logs, OpenTelemetry spans, systemd's readiness and
watchdog, and the health the probes report. Built on the store (claims and health
reads); nothing here decides anything about a run, and nothing here carries a payload
value: labels, log fields and span attributes are ids, codes, states and counts.
"""
