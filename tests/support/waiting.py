"""Waiting, polled, for what a service does in its own time: a query's answer, a run's
state, a value a callable finds, a readiness answer; each fails with what it last saw."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

from registry_coordinator.semantics.codes import RunState
from registry_coordinator.store.database import sync_connection
from tests.support.processes import Service

Found = TypeVar("Found")


#: Sessions of this database whose admission of a run waits on a lock: a test holding a
#: lock open waits for it with :func:`wait_for` (``wait_for(dsn, ADMISSION_WAITING, 1)``).
#: A statement is known by its first line, the named query's description
#: (``admit_run``, ``admit_runs``): ``pg_stat_activity`` keeps only the first kilobyte of
#: its text (``track_activity_query_size``), where the INSERT itself may not be.
ADMISSION_WAITING = """
    SELECT count(*) FROM pg_stat_activity
    WHERE datname = current_database() AND wait_event_type = 'Lock'
      AND (starts_with(query, '-- A new run, due at once')
           OR starts_with(query, '-- A batch''s new runs, due at once'))
"""


def wait_for(
    dsn: str, sql: str, expected: Any, timeout: float = 30, params: tuple[Any, ...] = ()
) -> None:
    """Poll the database (from the test, not the service) until a query gives ``expected``."""
    deadline = time.monotonic() + timeout
    last = None
    with sync_connection(dsn) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(sql, params).fetchone()
            last = next(iter(row.values())) if row else None
            if last == expected:
                return
            time.sleep(0.05)
    raise AssertionError(f"{sql} gave {last}, not {expected!r}, within {timeout}s")


def wait_state(dsn: str, run: str, state: RunState | str, timeout: float = 30) -> None:
    """Until the run is in ``state``. A name no run state has is refused at once: waiting
    for it would only time out."""
    expected = RunState(state).value
    wait_for(dsn, "SELECT state FROM runs WHERE id = %s", expected, timeout, params=(run,))


def until(found: Callable[[], Found | None], what: str, timeout: float = 30) -> Found:
    """What ``found`` gives once it gives something (not None, not empty), polled."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout}s: {what}")


def wait_ready(service: Service, status: int, timeout: float = 30) -> None:
    """Until the service's /ready answers ``status``."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = service.http.get("/ready", timeout=5).status_code
        except httpx.HTTPError as exc:
            last = exc
        if last == status:
            return
        time.sleep(0.05)
    raise AssertionError(f"/ready answered {last}, not {status}, within {timeout} s")
