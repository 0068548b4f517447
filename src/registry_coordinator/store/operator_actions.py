"""The statements of operator actions: a run locked for an action, and what the action writes.

An action reads its run locked ``FOR UPDATE`` and writes in the same transaction, so the
engine cannot move the run between what the operator's request was judged on and what it
records; each write is fenced by the run's ``seq`` as it was locked as well. What an action
may do, and the refusals a caller sees, are decided by ``http.operations``: here are only
the statements, so that layer names no query and holds no connection of its own.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, Self

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.custody import (
    Sealer,
    sealer_for,
)
from registry_coordinator.semantics.codes import HoldCode, RunState
from registry_coordinator.store.bulk_jobs import Settled
from registry_coordinator.store.database import Connection, Database, Row
from registry_coordinator.store.keys import SharedPlace
from registry_coordinator.store.records import known
from registry_coordinator.store.statements import sealed_outputs

#: The note of a reconcile that found no receipt: the run stays held.
UNCONFIRMED = "reconcile-unconfirmed"


class Fence(Protocol):
    """An action taken for something beside the operator's request (a bulk job, an
    approval): only while the run's ``seq`` is the one it was asked at; its history event
    gets what :meth:`noted` gives, and :meth:`settle` writes in the action's transaction."""

    @property
    def seq(self) -> int: ...

    def noted(self) -> dict[str, JSON]: ...

    async def settle(self, conn: Connection, run: uuid.UUID, outcome: Settled) -> None: ...


@dataclass(frozen=True)
class OperatorRun:
    """A run as an operator action judges it (``operator_run``), read under its lock.
    ``dispatched_at`` is set while a call of it may be in flight."""

    id: uuid.UUID
    digest: str
    state: RunState
    step: str
    seq: int
    attempt: int
    dispatched_at: datetime | None
    hold_code: HoldCode | str | None  # a code this build does not know, as stored
    data_key: int | None  # its personal data's (None: not sealed): so is a reconciled output

    @classmethod
    def from_row(cls, row: Row) -> Self:
        return cls(
            id=row["id"],
            digest=row["digest"],
            state=RunState(row["state"]),
            step=row["step"],
            seq=row["seq"],
            attempt=row["attempt"],
            dispatched_at=row["dispatched_at"],
            hold_code=known(HoldCode, row["hold_code"]),
            data_key=row["data_key"],
        )


@dataclass(frozen=True)
class LockedRun:
    """A run locked against the engine, in a transaction that is open while this is used:
    each write below commits with the transaction, or not at all."""

    conn: Connection
    run: OperatorRun  # as locked
    #: What the action is taken for besides the operator's request, if anything (a bulk
    #: job, an approval): settled with the action's write.
    fence: Fence | None = None

    def _fenced(self, event: JSON, **params: JSON) -> dict[str, JSON]:
        """The action's parameters, its ``event`` as the run's history holds it (with what
        its fence notes, if it has one: the bulk job, the approver; its reason sealed, if
        the run's data is: every action's event is at the run's step)."""
        if self.fence is not None:
            assert isinstance(event, dict)
            event = {**event, **self.fence.noted()}
        if self.run.data_key is not None:
            sealer = sealer_for(self.conn.sealer, self.run.id).under(self.run.data_key)
            event = sealer.seal_detail(self.run.id, self.run.step, event)
        return {"id": self.run.id, "seq": self.run.seq, "event": event, **params}

    async def note(self, kind: str, actor: str, event: JSON, *, cancel: bool = False) -> None:
        """Record the action in the run's history and leave the run where it is; with
        ``cancel``, the run is cancelled once the call it has in flight settles."""
        await self.conn.row(
            "operator_note", self._fenced(event, cancel=cancel, kind=kind, actor=actor)
        )
        await self._settle(Settled.UNCONFIRMED if kind == UNCONFIRMED else Settled.ACTED)

    async def _settle(self, outcome: Settled = Settled.ACTED) -> None:
        """Settle the action's fence, if it has one, in the action's transaction."""
        if self.fence is not None:
            await self.fence.settle(self.conn, self.run.id, outcome)

    async def cancel(self, actor: str, detail: str, event: JSON) -> None:
        """End the run cancelled now (it has no call in flight)."""
        await self.conn.row("operator_cancel", self._fenced(event, actor=actor, detail=detail))
        await self._settle()

    async def resume(self, actor: str, event: JSON, *, rebind: bool = False) -> None:
        """retry-same: the held run is due at once to take its step again; with ``rebind``,
        its sealed request goes over its connection's binding as it is now."""
        await self.conn.row("operator_resume", self._fenced(event, actor=actor, rebind=rebind))
        await self._settle()

    async def complete(
        self, step: str, next_step: str, output: JSON, actor: str, event: JSON
    ) -> None:
        """reconcile: the held call ``step`` completes with the product's ``output``, and
        the run goes on to ``next_step``."""
        outputs = sealed_outputs(self.conn.sealer, self.run.id, self.run.data_key, {step: output})
        await self.conn.row(
            "operator_complete",
            self._fenced(event, next=next_step, step=step, outputs=outputs, actor=actor),
        )
        await self._settle()


@asynccontextmanager
async def locked(
    db: Database, run_id: uuid.UUID, fence: Fence | None = None
) -> AsyncIterator[LockedRun | None]:
    """The run locked for an action until the block ends (None: there is no such run), for
    the bulk job ``fence`` names if one takes it; an exception out of the block rolls back
    everything written in it."""
    async with db.connection() as conn, conn.transaction():
        run = await conn.row("operator_run", {"id": run_id})
        yield None if run is None else LockedRun(conn, OperatorRun.from_row(run), fence)


#: Where an admission's reason is sealed: no run's, the shared key's.
_ADMISSION = SharedPlace("admission", "admission.reason", "admission's reason")


async def set_admission(db: Database, held: bool, actor: str, reason: str) -> None:
    """Hold or release admission of new runs, with its event, the reason sealed under the
    shared key, with custody. The statement that admits a run locks the row this updates
    (:func:`store.admit`), so a hold and a start serialize and cannot pass each other."""
    stored, key = _ADMISSION.seal(db.sealer, reason)
    params = {"held": held, "reason": stored, "actor": actor}
    await db.execute("set_admission", {**params, "data_key": key})


def admission_reason(sealer: Sealer | None, row: Row) -> str:
    """The reason of an admission row (``reason``, sealed under ``reason_key`` or in clear
    when that is NULL), opened: :class:`Unopenable` where it does not."""
    return str(_ADMISSION.open(sealer, row["reason"], row["reason_key"]))


@dataclass(frozen=True)
class WorkflowHold:
    """One workflow's starts held: by whom, since when, and why."""

    workflow: str
    actor: str
    at: datetime
    reason: str


async def add_workflow_holds(db: Database, workflows: list[str]) -> None:
    """A row, not held, for each workflow whose starts may be held: made before a service
    serves, so that the statement admitting a run shares it and a hold waits for that."""
    await db.execute("add_workflow_holds", {"workflow_ids": sorted(set(workflows))})


async def set_workflow_hold(
    db: Database, workflow: str, held: bool, actor: str, reason: str
) -> None:
    """Hold or release the starts of ``workflow``, with its event, the reason sealed as
    admission's is; a start of it and the hold serialize on its row."""
    stored, key = _ADMISSION.seal(db.sealer, reason)
    params = {"workflow_id": workflow, "held": held, "reason": stored, "actor": actor}
    await db.execute("set_workflow_hold", {**params, "data_key": key})


async def held_workflow_starts(db: Database, workflows: list[str] | None) -> list[WorkflowHold]:
    """The workflows whose starts are held (of ``workflows``; None: any), each opened."""
    rows = await db.rows("held_workflows", {"workflow_ids": workflows})
    return [
        WorkflowHold(r["workflow_id"], r["actor"], r["at"], admission_reason(db.sealer, r))
        for r in rows
    ]
