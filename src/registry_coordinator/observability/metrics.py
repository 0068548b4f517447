"""Prometheus metrics (prefix ``coordinator_``), with the maintained prometheus_client.

Counters and histograms are this process's; the gauges of runs by state, and how long
the run held longest has been held, are read from PostgreSQL at scrape time (an
index-only count of the runs in flight; the held runs' latest hold events), so every
process reports the same figures for them.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from registry_coordinator.authoring.definition import Definition
from registry_coordinator.authoring.workflow import step_type
from registry_coordinator.semantics.codes import TERMINAL

if TYPE_CHECKING:
    from registry_coordinator.store.claims import Committed

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_MAX_PENDING = 10_000


class Metrics:
    """This process's metrics. ``on_end`` is told whenever a run ends here (the service
    sets it to the checkpointer's nudge: ended runs' heads are signed soon after)."""

    def __init__(self) -> None:
        self.on_end: Callable[[], None] = lambda: None
        r = self.registry = CollectorRegistry()
        self.runs_started = Counter(
            "coordinator_runs_started", "Runs admitted", ["workflow"], registry=r
        )
        self.runs_ended = Counter(
            "coordinator_runs_ended",
            "Runs that ended, by final state and outcome",
            ["workflow", "state", "outcome"],
            registry=r,
        )
        self.runs = Gauge(
            "coordinator_runs",
            "Runs in flight by state (read from the database)",
            ["state"],
            registry=r,
        )
        self.held = Gauge("coordinator_held_runs", "Runs held for an operator", registry=r)
        self.held_longest = Gauge(
            "coordinator_held_runs_oldest_seconds",
            "Seconds since the run held longest was held, 0 when none is (from the database)",
            registry=r,
        )
        self.transitions = Counter(
            "coordinator_step_transitions",
            "Step transitions committed, by step type",
            ["type"],
            registry=r,
        )
        self.calls = Histogram(
            "coordinator_call_duration_seconds",
            "Product calls, from send to answer",
            ["connection", "operation", "result"],
            buckets=_LATENCY,
            registry=r,
        )
        self.result_fetches = Histogram(
            "coordinator_result_fetch_duration_seconds",
            "Reads of wait-for results (after a webhook, or polling), from send to answer",
            ["connection", "operation", "result"],
            buckets=_LATENCY,
            registry=r,
        )
        self.receipt_lookups = Histogram(
            "coordinator_receipt_lookup_duration_seconds",
            "Receipt lookups of reconcile, from send to answer",
            ["connection", "operation", "result"],
            buckets=_LATENCY,
            registry=r,
        )
        self.pool_size = Gauge(
            "coordinator_pool_size",
            "Requests a connection may have open at once (its poolSize)",
            ["connection"],
            registry=r,
        )
        self.pool_in_use = Gauge(
            "coordinator_pool_in_use", "Requests open per connection", ["connection"], registry=r
        )
        self.pool_queued = Gauge(
            "coordinator_pool_queued",
            "Calls waiting for a slot per connection",
            ["connection"],
            registry=r,
        )
        self.timer_lateness = Histogram(
            "coordinator_timer_lateness_seconds",
            "How late a wait-until, timeout or retry was taken after its instant",
            buckets=_LATENCY,
            registry=r,
        )
        self.webhook_to_resume = Histogram(
            "coordinator_webhook_to_resume_seconds",
            "From a result webhook accepted to its run resuming",
            buckets=_LATENCY,
            registry=r,
        )
        self.deliveries = Counter(
            "coordinator_webhook_deliveries",
            "Result webhooks by connection and status",
            ["connection", "status"],
            registry=r,
        )
        self.checkpoints = Counter(
            "coordinator_checkpoints", "Checkpoints signed by this process", registry=r
        )
        self.checkpoint_heads = Counter(
            "coordinator_checkpoint_heads", "Run heads signed into checkpoints", registry=r
        )
        self.archived = Counter(
            "coordinator_runs_archived", "Ended runs moved to verified bundles", registry=r
        )
        self.listener = Gauge(
            "coordinator_listener_connected", "1 while the LISTEN connection is up", registry=r
        )
        self._pending: OrderedDict[tuple[str, str, str], float] = OrderedDict()

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
        self.on_end()

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
