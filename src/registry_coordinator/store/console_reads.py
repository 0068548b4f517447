"""What the operator console reads: held work with its sendings, a run's whole record, run
counts, and admission with its history.

The console's pages are the HTTP layer's, which runs no statement of its own; every read
a page needs is here, each one named query of ``sql/queries.sql``. Reads that list runs
show a caller exactly what the API's listing would (:class:`store.RunFilter`'s ``caller``
and ``readable``: None is no limit), so the console never shows more than the API.
Each read answers with the typed records below, each made by its ``from_row``; a held
run's status is the :class:`~records.RunStatus` the API's reads give.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Self

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.custody import Sealer
from registry_coordinator.store.database import Database, Row, RowsUnopenable
from registry_coordinator.store.operator_actions import admission_reason
from registry_coordinator.store.records import RunStatus


@dataclass(frozen=True)
class Sending:
    """One sending of a call step: the request it sealed, when it left, and what came of
    it (``outcome``: response, not-sent, lost, interrupted, defect; None while in flight)."""

    attempt: int
    method: str
    url: str
    idempotency_key: str | None
    sealed_at: datetime
    dispatched_at: datetime | None
    settled_at: datetime | None
    status: int | None
    outcome: str | None
    response: bytes | None

    @classmethod
    def from_row(cls, row: Row, prefix: str = "") -> Self:
        """From an execution's columns, its ``attempt``, ``status`` and ``outcome`` named
        with ``prefix`` (a held run's row names them ``exec_``: the run has its own)."""
        return cls(
            attempt=row[prefix + "attempt"],
            method=row["method"],
            url=row["url"],
            idempotency_key=row["idempotency_key"],
            sealed_at=row["sealed_at"],
            dispatched_at=row["dispatched_at"],
            settled_at=row["settled_at"],
            status=row[prefix + "status"],
            outcome=row[prefix + "outcome"],
            response=_bytes(row["response"]),
        )


def _bytes(value: bytes | memoryview | None) -> bytes | None:
    return None if value is None else bytes(value)


@dataclass(frozen=True)
class HeldWork:
    """A held run (``console_held_runs``): its status, and its step's latest sending (None
    when the step never sealed a request)."""

    run: RunStatus
    sending: Sending | None

    @classmethod
    def from_row(cls, row: Row) -> Self:
        sent = None if row["exec_attempt"] is None else Sending.from_row(row, "exec_")
        return cls(RunStatus.from_row(row), sent)


@dataclass(frozen=True)
class Execution:
    """One sending of one of a run's calls (``console_executions``): its ``step``, the
    sending, its sealed ``body``, and an answer that came back after its claim was lost
    (``late_status``, ``late_at``; None when none did)."""

    step: str
    sending: Sending
    body: bytes | None
    late_status: int | None
    late_at: datetime | None

    @classmethod
    def from_row(cls, row: Row) -> Self:
        return cls(
            step=row["step"],
            sending=Sending.from_row(row),
            body=_bytes(row["body"]),
            late_status=row["late_status"],
            late_at=row["late_at"],
        )


@dataclass(frozen=True)
class RunDetail:
    """What a run's page shows besides its status (``console_run_detail``)."""

    input: JSON
    start_key: str
    completed: dict[str, str]  # step -> the RFC 3339 instant it completed
    outputs: dict[str, JSON]  # step -> its output

    @classmethod
    def from_row(cls, row: Row) -> Self:
        return cls(
            input=row["input"],
            start_key=row["start_key"],
            completed=row["completed"],
            outputs=row["outputs"],
        )


@dataclass(frozen=True)
class Admission:
    """Whether admission is held, and who changed it last, why and when
    (``console_admission``); or one such change (``console_admission_events``)."""

    held: bool
    reason: str
    actor: str
    at: datetime
    workflow: str | None = None  # the one workflow whose starts it held (None: every start)

    @classmethod
    def from_row(cls, row: Row, sealer: Sealer | None) -> Self:
        reason = admission_reason(sealer, row)
        workflow = row.get("workflow_id")
        return cls(row["held"], reason, row["actor"], row["at"], workflow)


def _visible(caller: str | None, readable: frozenset[str] | None) -> dict[str, object]:
    """The visibility parameters, as list_runs takes them."""
    return {"caller": caller, "readable": None if readable is None else sorted(readable)}


#: Before the first held run: where the first page of them starts.
FIRST_HELD = (datetime.min.replace(tzinfo=UTC), uuid.UUID(int=0))


async def held_runs(
    db: Database,
    caller: str | None,
    readable: frozenset[str] | None,
    limit: int = 200,
    after: tuple[datetime, uuid.UUID] = FIRST_HELD,
) -> list[HeldWork]:
    """A page of the held runs the caller may see, the longest held first (the order an
    operator works through them in), after the run last changed at ``after``. Each has
    its step's latest sending (None when the step never sealed a request), what an
    operator judges a hold by. A run whose sealed data does
    not open (held ``data-unopenable``, say) is still listed, without its sending: one such
    run does not hide the others."""
    try:
        params = {"limit": limit, "after_at": after[0], "after_id": after[1]}
        rows = await db.rows("console_held_runs", {**_visible(caller, readable), **params})
    except RowsUnopenable as exc:
        shown = [HeldWork.from_row(row) for row in exc.opened]
        shown += [
            HeldWork(RunStatus.from_row({**row, "output": None}), None) for row, _ in exc.refused
        ]
        return sorted(shown, key=lambda work: (work.run.updated_at, work.run.id))
    return [HeldWork.from_row(row) for row in rows]


@dataclass(frozen=True)
class HeldGroup:
    """Held runs of one workflow, step and hold code: how many, and the oldest and newest
    (by their last change)."""

    workflow: str
    step: str
    hold_code: str | None
    runs: int
    oldest: datetime
    newest: datetime


async def held_groups(
    db: Database, caller: str | None, readable: frozenset[str] | None
) -> list[HeldGroup]:
    """The held runs the caller may see, by workflow, step and hold code, the largest
    group first: where an outage shows."""
    rows = await db.rows("console_held_groups", _visible(caller, readable))
    return [
        HeldGroup(r["workflow_id"], r["step"], r["hold_code"], r["runs"], r["oldest"], r["newest"])
        for r in rows
    ]


async def live_counts(
    db: Database, caller: str | None, readable: frozenset[str] | None
) -> dict[str, int]:
    """How many runs the caller may see are in each state that has not ended, by state
    (the ended ones are not counted: that would read every run ever kept)."""
    rows = await db.rows("console_live_counts", _visible(caller, readable))
    return {row["state"]: int(row["runs"]) for row in rows}


async def held_count(db: Database, caller: str | None, readable: frozenset[str] | None) -> int:
    """How many runs :func:`held_runs` would show without a limit: every page shows it."""
    row = await db.row("console_held_count", _visible(caller, readable))
    assert row is not None, "a count has a row"
    return int(row["held"])


async def run_detail(db: Database, run_id: uuid.UUID) -> RunDetail | None:
    """What a run's page shows besides its status (:func:`store.status`): its ``input``,
    ``start_key``, ``completed`` (step -> instant) and ``outputs``."""
    row = await db.row("console_run_detail", {"id": run_id})
    return None if row is None else RunDetail.from_row(row)


async def executions(db: Database, run_id: uuid.UUID) -> list[Execution]:
    """Every sending of the run's calls, in the order they were sealed, for its timeline:
    the history says a call was dispatched; this says what was sent and what came back,
    late answers included."""
    return [Execution.from_row(row) for row in await db.rows("console_executions", {"id": run_id})]


async def run_counts(db: Database) -> dict[str, dict[str, int]]:
    """Digest -> state -> how many runs, ended ones too (only states a digest has runs
    in appear). It reads every run, so a page calls it once."""
    counts: dict[str, dict[str, int]] = {}
    for row in await db.rows("console_run_counts"):
        counts.setdefault(row["digest"], {})[row["state"]] = int(row["runs"])
    return counts


async def admission(db: Database) -> Admission | None:
    """Whether admission is held, with the reason, actor and instant of its last change;
    schema version 7 gave admission its row, so a current schema has it."""
    row = await db.row("console_admission")
    return None if row is None else Admission.from_row(row, db.sealer)


async def admission_events(db: Database, limit: int = 20) -> list[Admission]:
    """The latest holds and releases of admission, newest first: who held it before, and
    for how long."""
    rows = await db.rows("console_admission_events", {"limit": limit})
    return [Admission.from_row(row, db.sealer) for row in rows]
