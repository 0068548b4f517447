"""A run as the process holding it sees it, and what committing a transition gives back.

A :class:`Claimed` is a snapshot: the run as the last transition this holder
committed left it, with the claim's lease token that fences every write. It is
never refreshed from the database while held; each commit returns the next
snapshot (:class:`Committed`), so the holder decides from what it wrote itself.
Its clock is the database's, read at claim and carried forward by Trio's
monotonic one, so the instants a holder records do not depend on its host's clock.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import trio

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.expressions import parse_instant
from registry_coordinator.errors import CoordinatorError
from registry_coordinator.semantics.codes import RunState
from registry_coordinator.semantics.steps import RunRecord, Transition
from registry_coordinator.store.database import Row


def actor(owner: str) -> str:
    """How a process's transitions are recorded in the history: ``coordinator:<owner>``."""
    return "coordinator:" + owner


@dataclass
class Claimed:
    """A run this process holds, as it stands after the last committed transition."""

    id: uuid.UUID
    workflow_id: str
    digest: str
    input: JSON
    state: RunState
    step: str
    seq: int
    attempt: int  # sendings of the current call step; reads of the current wait-for
    checks: int  # askings of the product about the current call's unknown outcome
    timer_at: datetime | None
    outputs: dict[str, JSON]
    completed: dict[str, datetime]
    admitted_at: datetime
    deadline_at: datetime
    owner: str
    token: uuid.UUID  # this claim's lease token: every write is fenced on it
    dispatched: bool  # a call's request was sealed and may have left, with no outcome recorded
    traceparent: str | None  # the trace context its spans continue: its start request's
    clock: tuple[datetime, float] = field(repr=False)  # database time at claim, trio time then
    #: The data key its personal data is sealed under (None: not sealed); what it records
    #: is sealed under it too.
    data_key: int | None = None

    @classmethod
    def from_row(cls, row: Row) -> Claimed:
        return cls(
            id=row["id"],
            workflow_id=row["workflow_id"],
            digest=row["digest"],
            input=row["input"],
            state=RunState(row["state"]),
            step=row["step"],
            seq=row["seq"],
            attempt=row["attempt"],
            checks=row["checks"],
            timer_at=row["timer_at"],
            outputs=row["outputs"],
            completed={k: parse_instant(v) for k, v in row["completed"].items()},
            admitted_at=row["admitted_at"],
            deadline_at=row["deadline_at"],
            owner=row["lease_owner"],
            token=row["lease_token"],
            dispatched=row["dispatched_at"] is not None,
            traceparent=row["traceparent"],
            clock=(row["now"], trio.current_time()),
            data_key=row["data_key"],
        )

    @property
    def sealed(self) -> bool:
        return self.data_key is not None

    def now(self) -> datetime:
        """The database's clock, read at claim and carried forward by Trio's monotonic one."""
        at, since = self.clock
        return (at + timedelta(seconds=trio.current_time() - since)).astimezone(UTC)

    def record(self) -> RunRecord:
        return RunRecord(
            str(self.id),
            self.input,
            self.admitted_at,
            self.deadline_at,
            self.outputs,
            self.completed,
        )

    @property
    def actor(self) -> str:
        return actor(self.owner)


class LeaseLost(CoordinatorError):
    """Another worker took the run over (this one's lease ran out); nothing was written."""


@dataclass(frozen=True)
class Settlement:
    """What became of one sending of a call, recorded on its execution row."""

    outcome: str  # response, not-sent, lost, interrupted, cancelled
    status: int | None = None
    response: bytes | None = None


@dataclass(frozen=True)
class CancelledInFlight:
    """A cancellation an operator asked for while a call was in flight, taking effect as
    that call settles; ``instead`` is what the run would otherwise have done."""

    reason: str
    instead: Transition


@dataclass(frozen=True)
class Ahead:
    """What the run's next step does, decided while committing the steps before it (a
    call to send, a wait to register): the holder takes it from here, not decided twice."""

    transition: Transition | None
    at: datetime  # the instant it was decided at, which its commit records


@dataclass(frozen=True)
class Committed:
    run: Claimed  # the run as it stands now
    due_at: datetime | None  # when it next falls due, for the timer
    taken: tuple[tuple[str, Transition | CancelledInFlight], ...]  # (step, transition), in order
    outcome: str | None = None  # the outcome, when the run finished
    held: bool = False  # the holder still holds the run and should take its next step
    ahead: Ahead | None = None  # the next step, when it was decided (``go_on``)
