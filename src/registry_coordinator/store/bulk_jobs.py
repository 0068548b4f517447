"""Bulk jobs (schema 25): one operator action taken on every run a filter found.

A job is *previewed* first: the runs its filter finds are kept, each with the ``seq`` it
had then, and nothing is done. Started, it is *running*: one process at a time holds its
lease and takes its runs in order; paused, no run is taken until it is resumed;
cancelled, none again. It is *done* once every run is settled.

A run is settled once: ``acted`` (the action's write and the settling commit in one
transaction, :class:`JobFence`), ``unconfirmed`` (a reconcile found no receipt, recorded
in the run's history), ``changed`` (its seq moved since the preview: left alone), or
``refused`` (the action refused it, with the problem's code). So a kill anywhere neither
repeats an action nor skips a run: a run is either settled, or untouched and taken again.
Reasons and the filter are sealed under the shared key, as a pause's reason is.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Self

from psycopg.types.json import Jsonb

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.store.database import Connection, Database, Row
from registry_coordinator.store.faults import crash_point
from registry_coordinator.store.keys import SharedPlace

#: What tells every process that a job was started, paused, resumed or cancelled.
NOTICE = "bulk"
_REASON = SharedPlace("bulk-job", "bulk.reason", "a bulk job's reason")
_FILTER = SharedPlace("bulk-job", "bulk.filter", "a bulk job's filter")


class BulkState(StrEnum):
    PREVIEWED = "previewed"
    RUNNING = "running"
    PAUSED = "paused"
    CANCELLED = "cancelled"
    DONE = "done"


class Settled(StrEnum):
    """How a job's run was settled."""

    ACTED = "acted"
    UNCONFIRMED = "unconfirmed"
    CHANGED = "changed"
    REFUSED = "refused"


#: The states each change may leave, by the state it goes to, and the event it records.
CHANGES: dict[str, tuple[BulkState, tuple[BulkState, ...]]] = {
    "start": (BulkState.RUNNING, (BulkState.PREVIEWED,)),
    "pause": (BulkState.PAUSED, (BulkState.RUNNING,)),
    "resume": (BulkState.RUNNING, (BulkState.PAUSED,)),
    "cancel": (BulkState.CANCELLED, (BulkState.PREVIEWED, BulkState.RUNNING, BulkState.PAUSED)),
}


@dataclass(frozen=True)
class JobFence:
    """A run as a job previewed it (an :class:`operator_actions.Fence`): the action is
    taken only while the run's ``seq`` is ``seq``, names the job in the run's history, and
    settles the job's run in the action's own transaction."""

    job: uuid.UUID
    seq: int

    def noted(self) -> dict[str, JSON]:
        return {"bulkJob": str(self.job)}

    async def settle(self, conn: Connection, run: uuid.UUID, outcome: Settled) -> None:
        settled = await conn.row(
            "settle_bulk_run", {"job": self.job, "run": run, "outcome": outcome, "code": None}
        )
        assert settled is not None, "a run is settled once, under its lock and seq"
        crash_point("bulk-settled")  # the action written, not committed: neither is


@dataclass(frozen=True)
class BulkJob:
    """A job as ``bulk_jobs`` reads it: what it does, to how many runs, and how far it is."""

    id: uuid.UUID
    action: str
    filter: JSON
    state: BulkState
    per_second: int
    created_at: datetime
    created_by: str
    started_by: str | None
    reason: str | None
    updated_at: datetime
    total: int
    pending: int
    acted: int
    unconfirmed: int
    changed: int
    refused: int

    @classmethod
    def from_row(cls, db: Database, row: Row) -> Self:
        reason = row["reason"]
        return cls(
            id=row["id"],
            action=row["action"],
            filter=_FILTER.open(db.sealer, row["filter"], row["filter_key"]),
            state=BulkState(row["state"]),
            per_second=row["per_second"],
            created_at=row["created_at"],
            created_by=row["created_by"],
            started_by=row["started_by"],
            reason=None
            if reason is None
            else str(_REASON.open(db.sealer, reason, row["reason_key"])),
            updated_at=row["updated_at"],
            total=row["total"],
            pending=row["pending"],
            acted=row["acted"],
            unconfirmed=row["unconfirmed"],
            changed=row["changed"],
            refused=row["refused"],
        )


@dataclass(frozen=True)
class JobRun:
    """One of a job's runs once settled: how, with the refusal's code."""

    run_id: uuid.UUID
    seq: int
    outcome: Settled
    code: str | None
    settled_at: datetime


@dataclass(frozen=True)
class JobEvent:
    """A change of a job: what, when, by whom and why (None: the service's own)."""

    kind: str
    at: datetime
    actor: str
    reason: str | None


async def preview(
    db: Database,
    action: str,
    filter: JSON,
    per_second: int,
    actor: str,
    runs: Sequence[tuple[uuid.UUID, int]],
) -> uuid.UUID:
    """A job previewed for ``actor``: ``action`` on ``runs`` (each with its seq now), in
    their order, at ``per_second``; nothing is done until it is started."""
    job = uuid.uuid4()
    kept, key = _FILTER.seal(db.sealer, filter)
    params = {
        "id": job,
        "action": action,
        "filter": Jsonb(kept),
        "per_second": per_second,
        "actor": actor,
        "data_key": key,
    }
    async with db.connection() as conn, conn.transaction():
        await conn.row("create_bulk_job", params)
        await conn.execute(
            "add_bulk_job_runs",
            {
                "job": job,
                "positions": list(range(len(runs))),
                "runs": [run for run, _ in runs],
                "seqs": [seq for _, seq in runs],
            },
        )
    return job


async def job(db: Database, job_id: uuid.UUID) -> BulkJob | None:
    row = await db.row("bulk_jobs", {"id": job_id, "limit": 1})
    return None if row is None else BulkJob.from_row(db, row)


async def latest(db: Database, limit: int) -> list[BulkJob]:
    """The latest ``limit`` jobs, newest first, in one read."""
    rows = await db.rows("bulk_jobs", {"id": None, "limit": limit})
    return [BulkJob.from_row(db, row) for row in rows]


async def settled(db: Database, job_id: uuid.UUID, limit: int, *, every: bool) -> list[JobRun]:
    """A job's settled runs in its order: every one, or those not acted on."""
    rows = await db.rows("bulk_job_settled", {"job": job_id, "all": every, "limit": limit})
    return [
        JobRun(r["run_id"], r["seq"], Settled(r["outcome"]), r["code"], r["settled_at"])
        for r in rows
    ]


async def events(db: Database, job_id: uuid.UUID) -> list[JobEvent]:
    rows = await db.rows("bulk_job_events", {"job": job_id})
    return [
        JobEvent(
            r["kind"],
            r["at"],
            r["actor"],
            None
            if r["reason"] is None
            else str(_REASON.open(db.sealer, r["reason"], r["reason_key"])),
        )
        for r in rows
    ]


async def change(db: Database, job_id: uuid.UUID, name: str, actor: str, reason: str) -> bool:
    """Start, pause, resume or cancel a job (``name``, a key of :data:`CHANGES`) for
    ``actor``, with ``reason``; False, changing nothing, if its state does not allow it."""
    state, allowed = CHANGES[name]
    sealed, key = _REASON.seal(db.sealer, reason)
    params = {
        "id": job_id,
        "state": state,
        "from": list(allowed),
        "kind": {"start": "started", "pause": "paused", "resume": "resumed"}.get(name, "cancelled"),
        "actor": actor,
        "reason": Jsonb(sealed),
        "data_key": key,
    }
    return await db.row("change_bulk_job", params) is not None


async def claim(db: Database, owner: str, lease: timedelta) -> uuid.UUID | None:
    """A running job no process holds, leased to ``owner`` (None: there is none)."""
    row = await db.row("claim_bulk_job", {"owner": owner, "lease": lease})
    return None if row is None else row["id"]


async def renew(db: Database, job_id: uuid.UUID, owner: str, lease: timedelta) -> bool:
    """Whether ``owner`` still holds the running job, its lease renewed."""
    params = {"id": job_id, "owner": owner, "lease": lease}
    return await db.row("renew_bulk_job", params) is not None


async def next_runs(
    db: Database, job_id: uuid.UUID, limit: int
) -> list[tuple[uuid.UUID, JobFence]]:
    """The next ``limit`` runs the job has not settled, in its order, each with its fence."""
    rows = await db.rows("pending_bulk_runs", {"job": job_id, "limit": limit})
    return [(r["run_id"], JobFence(job_id, r["seq"])) for r in rows]


async def settle(
    db: Database, job_id: uuid.UUID, run: uuid.UUID, outcome: Settled, code: str | None
) -> None:
    """Settle a run the action did not write to (changed, refused), unless it is settled."""
    params = {"job": job_id, "run": run, "outcome": outcome, "code": code}
    await db.row("settle_bulk_run", params)


async def finish(db: Database, job_id: uuid.UUID, actor: str) -> bool:
    """Whether the running job is done now (every run settled), recorded so if it is."""
    return await db.row("finish_bulk_job", {"id": job_id, "actor": actor}) is not None
