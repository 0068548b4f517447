"""Approvals (schema 26): a retry-same or cancel of a mutation in doubt, held for a second
operator where its connection is configured ``fourEyes``.

An approval is *pending* until a second operator decides it: *approved* (the action is
taken, and the approval decided in the transaction of the action's own write, by its
:class:`ApprovalFence`), *rejected*, or *stale* (the run changed since it was asked for:
nothing is taken). At most one is pending per run. What was said (the reason, and an
attestation or binding) and the decision's reason are sealed under the shared key.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Self

from psycopg.types.json import Jsonb

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.store.bulk_jobs import Settled
from registry_coordinator.store.database import Connection, Database, Row
from registry_coordinator.store.keys import SharedPlace

_SAID = SharedPlace("approval", "approval.said", "an approval's reason")
_DECISION = SharedPlace("approval", "approval.decision", "an approval's decision")


class ApprovalState(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    STALE = "stale"


@dataclass(frozen=True)
class Approval:
    """An action kept for a second operator: on which run (at which ``seq``), what was
    said with it, who asked and when, and how it was decided."""

    id: uuid.UUID
    run_id: uuid.UUID
    seq: int
    action: str
    said: dict[str, JSON]
    requested_by: str
    requested_at: datetime
    state: ApprovalState
    decided_by: str | None
    decided_at: datetime | None
    decision: str | None

    @classmethod
    def from_row(cls, db: Database, row: Row) -> Self:
        said = _SAID.open(db.sealer, row["said"], row["said_key"])
        assert isinstance(said, dict)
        decision = row["decision"]
        return cls(
            id=row["id"],
            run_id=row["run_id"],
            seq=row["seq"],
            action=row["action"],
            said=said,
            requested_by=row["requested_by"],
            requested_at=row["requested_at"],
            state=ApprovalState(row["state"]),
            decided_by=row["decided_by"],
            decided_at=row["decided_at"],
            decision=None
            if decision is None
            else str(_DECISION.open(db.sealer, decision, row["decision_key"])),
        )


@dataclass(frozen=True)
class ApprovalFence:
    """An approved action (an :class:`operator_actions.Fence`): taken only while the run
    is at the ``seq`` it was asked at; its history event names the approver and their
    reason; the approval is decided approved in the action's transaction."""

    approval: uuid.UUID
    seq: int
    approver: str
    reason: str

    def noted(self) -> dict[str, JSON]:
        return {"approvedBy": self.approver, "approval": self.reason}

    async def settle(self, conn: Connection, run: uuid.UUID, outcome: Settled) -> None:
        decided = await conn.row(
            "decide_approval", _decided(conn, self.approval, "approved", self.approver, self.reason)
        )
        assert decided is not None, "an approval is decided once, under its run's lock"


def _decided(
    db: Database | Connection, approval: uuid.UUID, state: str, actor: str, reason: str
) -> dict[str, object]:
    sealed, key = _DECISION.seal(db.sealer, reason)
    return {
        "id": approval,
        "state": state,
        "actor": actor,
        "decision": Jsonb(sealed),
        "decision_key": key,
    }


async def request(
    db: Database, run: uuid.UUID, seq: int, action: str, said: dict[str, JSON], actor: str
) -> Approval | None:
    """``action`` on ``run`` (at ``seq``) kept for a second operator, asked by ``actor``
    with ``said``; None if one is pending for the run already."""
    sealed, key = _SAID.seal(db.sealer, said)
    params = {
        "id": uuid.uuid4(),
        "run": run,
        "seq": seq,
        "action": action,
        "said": Jsonb(sealed),
        "said_key": key,
        "actor": actor,
    }
    row = await db.row("request_approval", params)
    return None if row is None else await get(db, row["id"])


async def get(db: Database, approval: uuid.UUID) -> Approval | None:
    row = await db.row("approval_by_id", {"id": approval})
    return None if row is None else Approval.from_row(db, row)


async def waiting_on(db: Database, run: uuid.UUID) -> Approval | None:
    """The action on ``run`` that waits for a second operator, if one does."""
    row = await db.row("pending_approval_of_run", {"run": run})
    return None if row is None else Approval.from_row(db, row)


async def pending(db: Database, limit: int = 100) -> list[Approval]:
    """The approvals still to decide, the oldest asked first."""
    return [
        Approval.from_row(db, row) for row in await db.rows("pending_approvals", {"limit": limit})
    ]


async def decide(
    db: Database, approval: uuid.UUID, state: ApprovalState, actor: str, reason: str
) -> bool:
    """Reject a pending approval, or find it stale, for ``actor`` with ``reason``; False if
    it was decided meanwhile."""
    return await db.row("decide_approval", _decided(db, approval, state, actor, reason)) is not None
