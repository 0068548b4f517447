"""What the operator console reads: held work with its sendings, a run's whole record, run
counts, and admission with its history.

The console's pages are the HTTP layer's, which runs no statement of its own; every read
a page needs is here, each one named query of ``sql/queries.sql``. Reads that list runs
show a caller exactly what the API's listing would (:class:`store.RunFilter`'s ``caller``
and ``readable``: None is no limit), so the console never shows more than the API.
"""

from __future__ import annotations

import uuid

from registry_coordinator.store.database import Database, Row


def _visible(caller: str | None, readable: frozenset[str] | None) -> dict[str, object]:
    """The visibility parameters, as list_runs takes them."""
    return {"caller": caller, "readable": None if readable is None else sorted(readable)}


async def held_runs(
    db: Database, caller: str | None, readable: frozenset[str] | None, limit: int = 200
) -> list[Row]:
    """The held runs the caller may see, the longest held first: the order an operator
    works through them in. Each has its step's latest sending (``exec_attempt``,
    ``method``, ``url``, ``idempotency_key``, ``sealed_at``, ``dispatched_at``,
    ``settled_at``, ``exec_status``, ``exec_outcome``, ``response``; all None when the
    step never sealed a request), what an operator judges a hold by."""
    return await db.rows("console_held_runs", {**_visible(caller, readable), "limit": limit})


async def held_count(db: Database, caller: str | None, readable: frozenset[str] | None) -> int:
    """How many runs :func:`held_runs` would show without a limit: every page shows it."""
    row = await db.row("console_held_count", _visible(caller, readable))
    assert row is not None, "a count has a row"
    return int(row["held"])


async def run_detail(db: Database, run_id: uuid.UUID) -> Row | None:
    """What a run's page shows besides its status (:func:`store.status`): its ``input``,
    ``start_key``, ``completed`` (step -> instant) and ``outputs``."""
    return await db.row("console_run_detail", {"id": run_id})


async def executions(db: Database, run_id: uuid.UUID) -> list[Row]:
    """Every sending of the run's calls, in the order they were sealed, for its timeline:
    the history says a call was dispatched; this says what was sent and what came back,
    late answers included."""
    return await db.rows("console_executions", {"id": run_id})


async def run_counts(db: Database) -> dict[str, dict[str, int]]:
    """Digest -> state -> how many runs, ended ones too (only states a digest has runs
    in appear). It reads every run, so a page calls it once."""
    counts: dict[str, dict[str, int]] = {}
    for row in await db.rows("console_run_counts"):
        counts.setdefault(row["digest"], {})[row["state"]] = int(row["runs"])
    return counts


async def admission(db: Database) -> Row | None:
    """Whether admission is held (``held``), with the ``reason``, ``actor`` and ``at`` of
    its last change; schema version 7 gave admission its row, so a current schema has it."""
    return await db.row("console_admission")


async def admission_events(db: Database, limit: int = 20) -> list[Row]:
    """The latest holds and releases of admission (``at``, ``held``, ``reason``,
    ``actor``), newest first: who held it before, and for how long."""
    return await db.rows("console_admission_events", {"limit": limit})
