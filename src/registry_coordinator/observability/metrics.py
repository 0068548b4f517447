"""Prometheus metrics (prefix ``coordinator_``), with the maintained prometheus_client.

Counters and histograms are this process's; the gauges of runs by state, and how long
the run held longest has been held, are read from PostgreSQL at scrape time (an
index-only count of the runs in flight; the held runs' latest hold events), so every
process reports the same figures for them.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from registry_coordinator.authoring.definition import Definition
from registry_coordinator.authoring.workflow import step_type
from registry_coordinator.semantics.codes import TERMINAL

if TYPE_CHECKING:
    from registry_coordinator.store.claims import Committed

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_MAX_PENDING = 10_000


class Metrics:
    """This process's metrics. Only counts: who else hears of a commit or a run's end is
    said where they are told (``engine.after_commit``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # The process and the interpreter: resident memory, CPU seconds, open file
        # descriptors (process_*), the collector's passes (python_gc_*), the version.
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        # Runs, and what their steps committed.
        self.runs_started = self._counter("runs_started", "Runs admitted", "workflow")
        self.runs_ended = self._counter(
            "runs_ended",
            "Runs that ended, by final state and outcome",
            "workflow",
            "state",
            "outcome",
        )
        self.runs = self._gauge("runs", "Runs in flight by state (read from the database)", "state")
        self.held = self._gauge("held_runs", "Runs held for an operator")
        self.held_longest = self._gauge(
            "held_runs_oldest_seconds",
            "Seconds since the run held longest was held, 0 when none is (from the database)",
        )
        self.transitions = self._counter(
            "step_transitions", "Step transitions committed, by step type", "type"
        )
        # Products: requests, answers and the connections' pools.
        by_operation = ("connection", "operation", "result")
        self.calls = self._latency(
            "call_duration_seconds", "Product calls, from send to answer", *by_operation
        )
        self.result_fetches = self._latency(
            "result_fetch_duration_seconds",
            "Reads of wait-for results (after a webhook, or polling), from send to answer",
            *by_operation,
        )
        self.receipt_lookups = self._latency(
            "receipt_lookup_duration_seconds",
            "Receipt lookups of reconcile, from send to answer",
            *by_operation,
        )
        self.pool_size = self._gauge(
            "pool_size", "Requests a connection may have open at once (its poolSize)", "connection"
        )
        self.pool_in_use = self._gauge("pool_in_use", "Requests open per connection", "connection")
        self.pool_queued = self._gauge(
            "pool_queued", "Calls waiting for a slot per connection", "connection"
        )
        self.connection_paused = self._gauge(
            "connection_paused", "1 while an operator pauses the connection, as heard", "connection"
        )
        self.connection_slowed = self._gauge(
            "connection_slowdowns",
            "Times the product asked the connection to slow down (429/503 Retry-After)",
            "connection",
        )
        # Waking: timers, result webhooks and the database listener.
        self.timer_lateness = self._latency(
            "timer_lateness_seconds",
            "How late a wait-until, timeout or retry was taken after its instant",
        )
        self.webhook_to_resume = self._latency(
            "webhook_to_resume_seconds", "From a result webhook accepted to its run resuming"
        )
        self.deliveries = self._counter(
            "webhook_deliveries", "Result webhooks by connection and status", "connection", "status"
        )
        self.listener = self._gauge("listener_connected", "1 while the LISTEN connection is up")
        # The audit trail: checkpoints signed, runs archived.
        self.checkpoints = self._counter("checkpoints", "Checkpoints signed by this process")
        self.checkpoint_heads = self._counter(
            "checkpoint_heads", "Run heads signed into checkpoints"
        )
        self.archived = self._counter("runs_archived", "Ended runs moved to verified bundles")
        self._pending: OrderedDict[tuple[str, str, str], float] = OrderedDict()

    def _counter(self, name: str, text: str, *labels: str) -> Counter:
        return Counter(f"coordinator_{name}", text, labels, registry=self.registry)

    def _gauge(self, name: str, text: str, *labels: str) -> Gauge:
        return Gauge(f"coordinator_{name}", text, labels, registry=self.registry)

    def _latency(self, name: str, text: str, *labels: str) -> Histogram:
        return Histogram(
            f"coordinator_{name}", text, labels, buckets=_LATENCY, registry=self.registry
        )

    def committed(self, definition: Definition | None, committed: Committed) -> None:
        """Transitions committed at their steps, and the run's end if it ended (a run
        expired without its definition, which could not be loaded, counts as "unknown")."""
        for step, _ in committed.taken:
            kind = step_type(definition.step(step)) if definition else "unknown"
            self.transitions.labels(kind).inc()
        state = committed.run.state
        if state in TERMINAL:
            self.ended(committed.run.workflow_id, state, committed.outcome or "")

    def ended(self, workflow: str, state: str, outcome: str) -> None:
        """A run ended in this process."""
        self.runs_ended.labels(workflow, state, outcome).inc()

    def result_fetched(self, connection: str, operation: str, result: str, seconds: float) -> None:
        """A wait-for's result was read with the catalog's fetch ``operation``."""
        self.result_fetches.labels(connection, operation, result).observe(seconds)

    def looked_up(self, connection: str, operation: str, result: str, seconds: float) -> None:
        """reconcile asked the product for its receipt of a call of ``operation``."""
        self.receipt_lookups.labels(connection, operation, result).observe(seconds)

    def woke(self, lateness: list[float]) -> None:
        """The timer took wait-untils on, each this many seconds late (their transitions
        are counted as they commit, by :meth:`committed`)."""
        for seconds in lateness:
            self.timer_lateness.observe(seconds)

    def delivered(self, connection: str, result: str, key: str) -> None:
        """A webhook woke a run: remember when, to time the resume."""
        self._pending[(connection, result, key)] = time.monotonic()
        while len(self._pending) > _MAX_PENDING:
            self._pending.popitem(last=False)

    def resumed(self, connection: str, result: str, key: str) -> None:
        started = self._pending.pop((connection, result, key), None)
        if started is not None:
            self.webhook_to_resume.observe(time.monotonic() - started)

    def render(self) -> bytes:
        return generate_latest(self.registry)
