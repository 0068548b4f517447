"""Runs as the HTTP layer and the console read them: typed records of the store's reads.

Each record is the rows of one or more named queries of ``sql/queries.sql``, made once
by its ``from_row`` from the columns those queries select (the query each record is
named after, and the others its docstring names, select them all, under these names),
so a handler reads ``run.state`` where it read ``row["state"]``, and a column a query
stops selecting fails where the record is made, not in a page.

The records are frozen and hold only what the database said, converted only where a
column holds a closed list: ``state`` is a :class:`RunState` (its column's CHECK allows
no other text). A hold or failure code is its :class:`HoldCode` or :class:`FailureCode`
when this build knows it, and the text as stored when it does not (a build newer than
this one may have written it, and the API and the console show it as it is). JSON
columns stay :data:`JSON`, bytes stay bytes, instants stay the database's; nothing here
runs a statement or reads a clock.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Self, TypeVar

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.semantics.codes import FailureCode, HoldCode, RunState
from registry_coordinator.store.database import Row

Code = TypeVar("Code", bound=StrEnum)


def known(codes: type[Code], text: str | None) -> Code | str | None:
    """A code column: the member of ``codes`` it names, or its text if this build does
    not know it (None stays None)."""
    if text is None:
        return None
    try:
        return codes(text)
    except ValueError:
        return text


@dataclass(frozen=True)
class RunStatus:
    """A run as its status shows it (``run_status``; ``list_runs``, ``console_held_runs``,
    and ``admit_run``, ``admit_runs`` and ``runs_by_start_keys`` for a live run select the
    same columns): where it is, how it ended, why it is held, the answer that came back
    late for a held call (``late_*``: None when none did), and its history's head."""

    id: uuid.UUID
    workflow_id: str
    version: str
    digest: str
    caller: str
    state: RunState
    step: str
    seq: int
    attempt: int
    timer_at: datetime | None
    outcome: str | None
    output: JSON
    failure_code: FailureCode | str | None
    hold_code: HoldCode | str | None
    detail: str | None
    admitted_at: datetime
    deadline_at: datetime
    updated_at: datetime
    ended_at: datetime | None
    late_attempt: int | None
    late_status: int | None
    late_at: datetime | None
    head: str | None  # the hex hash of its latest history event

    @classmethod
    def from_row(cls, row: Row) -> Self:
        return cls(
            id=row["id"],
            workflow_id=row["workflow_id"],
            version=row["version"],
            digest=row["digest"],
            caller=row["caller"],
            state=RunState(row["state"]),
            step=row["step"],
            seq=row["seq"],
            attempt=row["attempt"],
            timer_at=row["timer_at"],
            outcome=row["outcome"],
            output=row["output"],
            failure_code=known(FailureCode, row["failure_code"]),
            hold_code=known(HoldCode, row["hold_code"]),
            detail=row["detail"],
            admitted_at=row["admitted_at"],
            deadline_at=row["deadline_at"],
            updated_at=row["updated_at"],
            ended_at=row["ended_at"],
            late_attempt=row["late_attempt"],
            late_status=row["late_status"],
            late_at=row["late_at"],
            head=row["head"],
        )


@dataclass(frozen=True)
class ArchivedRun:
    """What is left of a run retention archived, and where its history went
    (``archived_run``; ``list_archived``, and ``runs_by_start_keys`` for an archived run,
    select the same columns). Only ended runs are archived."""

    id: uuid.UUID
    workflow_id: str
    digest: str
    caller: str
    state: RunState
    outcome: str | None
    admitted_at: datetime
    ended_at: datetime
    head: str  # the hex hash of its last history event
    archived_at: datetime
    bundle: str  # the bundle's file name in the archive directory
    sha256: str  # the bundle's SHA-256, hex

    @classmethod
    def from_row(cls, row: Row) -> Self:
        return cls(
            id=row["id"],
            workflow_id=row["workflow_id"],
            digest=row["digest"],
            caller=row["caller"],
            state=RunState(row["state"]),
            outcome=row["outcome"],
            admitted_at=row["admitted_at"],
            ended_at=row["ended_at"],
            head=row["head"],
            archived_at=row["archived_at"],
            bundle=row["bundle"],
            sha256=row["sha256"],
        )


@dataclass(frozen=True)
class HistoryEvent:
    """One event of a run's history (``run_history``), with its hash in the run's chain."""

    seq: int
    at: datetime
    kind: str
    step: str
    actor: str  # ``coordinator:<owner>``, a caller, or the operator who acted
    detail: JSON
    hash: str  # hex

    @classmethod
    def from_row(cls, row: Row) -> Self:
        return cls(
            seq=row["seq"],
            at=row["at"],
            kind=row["kind"],
            step=row["step"],
            actor=row["actor"],
            detail=row["detail"],
            hash=row["hash"],
        )


@dataclass(frozen=True)
class LateAnswer:
    """A 2xx answer to a call that came back after the claim that sent it was lost
    (``late_answer``): the evidence ``reconcile`` may complete the step on."""

    attempt: int
    status: int
    response: bytes

    @classmethod
    def from_row(cls, row: Row) -> Self:
        return cls(
            attempt=row["attempt"],
            status=row["late_status"],
            response=bytes(row["late_response"]),
        )
